"""FLOATER's dynamics h(t, p), the right-hand side of its ODE, and its float32 form for one solve."""
from typing import List, Optional

import torch
import torch.nn as nn
from torch import Tensor

from ..base import at_least_float32

#: h's parameters in :class:`Dynamics`, in :class:`Float32Field`'s order
DYNAMICS = ("fc1.weight", "fc1.bias", "time1", "fc2.weight", "fc2.bias", "time2")


class Dynamics(nn.Module):
    """h(t, p) = W2 [t; relu(W1 [t; p])]: two linear layers, each seeing the time.

    The time column of each weight is its own parameter (``time1``, ``time2``), so that the
    solver's inner loop needs no concatenation and no slicing of weights, whose backward would
    materialise a full-size gradient at every step.
    """

    def __init__(self, dim: int, hidden: int, lr_scale: float = 1.0, dissipation: float = 0.0):
        super().__init__()
        # --floater-dissipation: dp/dt = -dissipation p + tanh(h(t, p)) (Float32Field)
        self.dissipation = float(dissipation)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        # initialised as nn.Linear(dim + 1, hidden) and nn.Linear(hidden + 1, dim) would be
        self.time1 = nn.Parameter(torch.empty(hidden).uniform_(-1, 1) / (dim + 1) ** 0.5)
        self.time2 = nn.Parameter(torch.empty(dim).uniform_(-1, 1) / (hidden + 1) ** 0.5)
        # --floater-lr-scale C: the parameters hold W / C. Adam's step does not depend on the
        # gradient's scale, so V moves as far as W would and W = C V C times as far (fairseq's
        # set_lr overwrites every parameter group's lr, so a group of its own would not last)
        self.lr_scale = lr_scale
        if lr_scale != 1:
            with torch.no_grad():
                for p in self.parameters():
                    p.div_(lr_scale)

    def float32(self, stored: Optional[List[Tensor]] = None) -> "Float32Field":
        """h with its weights in float32, cast once per solve (no copy when they already are).
        ``stored``: other tensors in place of fc1.weight, fc1.bias, time1, fc2.weight, fc2.bias,
        time2 (FLOATER's flow update differentiates float32 copies of them)."""
        fc1, b1, time1, fc2, b2, time2 = stored if stored is not None else (
            self.fc1.weight, self.fc1.bias, self.time1, self.fc2.weight, self.fc2.bias, self.time2)
        dtype = at_least_float32(fc1.dtype)
        weights = tuple(w.to(dtype) for w in (fc1.t(), b1, time1, fc2.t(), b2, time2))
        if self.lr_scale != 1:
            weights = tuple(w * self.lr_scale for w in weights)
        return Float32Field(weights, self.dissipation)

    def forward(self, t: Tensor, p: Tensor) -> Tensor:
        return self.float32()(t, p)

    def get_extra_state(self):
        """C, saved with the weights (a float64 tensor: ``model.half()`` would round a buffer); a
        state dict of another C is rescaled on load (:func:`.loading.rescale_on_load`)."""
        return torch.tensor(self.lr_scale, dtype=torch.float64)

    def set_extra_state(self, state):
        """Nothing: the ODE's load pre-hook has already read and applied it (and kept the C the
        weights were trained with, ``_trained_scale``, for the model's label)."""


class Float32Field:
    """The right-hand side h(t, p) of one solve, in float32 (or the model's dtype if wider).

    Under --fp16/--bf16 a solve in half precision loses the positions: the time t = i dt
    rounds (bf16 keeps 8 bits: from position 640 on, t moves in steps of 0.5, so 5 positions
    share it), and each solver step adds an increment far below the state's precision.
    """

    def __init__(self, weights, dissipation: float = 0.0):
        self.weights = weights
        #: --floater-dissipation LAMBDA > 0: the field is -LAMBDA p + tanh(h(t, p)) (docs/floater.md)
        self.dissipation = dissipation

    def __call__(self, t: Tensor, p: Tensor) -> Tensor:
        w1, b1, time1, w2, b2, time2 = self.weights
        # under --amp/--bf16 autocast would run addmm in half precision (torchdiffeq's solvers,
        # the adjoint's backward solve included, call this inside the model's forward)
        with torch.autocast(device_type=p.device.type, enabled=False):
            t = t.to(p.dtype)
            hidden = torch.relu(torch.addmm(b1 + t * time1, p, w1))
            out = torch.addmm(b2 + t * time2, hidden, w2)
            if self.dissipation:
                # each coordinate: dp/dt <= -LAMBDA p + 1 < 0 wherever p > 1 / LAMBDA (and the mirror
                # image below -1 / LAMBDA), so |p_j| never exceeds max(|p_j(0)|, 1 / LAMBDA)
                out = torch.tanh(out) - self.dissipation * p
            return out
