"""FIRE (Li et al., 2023, arXiv 2310.04418): a learned function of the progressively interpolated
log distance on each head's logits.

    b(i, j) = f(psi(i - j) / psi(max(L, i))),   psi(x) = log(c |x| + 1),

f an MLP 1 -> 32 -> H with a ReLU (one output per head), c and the threshold L learned, as the
paper's appendix code: c starts at 0.1, L = |m x 512| with a learned multiplier m starting at 1,
psi(max(L, i)) plus 1e-6, the positions i, j counted from 0, the MLP PyTorch's default
nn.Linear initialisation, less the last layer's bias: a constant per head on every logit of a row,
which the softmax ignores (it would never get a gradient). One FIRE per stack, shared by its layers (as T5's bias); the bias depends
on the query's position through the normaliser, so it is a table over (i, j), not over i - j.

The paper's model is causal (decoder-only): the decoder's bias is that, for keys j <= i. The
paper's code takes psi of |c (i - j)|, so the same formula over both sides is the encoder's
default form, ``--fire-encoder symmetric``: f sees the distance, not its side, but the normaliser
sees the query's position: past L (learned) the encoder tells left from right (up to L + 1 tokens
only by the tokens at one end). ``--fire-encoder signed`` gives f the side: its input is
sign(i - j) psi(|i - j|) / psi(max(L, i)), in [-1, 1] (keys before the query positive). The
cross-attention gets no bias.
"""
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from fairseq.dataclass import ChoiceEnum
from torch import Tensor

from .base import PositionEncoding, at_least_float32, gather_square

ENCODER_FORMS = ("symmetric", "signed")
#: the paper's code: the MLP's width, c's and L's initial values, the normaliser's epsilon
WIDTH, INIT_C, INIT_L, EPS = 32, 0.1, 512.0, 1e-6


@dataclass
class FireConfig:
    fire_encoder: ChoiceEnum(list(ENCODER_FORMS)) = field(
        default="symmetric",
        metadata={"label": "{}",
                  "help": "fire: the encoder's input to f, symmetric (psi(|i-j|), the paper's formula on both sides) "
                  "or signed (sign(i-j) psi(|i-j|): tells left from right). The decoder is causal"},
    )


def fire_input(c: Tensor, threshold: Tensor, n: int, signed: bool = False) -> Tensor:
    """f's input at query i, key j < ``n``: psi(i - j) / (psi(max(L, i)) + 1e-6) -> (n, n); with
    ``signed``, times sign(i - j)."""
    positions = torch.arange(n, device=c.device, dtype=c.dtype)
    distance = positions[:, None] - positions[None, :]
    normaliser = torch.log(torch.abs(c * torch.maximum(positions, threshold)) + 1) + EPS
    x = torch.log(torch.abs(c * distance) + 1) / normaliser[:, None]
    return x * torch.sign(distance) if signed else x


class Fire(PositionEncoding):
    """A learned MLP of the interpolated log distance per head (see the module doc)."""

    config = FireConfig
    keeps_tables = True
    #: positions per unit of a parameter: L = 512 |m| (tests/helpers/toy.py draws m in positions)
    parameter_units = {"L_multiplier": INIT_L}
    #: parameters that learn slowly from the published initialisation on sentences far shorter than
    #: L (tests/unit/test_position_gradients.py): a hidden unit whose ReLU kink lies outside the
    #: inputs' range, psi(i - j) / psi(L) <= 0.3 at 23 tokens, adds its bias to every logit of a row,
    #: which the softmax ignores; only the few units with a kink inside it carry a gradient
    slow_parameters = {"mlp.0.bias"}

    def __init__(self, cfg, side, num_layers, num_heads, head_dim):
        super().__init__(cfg, side, num_layers, num_heads, head_dim)
        self.form = (getattr(cfg, "fire_encoder", None) or "symmetric") if side == "encoder" else "symmetric"
        self.mlp = nn.Sequential(nn.Linear(1, WIDTH), nn.ReLU(), nn.Linear(WIDTH, num_heads, bias=False))
        self.c = nn.Parameter(torch.tensor(INIT_C))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))

    def carried_options(self) -> dict:
        return {**super().carried_options(), "fire_encoder": self.form if self.side == "encoder" else "symmetric"}

    def bias_table(self, n: int) -> Tensor:
        """(H, n, n): the bias at query i, key j."""
        dtype = at_least_float32(self.c.dtype)
        c, threshold = self.c.to(dtype), torch.abs(self.L_multiplier.to(dtype) * INIT_L)
        x = fire_input(c, threshold, n, self.form == "signed")
        first, _, last = self.mlp
        hidden = torch.relu(x[..., None] * first.weight[:, 0].to(dtype) + first.bias.to(dtype))
        return torch.einsum("ijw,hw->hij", hidden, last.weight.to(dtype))

    def attention_bias(self, layer, q, pos):
        # real positions (pos.k, left padding) never pass the frame's
        return gather_square(self.table(("fire", self.form), pos.k_frame.numel(), self.bias_table), pos)
