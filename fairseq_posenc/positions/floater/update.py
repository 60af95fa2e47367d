"""The passes of one optimizer update (``--update-freq``): one solve with autograd for all of them,
its backward once, with the gradients the earlier passes left on their detached copies added in."""
from typing import Optional

import torch
from torch import Tensor


class _Update:
    """The passes of one optimizer update: one solution with autograd history for all of them,
    and the gradient the passes before the last left on it."""

    def __init__(self, passes: int):
        self.passes_left = passes  # after the current pass
        self.solution: Optional[Tensor] = None
        self.grad: Optional[Tensor] = None

    def for_this_pass(self) -> Tensor:
        if self.passes_left > 0:  # the backward of this pass stops at a detached copy
            copy = self.solution.detach().requires_grad_()
            copy.register_hook(self._accumulate)
            return copy
        if self.grad is None:
            return self.solution
        grad, self.grad = self.grad, None  # added once, however many stacks use the solution
        grad = torch.cat([grad, grad.new_zeros(self.solution.size(0) - grad.size(0), *grad.shape[1:])])
        return _AddToGradient.apply(self.solution, grad)

    def _accumulate(self, grad: Tensor):
        if self.grad is None:
            self.grad = grad.clone()
            return
        if grad.size(0) > self.grad.size(0):  # a longer pass extended the solution
            grad, self.grad = self.grad, grad.clone()
        self.grad[: grad.size(0)] += grad


class _AddToGradient(torch.autograd.Function):
    """The identity, whose backward adds ``extra`` to the gradient that passes through it."""

    @staticmethod
    def forward(ctx, x: Tensor, extra: Tensor) -> Tensor:
        ctx.save_for_backward(extra)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (extra,) = ctx.saved_tensors
        return grad + extra, None
