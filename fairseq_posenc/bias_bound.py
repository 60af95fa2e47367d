"""How far Adam lets a learned logit bias travel in a run, and how far it went.

Adam moves each parameter by about lr per update whatever its gradient (it divides the gradient
by its own running magnitude), so after a run a bias stored as one parameter per entry (T5's
per-bucket and DIET-REL's per-offset scalars, DIET's segment scalars) is within about
S * sum(lr) of its initial value, S being ``--position-bias-scale`` (bias = S * w). "About":
the step lr * m_hat / (sqrt(v_hat) + eps) is at most lr while gradients keep their size or
shrink, and at most (1 - b1) / sqrt((1 - b2) (1 - b1^2 / b2)) * lr, 1.70 lr for betas
(0.9, 0.98), when they grow as fast as that allows (Cauchy-Schwarz on m and v). DIET-ABS's
P_Q P_K^T is a product of two such tables, not a table of parameters: no entry of it is bounded
this way, and its magnitude is reported without a bound.

:func:`inverse_sqrt_lr_sum` is the sum for fairseq's ``inverse_sqrt`` schedule, and
:func:`largest_biases` reads the trained magnitudes from a checkpoint's ``model``;
:func:`checkpoint_bias_report` puts the two side by side for one checkpoint.
"""
import math
from typing import Dict, Optional

from .positions import POSITION_ENCODINGS
from .positions.bias_scale import bias_scale, uses_bias_scale
from .positions.segments import SegmentBias


def inverse_sqrt_lr_sum(peak_lr: float, warmup_updates: int, num_updates: int,
                        warmup_init_lr: float = -1.0) -> float:
    """Sum of the learning rates of updates 1..``num_updates`` under fairseq's ``inverse_sqrt``.

    fairseq's trainer sets the lr of update n + 1 with ``step_update(n)`` (``step_update(0)``
    when training begins): ``warmup_init_lr + n * (peak - warmup_init_lr) / warmup`` for
    n < warmup, then ``peak * sqrt(warmup / n)``. ``warmup_init_lr`` < 0 is fairseq's default,
    0 (with warmup). So the first update has lr ``warmup_init_lr``, 0 by default.
    """
    if warmup_updates < 1:
        raise ValueError(f"--warmup-updates must be at least 1 for inverse_sqrt, got {warmup_updates}")
    if num_updates < 0:
        raise ValueError(f"num_updates must be non-negative, got {num_updates}")
    init = 0.0 if warmup_init_lr < 0 else warmup_init_lr
    step = (peak_lr - init) / warmup_updates
    warm = min(num_updates, warmup_updates)
    # n = 0 .. warm - 1: an arithmetic series
    total = warm * init + step * warm * (warm - 1) / 2
    decay = peak_lr * math.sqrt(warmup_updates)
    return total + decay * math.fsum(n ** -0.5 for n in range(warmup_updates, num_updates))


def _sub_state(state: Dict, prefix: str) -> Dict:
    return {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}


def largest_biases(state: Dict, model_args) -> Dict[str, float]:
    """The largest |bias| each learned logit bias of a model adds, from its state dict and the
    args it was built with: "encoder" and "decoder" for an encoding that takes
    ``--position-bias-scale`` (t5, diet_rel: S * w; diet_abs: |P_Q P_K^T|), "segments" for
    ``--segment-attention``. Empty for a model with none of them."""
    scale = bias_scale(model_args)
    scheme = POSITION_ENCODINGS[getattr(model_args, "position_encoding", "sinusoidal")]
    found = {}
    if uses_bias_scale(scheme):
        for stack in ("encoder", "decoder"):
            found[stack] = scheme.largest_bias(_sub_state(state, f"{stack}.position_encoding."), scale)
    segments = _sub_state(state, "encoder.segment_bias.")
    if segments:
        found["segments"] = SegmentBias.largest_bias(segments, scale)
    return found


def _load(path: str) -> Dict:
    from fairseq import checkpoint_utils

    return checkpoint_utils.load_checkpoint_to_cpu(path)


def initial_state(checkpoint: Dict) -> Dict:
    """The model's parameters before its first update, rebuilt as fairseq-train builds them:
    seeded with ``--seed``, then the task, then the model (needs the task's data directory)."""
    from fairseq import tasks, utils

    cfg = checkpoint["cfg"]
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    return task.build_model(cfg.model).state_dict()


def checkpoint_bias_report(path: str) -> Optional[Dict]:
    """For a checkpoint of an inverse_sqrt run: S, sum(lr) over the updates it has seen, and per
    bias the largest trained and initial magnitude and their bound, initial + S * sum(lr) (None
    for diet_abs's product). None for a model without such a bias."""
    checkpoint = _load(path)
    cfg = checkpoint["cfg"]
    trained = largest_biases(checkpoint["model"], cfg.model)
    if not trained:
        return None
    initial = largest_biases(initial_state(checkpoint), cfg.model)
    scale = bias_scale(cfg.model)
    updates = checkpoint["optimizer_history"][-1]["num_updates"]
    schedule = cfg.lr_scheduler
    lr_sum = None
    if schedule._name == "inverse_sqrt":
        lr_sum = inverse_sqrt_lr_sum(cfg.optimization.lr[0], schedule.warmup_updates, updates,
                                     schedule.warmup_init_lr)
    product = getattr(POSITION_ENCODINGS[cfg.model.position_encoding], "bias_is_product", False)
    bound = {name: None if lr_sum is None or (product and name != "segments") else initial[name] + scale * lr_sum
             for name in trained}
    return {"position_bias_scale": scale, "updates": updates, "lr_sum": lr_sum,
            "trained": trained, "initial": initial, "bound": bound}
