"""``--position-bias-scale``: how fast the learned logit biases learn, as a reparametrisation.

Under Adam a parameter moves by at most about lr per update, so a learned scalar added to the
attention logits (T5's per-bucket bias, DIET-REL's per-offset bias, DIET's segment scalars) can
end a run at most about sum(lr) from its initial value: ~1.25 logits for the demo (800 updates,
peak 3e-3, warmup 100), ~24 for the WMT base recipe (:mod:`fairseq_posenc.bias_bound`). With
S = ``--position-bias-scale`` a scheme stores w and uses bias = S * w, w initialised at init / S:
the model at step 0 is the same, and each Adam step moves the bias S times as far. DIET-ABS's
P_Q and P_K are scaled each, which makes the first-order step of P_Q P_K^T S times larger
(:class:`.diet_abs.DietAbs` says why).

Why a reparametrisation and not a per-parameter learning rate: fairseq's
``FairseqOptimizer.set_lr`` writes one lr into every parameter group at each update, and
``--fp16`` flattens all parameters into one tensor; scaling a gradient does nothing under Adam,
which divides it by its own running magnitude. The parameters keep their names (a checkpoint
loads either way) and S is a model flag saved with the checkpoint's args.
"""
import math
from dataclasses import dataclass, field

FLAG = "--position-bias-scale"


@dataclass
class BiasScaleConfig:
    position_bias_scale: float = field(
        default=1.0,
        metadata={
            "help": "S > 0: learn the learned attention-logit biases S times faster under Adam, as "
            "bias = S * w with w initialised at init / S (the model at step 0 is unchanged). t5: its "
            "per-bucket biases; diet_rel: its per-offset biases; diet_abs: P_Q and P_K each, so the "
            "first-order step of P_Q P_K^T is S times larger; --segment-attention: its segment "
            "scalars, with any encoding. Other encodings ignore it. Default 1: the papers' parametrisation"
        },
    )


def bias_scale(cfg) -> float:
    """``cfg``'s ``--position-bias-scale`` (1.0 where it has none, as in older checkpoints)."""
    scale = getattr(cfg, "position_bias_scale", None)
    scale = 1.0 if scale is None else float(scale)
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"{FLAG} must be a positive finite number, got {scale}")
    return scale


def uses_bias_scale(scheme: type) -> bool:
    """Whether a registered position encoding takes ``--position-bias-scale``."""
    return scheme.config is not None and issubclass(scheme.config, BiasScaleConfig)
