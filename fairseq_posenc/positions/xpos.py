"""xPos (Sun et al., 2022, "A Length-Extrapolatable Transformer"): RoPE whose rotated query at
position n is multiplied by zeta_i^(n/B) and key at m by zeta_i^(-m/B), per rotation pair i, so that
q_n . k_m carries zeta_i^((n - m)/B): an exponential decay with distance, slowest for the lowest
frequencies. zeta_i = (2i/d + gamma) / (1 + gamma), gamma = 0.4, scale base B = 512 (the paper and
torchscale's xpos_relative_position.py). The rotation is rope.py's (base 10000, as published).

The paper defines it for causal language models. Encoder-decoder form: the decoder's
self-attention as published; the encoder's self-attention by ``--xpos-encoder``: ``scaled``
(default, torchscale's encoder-decoder, which applies the same xPos in every self-attention: keys right
of a query are then amplified, zeta^(-(m - n)/B) > 1) or ``rope`` (the rotation only,
x-transformers' choice, which refuses xPos without a causal mask); cross-attention none, as RoPE.

torchscale centres the positions of each call (-L/2 .. L/2) to halve the factors' range; the product
of a query's and a key's factors is the same for any centre, and here positions count from 0 so that
a decoding step's cached keys keep their factors (incremental decoding equals the full forward);
float_bounds.py bounds B and gamma where the factors leave float32's normal range."""
import dataclasses
import math
from dataclasses import dataclass, field

import torch
from fairseq.dataclass import ChoiceEnum
from torch import Tensor

from ..compat import PosencError
from .float_bounds import xpos_gamma_low, xpos_scale_base_low
from .randomized import RandomizedConfig
from .rope import RopeConfig, RotaryPositionEncoding, rope_angles, rotation_rows
from .values import Values

ENCODER_FORMS = ("scaled", "rope")
PUBLISHED_THETA = 10000.0


@dataclass
class XposConfig:
    # B first: its bound is checked at the given gamma, whose own bound is far below any usable gamma
    xpos_scale_base: float = field(default=512.0, metadata={
        "label": "scale base {}", "values": Values(low=xpos_scale_base_low, above=True, why="below it, at this "
                                                   "--xpos-gamma, the factors leave float32's normal range at the last position"),
        "help": "xpos: B of the factors zeta^(n/B) on queries, zeta^(-m/B) on keys"})
    xpos_gamma: float = field(default=0.4, metadata={
        "label": "gamma {}", "values": Values(low=xpos_gamma_low, above=True, why="below it, at this "
                                              "--xpos-scale-base, the factors leave float32's normal range at the last position"),
        "help": "xpos: gamma of zeta_i = (2i/d + gamma) / (1 + gamma)"})
    xpos_encoder: ChoiceEnum(list(ENCODER_FORMS)) = field(default="scaled", metadata={
        "label": "encoder {}",
        "help": "xpos: the encoder's self-attention, scaled (torchscale's) or rope (the rotation only, "
        "x-transformers'); the decoder's is xPos"})


def xpos_zeta(dim: int, gamma: float, dtype=torch.float64) -> Tensor:
    """zeta_i = (2i/d + gamma) / (1 + gamma), i = 0 .. d/2 - 1."""
    return (torch.arange(0, dim, 2, dtype=dtype) / dim + gamma) / (1 + gamma)


def xpos_factors(positions: Tensor, dim: int, gamma: float, scale_base: float, dtype) -> Tensor:
    """(2, n, d): zeta_i^(p/B) (queries) and zeta_i^(-p/B) (keys), each repeated over the two halves
    as rope.py pairs dimensions (i, i + d/2); exp of the exponent in float64, then ``dtype``."""
    log_zeta = xpos_zeta(dim, gamma).log().to(positions.device)
    exponent = positions.double()[:, None] / scale_base * log_zeta[None, :]
    exponent = torch.cat((exponent, exponent), dim=-1)
    return torch.stack((exponent.exp(), (-exponent).exp())).to(dtype)


class XPos(RotaryPositionEncoding):
    """xPos: RoPE's rotation with zeta^(n/B) on queries and zeta^(-m/B) on keys. Self-attention only."""

    config = XposConfig

    def __init__(self, cfg, side, num_layers, num_heads, head_dim):
        # rope's flags reach a model rebuilt from a checkpoint unchecked (--model-overrides): refuse them here
        randomized = {f.name for f in dataclasses.fields(RandomizedConfig)}  # refused as for any encoding
        for f in (f for f in dataclasses.fields(RopeConfig) if f.name not in randomized):
            given = getattr(cfg, f.name, f.default)
            if given is not None and given != f.default:
                raise PosencError(f"--{f.name.replace('_', '-')} {given}: xpos takes none of rope's flags (its "
                                  "rotation is rope's at base 10000, its decay is what extrapolates); drop it")
        super().__init__(cfg, side, num_layers, num_heads, head_dim)
        self.theta = PUBLISHED_THETA
        self.gamma = float(cfg.xpos_gamma if getattr(cfg, "xpos_gamma", None) is not None else 0.4)
        self.scale_base = float(getattr(cfg, "xpos_scale_base", None) or 512.0)
        self.scaled = self.causal or str(getattr(cfg, "xpos_encoder", "scaled")) == "scaled"

    def rotation_table(self, n: int, device, dtype, length) -> Tensor:
        rows = rotation_rows(rope_angles(torch.arange(n, device=device), self.head_dim, self.theta, dtype))
        if not self.scaled:
            return rows
        up, down = xpos_factors(torch.arange(n, device=device), self.head_dim, self.gamma, self.scale_base, dtype)
        return torch.cat((rows * up, rows * down))  # (4, n, D): q's cos, sin, then k's
