"""FLOATER's flow model updated every N optimizer updates (``--floater-solve-every N``, Liu et al.
2020, Sec. 4.4: cache the position biases for some iterations, update h less often, with a larger
learning rate).

The flow model is h and the per-block initial states: the initial states are the solve's initial
condition, so they can only move when the solution is recomputed. Within a cycle of N updates
(fairseq's updates n with n // N equal) the training passes read the kept solution of the current
parameters (solved without gradients at the first forward after the flow model changed, the same
table validation and decoding read, :mod:`.kept`) as a leaf tensor, and the gradient that reaches
it is accumulated, each update's in the units of the update's other gradients once the trainer has
finished with them: times 1 / sample size, and under loss scaling divided by that update's loss
scale. An update that the trainer skips (a loss-scale overflow) adds nothing. At the last update of
a cycle ((n + 1) % N == 0, or the run's last update, ``--max-update``, when N does not divide it)
the mean of the cycle's gradients is backpropagated through one solve from the current parameters
(the solution the cycle read, to float32 rounding), after fairseq's scaling and before its clipping
and optimizer step: h and the initial states get the mean of the cycle's gradients, once, as part
of that update's gradient (its clip norm included: averaged, it is the size of one update's
gradient, as at N = 1). In the other updates their gradient is None, so that fairseq's Adam skips
them (a zero gradient would still move them through Adam's momentum, and the kept solution would
no longer be theirs); fairseq's FP16Optimizer and ``legacy_ddp``, which fill a missing gradient with
zeros, get None back.

Half precision (:func:`_units`): the solve and its backward run in float32 on float32 copies of the
flow model's weights, and the result is handed to the optimizer in the units it expects at that
point (FP16Optimizer: its fp32 master gradients; --memory-efficient-fp16/bf16: the half-precision
gradients; --amp: the fp32 gradients, still multiplied by the loss scale).

Several workers: each rank accumulates the gradient of its own passes; at the flow update the
cycle's gradient is all-reduced once (a sum over the ranks, divided by their number, as DDP
averages the other gradients), so every rank backpropagates the same gradient and holds the same h.
torch's DDP (``--ddp-backend pytorch_ddp``) is told to ignore the flow model's parameters, which
the passes never use (:func:`configure_trainer`): no ``--find-unused-parameters`` is needed.

The gradient accumulated in an unfinished cycle is saved in the checkpoint (``pending_gradient``,
zero-padded to the stored solution's length, zeros at a cycle's end) with the number of updates it
sums (``pending_updates``): a run resumed mid-cycle finishes the cycle as if it had not stopped.
The count is not n % N: after a cycle cut short by an earlier --max-update the next cycle holds
fewer updates than its position says.

``--floater-lr-scale C`` (default: N): h's weights and the initial states are stored as V = W / C
and used as W = C V, so that Adam, whose step does not depend on the gradient's scale, moves W C
times as far per step (:func:`lr_scale`, :class:`StoredScale`).
"""
import logging
import math
from typing import List, Optional

import torch
from torch import Tensor

from ...compat import PosencError
from ..base import at_least_float32
from .dynamics import DYNAMICS

logger = logging.getLogger(__name__)

PENDING = "pending_gradient"
PENDING_UPDATES = "pending_updates"
#: the flow model's parameters, named in the ODE module; the dynamics' in Float32Field's order
FLOW = ("initial",) + tuple("dynamics." + name for name in DYNAMICS)
#: ``--ddp-backend`` values whose gradient exchange this module handles
DDP_BACKENDS = ("pytorch_ddp", "c10d", "legacy_ddp", "no_c10d")


#: the default C stops growing with N here: one Adam step moves each weight of h by about C lr,
#: and one step of N lr is not N steps of lr (docs/floater_results.md has the runs)
MAX_DEFAULT_LR_SCALE = 10.0


def lr_scale(solve_every: int, scale: Optional[float], warm_start: bool = False) -> float:
    """``--floater-lr-scale``: unless the user gave one, C = min(N, 10) for a FLOATER trained from
    scratch and C = 1 for one warm-started from a vanilla model (``--floater-init-from``, the
    paper's protocol and the recipes').

    From scratch, why N: under Adam every step moves a weight by about lr, so in N updates the
    exact model (N = 1) can move h by up to N lr; with the flow model updated once per N updates,
    C = N gives it the same reach. Why at most 10: a single step of N lr is not N steps of lr (no
    feedback between them), and a large one blows the flow up.

    Warm-started, why 1: h starts at 0 on a trained model, and its gradients are small and change
    sign, so N = 1 moves it far less than N lr, and a step of C lr overshoots. The measurements
    behind both are in docs/floater_results.md."""
    if scale is not None:
        return float(scale)
    return 1.0 if warm_start else min(float(solve_every), MAX_DEFAULT_LR_SCALE)


