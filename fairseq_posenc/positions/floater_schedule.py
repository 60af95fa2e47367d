"""FLOATER's flow model updated every N optimizer updates (``--floater-solve-every N``, Liu et
al. 2020, Sec. 4.4: cache the position biases for some iterations, update h less often).

The flow model is h and the per-block initial states: the initial states are the solve's initial
condition, so they can only move when the solution is recomputed. Within a cycle of N updates
(fairseq's updates n with n // N equal) the training passes read the kept solution of the current
parameters (solved without gradients at the first forward after the flow model changed, the same
table validation and decoding read, :mod:`.kept`) as a leaf tensor, and the gradient that reaches
it is accumulated: each update's, times the factor fairseq's trainer then multiplies every
gradient by (1 / sample size, and 1 / loss scale), so that each update is normalised by its own
sample size. At the last update of a cycle ((n + 1) % N == 0) the ODE is solved once with autograd
from the current parameters (the solution the cycle read, to float32 rounding) and the accumulated
gradient is backpropagated through it, after fairseq's scaling and before its clipping and
optimizer step: h and the initial states get the sum of the N updates' gradients, once. In the
other updates nothing reaches them and their ``.grad`` stays None, so that fairseq's Adam skips
them (a zero gradient would still move them through Adam's momentum, and the kept solution would
no longer be theirs).

The gradient accumulated in an unfinished cycle is saved in the checkpoint (``pending_gradient``,
zero-padded to the stored solution's length, zeros at a cycle's end): a run resumed mid-cycle
finishes the cycle as if it had not stopped.
"""
from typing import Optional

import torch
from torch import Tensor

from ..compat import PosencError

PENDING = "pending_gradient"


def check(solve_every: int, lr_scale: float):
    if int(solve_every) != solve_every or solve_every < 1:
        raise PosencError(f"--floater-solve-every must be a whole number >= 1, got {solve_every}")
    if not lr_scale > 0:
        raise PosencError(f"--floater-lr-scale must be positive, got {lr_scale}")


def refuse_unsupported(trainer):
    """The accumulated gradient is added after fairseq's scaling: under --fp16/--bf16/--amp the
    optimizer defers that scaling (and changes the loss scale between updates), and with several
    workers each would accumulate its own gradient without all-reducing it."""
    common = trainer.cfg.common
    if common.fp16 or common.bf16 or getattr(common, "amp", False) or common.memory_efficient_fp16:
        raise PosencError("--floater-solve-every > 1 supports float32 training only (not --fp16, --bf16, --amp)")
    if trainer.data_parallel_world_size > 1:
        raise PosencError("--floater-solve-every > 1 supports one training process only")


def _add(total: Optional[Tensor], grad: Tensor) -> Tensor:
    """``total + grad`` along the first dimension, the shorter zero-extended."""
    if total is None:
        return grad.clone()
    if grad.size(0) > total.size(0):
        total, grad = grad.clone(), total
    total[: grad.size(0)] += grad
    return total


class SolveSchedule:
    """The state of ``--floater-solve-every N`` for one :class:`~.floater.FloaterODE`."""

    def __init__(self, every: int):
        self.every = every
        self.num_updates = 0  # updates finished before the current one (fairseq's count)
        self.pending: Optional[Tensor] = None  # the cycle's gradient on the solution, scaled
        self.this_update: Optional[Tensor] = None  # the current update's, not yet scaled

    def begin_update(self):
        self.this_update = None  # an update abandoned before its scaling (OOM) adds nothing

    def for_this_pass(self, ode, length: int) -> Tensor:
        with torch.no_grad():
            kept = ode.positions(length)  # the kept solution: re-solved only if the flow model moved
        leaf = kept[:length].detach().requires_grad_()
        leaf.register_hook(self._accumulate)
        return leaf

    def _accumulate(self, grad: Tensor):
        self.this_update = _add(self.this_update, grad)

    def finish_update(self, ode, scale):
        """fairseq's trainer has multiplied the update's gradients by ``scale``; on the cycle's
        last update, backpropagate the cycle's gradient through one solve."""
        if self.this_update is not None:
            self.pending = _add(self.pending, self.this_update * scale)
            self.this_update = None
        if (self.num_updates + 1) % self.every == 0 and self.pending is not None:
            pending, self.pending = self.pending, None
            with torch.enable_grad():
                solution = ode._solve(ode.initial, 0, pending.size(0))
                solution.backward(pending.to(solution.dtype))
        self.num_updates += 1

    def save(self, state_dict, prefix: str, solution_length: int, shape):
        pending = torch.zeros(max(solution_length, 0), *shape)
        if self.pending is not None:
            pending[: self.pending.size(0)] = self.pending.detach().cpu()
        state_dict[prefix + PENDING] = pending

    def load(self, pending: Optional[Tensor], device):
        self.this_update = None
        self.pending = None
        if pending is None:
            return
        used = pending.flatten(1).ne(0).any(1).nonzero()  # trailing zero rows: padding
        if used.numel():
            self.pending = pending[: int(used.max()) + 1].to(device=device, dtype=torch.float32).clone()
