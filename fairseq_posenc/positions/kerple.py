"""KERPLE (Chi et al., 2022, arXiv 2205.09921): a learned kernel of the distance on each head's logits.

- ``log`` (the default, the paper's best): -r1 log(1 + r2 |i - j|),
- ``power`` (``--kerple-kernel power``): -r1 |i - j|^r2,

with r1, r2 learned per head under the paper's constraints: r1, r2 > 0, and the power's exponent
r2 at most 2 (a conditionally positive definite kernel). As the authors' code (chijames/KERPLE,
megatron/mpu/layers.py): one pair per head shared by the layers of a stack, initialised uniformly,
the log kernel's r1 in (0, 2) and r2 in (0, 1), the power kernel's r1 in (0, 1) and r2 in (0, 2),
and the constraints kept by clamping the parameters to [0.01, ...] (the exponent to [0.01, 2])
before each forward that records gradients (a projected gradient step); the bias reads the clamped
values too, so that no forward sees a value outside them.

The paper's model is a decoder-only language model, causal: the decoder's bias is that, for keys
j <= i. The kernel is a function of the distance |i - j|, and the encoder sees both sides with it
(symmetric, like ALiBi's published bidirectional form): it does not tell left from right but by
the tokens at one end. The cross-attention gets no bias.
"""
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from fairseq.dataclass import ChoiceEnum
from torch import Tensor

from .base import PositionEncoding, at_least_float32

KERNELS = ("log", "power")
#: the smallest r1 and r2 (the authors' clamp), and the power kernel's largest exponent
EPS, MAX_POWER = 1e-2, 2.0


@dataclass
class KerpleConfig:
    kerple_kernel: ChoiceEnum(list(KERNELS)) = field(
        default="log",
        metadata={"label": "{}",
                  "help": "kerple: the kernel, log (-r1 log(1 + r2 |i-j|), the paper's best) or power (-r1 |i-j|^r2, "
                  "r2 <= 2)"},
    )


def kerple_bias(r1: Tensor, r2: Tensor, offsets: Tensor, kernel: str = "log") -> Tensor:
    """The bias of each head at each offset: ``r1``, ``r2`` (H,), ``offsets`` (N,) -> (H, N)."""
    distance = offsets.abs().to(r1.dtype)[None]
    if kernel == "log":
        return -r1[:, None] * torch.log1p(r2[:, None] * distance)
    if kernel == "power":
        # 0^r2 = 0; through 1^r2 so that the exponent's gradient (x^r log x) is not 0 x -inf
        zero = distance == 0
        return -r1[:, None] * torch.where(zero, 0.0, torch.where(zero, 1.0, distance) ** r2[:, None])
    raise ValueError(f"--kerple-kernel {kernel!r} is not a kernel; choose one of {', '.join(KERNELS)}")


class Kerple(PositionEncoding):
    """-r1 log(1 + r2 |i - j|) or -r1 |i - j|^r2 per head, r1, r2 learned (see the module doc)."""

    config = KerpleConfig
    keeps_tables = True
    tells_left_from_right = False  # |i - j| only
    #: kept positive by clamping (tests/helpers/toy.py draws random values for them as magnitudes)
    positive_parameters = ("r1", "r2")

    def __init__(self, cfg, side, num_layers, num_heads, head_dim):
        super().__init__(cfg, side, num_layers, num_heads, head_dim)
        self.kernel = getattr(cfg, "kerple_kernel", None) or "log"
        # the authors' uniform initialisations: the scale r1 times 2 for log, the exponent r2 for power
        r1_high, r2_high = (2.0, 1.0) if self.kernel == "log" else (1.0, 2.0)
        self.r1 = nn.Parameter(torch.rand(num_heads) * r1_high)
        self.r2 = nn.Parameter(torch.rand(num_heads) * r2_high)

    def _r2_high(self):
        return MAX_POWER if self.kernel == "power" else None

    def begin_forward(self, tokens, continues=False):
        if torch.is_grad_enabled():
            # the authors' projection: after an optimizer step, back inside the constraints
            with torch.no_grad():
                self.r1.clamp_(min=EPS)
                self.r2.clamp_(min=EPS, max=self._r2_high())
        super().begin_forward(tokens, continues)

    def attention_bias(self, layer, q, pos):
        def per_offset(offsets):
            dtype = at_least_float32(self.r1.dtype)
            r1 = self.r1.to(dtype).clamp(min=EPS)
            r2 = self.r2.to(dtype).clamp(min=EPS, max=self._r2_high())
            return kerple_bias(r1, r2, offsets, self.kernel)

        return self.relative_bias(("kerple", self.kernel), pos, per_offset)