def resume_cycle(ode, saved_every: int, saved_at: int, saved_count: int, num_updates: int):
    """The first training pass after a checkpoint stopped in the middle of a cycle of N =
    ``saved_every`` at update ``saved_at``, ``saved_count`` updates of it pending, was loaded, at
    fairseq's update count ``num_updates``.
    Where the count restarted (``--reset-optimizer``, ``--finetune-from-model``) the pending gradient
    belongs to no cycle of this run: dropped, the run starts an empty cycle. Where it goes on, the
    cycle is finished under its own N: another --floater-solve-every is refused, naming both (its
    mean would divide the pending updates' gradient by the new N)."""
    every = ode.schedule.every if ode.schedule is not None else 1
    if num_updates != saved_at:
        if ode.schedule is not None:
            ode.schedule.load(None, 0, ode.initial.device)
        logger.info(f"--floater-solve-every: the update count restarts at {num_updates} (the checkpoint's was "
                    f"{saved_at}): the gradient pending in its cycle is dropped, training starts an empty cycle")
        return
    if every != saved_every:
        end = -(-saved_at // saved_every) * saved_every
        raise PosencError(f"--floater-solve-every {every}: the checkpoint stopped at update {saved_at}, "
                          f"{saved_count} update(s) into a cycle of --floater-solve-every {saved_every} "
                          f"whose gradient is pending; resume with --floater-solve-every {saved_every} (change it from "
                          f"update {end}, the cycle's end, on), or restart the update count (--reset-optimizer)")


def flow_parameters(ode) -> List[torch.nn.Parameter]:
    return [ode.get_parameter(name) for name in FLOW]


def configure_trainer(ode, trainer):
    """Before the first update (fairseq's ``Trainer.__init__``, :mod:`fairseq_posenc.update_hooks`):
    refuse what the schedule cannot run under, and set fairseq up for it."""
    cfg = trainer.cfg
    common, dist = cfg.common, cfg.distributed_training
    world = trainer.data_parallel_world_size
    refused = []
    if getattr(common, "tpu", False):
        refused.append("--tpu")
    if cfg.optimization.use_bmuf:
        refused.append("--use-bmuf")
    if getattr(dist, "zero_sharding", "none") != "none":
        refused.append(f"--zero-sharding {dist.zero_sharding}")
    if getattr(dist, "pipeline_model_parallel", False) or getattr(common, "model_parallel_size", 1) > 1:
        refused.append("model parallelism")
    if dist.ddp_backend == "fully_sharded" or (world > 1 and dist.ddp_backend not in DDP_BACKENDS):
        refused.append(f"--ddp-backend {dist.ddp_backend}")
    if refused:
        raise PosencError(f"--floater-solve-every {ode.schedule.every} does not support {', '.join(refused)}: "
                          f"it runs in one process or under --ddp-backend {' or '.join(DDP_BACKENDS[::2])}, "
                          "in float32, --fp16, --memory-efficient-fp16, --bf16, --memory-efficient-bf16 or --amp")
    if common.fp16 and not common.memory_efficient_fp16 and not common.fp16_no_flatten_grads:
        # one flat fp32 master tensor gets one gradient: h's part would be zeros in every update,
        # and Adam would move it through its momentum
        common.fp16_no_flatten_grads = True
        logger.info(f"--floater-solve-every {ode.schedule.every}: --fp16-no-flatten-grads set, so that the flow "
                    "model's fp32 master weights have gradients of their own (None between flow updates)")
    if world > 1 and dist.ddp_backend in ("pytorch_ddp", "c10d"):
        model = trainer._model
        names = [name for name, p in model.named_parameters() if any(p is q for q in flow_parameters(ode))]
        ignored = list(getattr(model, "_ddp_params_and_buffers_to_ignore", []))
        model._ddp_params_and_buffers_to_ignore = ignored + [n for n in names if n not in ignored]
        logger.info(f"--floater-solve-every {ode.schedule.every}: DDP ignores the flow model's parameters (unused "
                    "by the training passes); their gradient is all-reduced once per flow update")


def _units(optimizer, scale):
    """(factor from a pass's raw gradient to the update's final one, factor the optimizer will still
    apply to a gradient handed to it now): fairseq's trainer has just called
    ``optimizer.multiply_grads(scale)``."""
    from fairseq.optim.amp_optimizer import AMPOptimizer
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin, _MemoryEfficientFP16OptimizerMixin

    if isinstance(optimizer, (_FP16OptimizerMixin, _MemoryEfficientFP16OptimizerMixin)):
        # deferred: 1 / loss scale (fp16) times every factor given since zero_grad
        factor = float(optimizer._multiply_factor)
        return factor, factor
    if isinstance(optimizer, AMPOptimizer):  # multiplied now; the loss scale is divided out at clipping
        loss_scale = float(optimizer.scaler.get_scale())
        return float(scale) / loss_scale, 1.0 / loss_scale
    return float(scale), 1.0


def _hand_to_optimizer(optimizer, params, grads: Optional[List[Tensor]], remaining: float):
    """Set the flow model's gradients (final values, float32; None: no gradient this update) in the
    form ``optimizer`` steps with."""
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

    values = [None] * len(params) if grads is None else [g / remaining for g in grads]
    if isinstance(optimizer, _FP16OptimizerMixin):
        if optimizer.has_flat_params:
            raise PosencError("--floater-solve-every > 1 under --fp16 needs --fp16-no-flatten-grads")
        optimizer._sync_fp16_grads_to_fp32()  # fills a missing gradient with zeros: overwritten below
        masters = {id(p): m for p, m in zip(optimizer.fp16_params, optimizer.fp32_params)}
        for p, value in zip(params, values):
            p.grad = None
            masters[id(p)].grad = None if value is None else value.to(masters[id(p)].dtype)
        return
    for p, value in zip(params, values):
        p.grad = None if value is None else value.to(p.dtype)


def _add(total: Optional[Tensor], grad: Tensor) -> Tensor:
    """``total + grad`` along the first dimension, the shorter zero-extended: a new tensor, neither
    input is modified (an update the trainer skips or retries must leave the cycle's total as it
    was: :meth:`SolveSchedule.end_update`)."""
    if total is None:
        return grad.clone()
    longer, shorter = (grad, total) if grad.size(0) > total.size(0) else (total, grad)
    result = longer.clone()
    result[: shorter.size(0)] += shorter
    return result


def _all_reduce_mean(total: Tensor, trainer) -> Tensor:
    """The mean over the data-parallel ranks (each rank's length may differ: zero-extended)."""
    from fairseq.distributed import utils as distributed_utils

    group = trainer.data_parallel_process_group
    length = distributed_utils.all_reduce(torch.tensor([float(total.size(0))], device=total.device), group, "max")
    total = _add(total.new_zeros(int(length.item()), *total.shape[1:]), total)
    return distributed_utils.all_reduce(total, group, "sum") / trainer.data_parallel_world_size


class SolveSchedule:
    """The state of ``--floater-solve-every N`` for one :class:`~.ode.FloaterODE`."""

    def __init__(self, every: int):
        self.every = every
        self.num_updates = 0  # updates finished before the current one (loops of one's own)
        self.pending: Optional[Tensor] = None  # the cycle's gradient on the solution, summed, final units
        self.count = 0  # updates summed in pending
        self.this_update: Optional[Tensor] = None  # the current update's passes, raw
        self.candidate = None  # (pending, count) once the current update is accepted

    def begin_update(self):
        self.this_update = None  # an update abandoned before its scaling (OOM) adds nothing
        self.candidate = None

    def for_this_pass(self, ode, length: int) -> Tensor:
        with torch.no_grad():
            kept = ode.positions(length)  # the kept solution: re-solved only if the flow model moved
        leaf = kept[:length].detach().requires_grad_()
        leaf.register_hook(self._accumulate)
        return leaf

    def _accumulate(self, grad: Tensor):
        self.this_update = _add(self.this_update, grad.float())

    def finish_update(self, ode, scale, trainer=None):
        """The trainer has multiplied the update's gradients by ``scale`` (and not yet clipped them
        or stepped). Adds this update's gradient to the cycle's (kept once the update is accepted,
        :meth:`end_update`), and at the cycle's last update hands the cycle's mean, through one
        solve, to the optimizer. ``trainer`` None: a loop of one's own, whose gradients are final
        after ``scale`` and whose every update is accepted."""
        optimizer = trainer.optimizer if trainer is not None else None
        leaf_factor, remaining = _units(optimizer, scale) if trainer is not None else (float(scale), 1.0)
        n = trainer.get_num_updates() if trainer is not None else self.num_updates
        count = self.count
        pending = self.pending
        finite = True
        if self.this_update is not None:
            contribution = self.this_update * leaf_factor
            finite = bool(torch.isfinite(contribution).all())
            pending = _add(pending, contribution)
            count += 1
            self.this_update = None
        params = flow_parameters(ode)
        max_update = trainer.cfg.optimization.max_update if trainer is not None else 0
        last = (n + 1) % self.every == 0 or (max_update > 0 and n + 1 >= max_update)
        grads = None
        if last and (pending is not None or (trainer is not None and trainer.data_parallel_world_size > 1)):
            if pending is None:  # a rank without a gradient still joins the all-reduce
                pending = ode.initial.new_zeros(1, *ode.initial.shape, dtype=torch.float32)
            mean = pending / max(count, 1)
            if trainer is not None and trainer.data_parallel_world_size > 1:
                mean = _all_reduce_mean(mean, trainer)
            grads = self._backward(ode, mean)
            self.candidate = (None, 0)
        else:
            if not finite:
                # an overflow in these passes: make the optimizer see it (under loss scaling it
                # skips the update, and with it this gradient)
                grads = [torch.full_like(p, math.nan, dtype=torch.float32) for p in params]
            self.candidate = (pending, count)
        if trainer is not None:
            _hand_to_optimizer(optimizer, params, grads, remaining)
        else:
            for p, g in zip(params, grads or ()):
                p.grad = g.to(p.dtype) if p.grad is None else p.grad + g.to(p.dtype)
            self.end_update(True)
            self.num_updates += 1

    def end_update(self, applied: bool):
        """The trainer's update ended: taken (its gradient stays in the cycle, or the cycle was
        applied) or skipped (a loss-scale overflow: its gradient is dropped)."""
        if applied and self.candidate is not None:
            self.pending, self.count = self.candidate
        self.candidate = None

    @staticmethod
    def _backward(ode, mean: Tensor) -> List[Tensor]:
        """d(mean . solution) / d(flow parameters), in float32, from one solve with autograd on
        float32 copies of the parameters: no hook of the real parameters fires (DDP's), and a
        half-precision model's gradients are not rounded before the optimizer's fp32 copy."""
        params = flow_parameters(ode)
        leaves = [p.detach().to(at_least_float32(p.dtype)).requires_grad_() for p in params]
        with torch.enable_grad():
            solution = ode._solve(ode.initial_state(leaves[0]), 0, mean.size(0),
                                  field=ode.dynamics.float32(leaves[1:]))
            grads = torch.autograd.grad(solution, leaves, mean.to(solution.dtype), allow_unused=True)
        return [torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, grads)]

    def save(self, state_dict, prefix: str, solution_length: int, shape):
        pending = torch.zeros(max(solution_length, 0), *shape)
        if self.pending is not None:
            length = min(self.pending.size(0), pending.size(0))
            pending[:length] = self.pending[:length].detach().cpu()
        state_dict[prefix + PENDING] = pending
        state_dict[prefix + PENDING_UPDATES] = torch.tensor(self.count if self.pending is not None else 0)

    def load(self, pending: Optional[Tensor], count: int, device):
        """``count``: the updates summed in ``pending`` (:func:`pending_count`)."""
        self.this_update = None
        self.candidate = None
        self.pending, self.count = None, 0
        if pending is None:
            return
        used = pending.flatten(1).ne(0).any(1).nonzero()  # trailing zero rows: padding
        if used.numel():
            self.pending = pending[: int(used.max()) + 1].to(device=device, dtype=torch.float32).clone()
            self.count = count


def pending_count(stored: Optional[Tensor], saved_at: int, saved_every: int) -> int:
    """The updates of the cycle pending in a checkpoint (its ``pending_updates``); n % N for a
    checkpoint saved before it was stored (right unless an earlier --max-update cut a cycle short)."""
    return int(stored) if stored is not None else saved_at % saved_every
