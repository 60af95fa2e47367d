"""RoPE at inputs longer than trained, at decoding (docs/encodings.md): the frequencies or positions
of a trained RoPE model rescaled by S = decode length / trained length.

- NTK-aware scaling (bloc97, 2023; as Peng et al., 2023 write it): the base theta x S^(d/(d-2)),
  so that the lowest frequency is interpolated by S and the highest kept. Published as decode-time.
- Position interpolation (Chen et al., 2023): positions m -> m / S.
- YaRN (Peng et al., 2023): NTK-by-parts, each frequency theta_i = theta^(-2i/d) with wavelength
  lambda_i = 2 pi / theta_i and ratio r_i = L / lambda_i (L: the trained length) becomes
  ((1 - g) / S + g) theta_i, g = clamp((r_i - alpha) / (beta - alpha), 0, 1), alpha = 1, beta = 32,
  and q, k are each multiplied by sqrt(1/t) = 0.1 ln S + 1 (the attention temperature).

Chen et al. and Peng et al. fine-tune briefly at the longer length; a short-to-long study has no long
training text, so here PI and YaRN are decode-only variants, and their labels say so. Each method is
one flag whose value is its S (1: off), so that one flag is one complete setting; two at once are
refused. All three may differ from training at decoding only (models/checkpoint_settings.py's
MAY_CHANGE and DECODE_ONLY): a training run refuses them."""
import math
from dataclasses import dataclass, field, fields
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..compat import PosencError
from .values import Values

#: YaRN's ramp bounds (Peng et al., 2023, section 3.2, for LLaMA)
YARN_ALPHA, YARN_BETA = 1.0, 32.0

_S = "S = decode length / trained length; 1: off"
_WHY = "S < 1 would compress, not stretch; 1 is no scaling"


@dataclass
class RopeScalingConfig:
    rope_ntk_factor: float = field(default=1.0, metadata={
        "label": "NTK x{}", "values": Values(low=1, why=_WHY),
        "help": f"rope, at decoding only: NTK-aware scaling, base theta x S^(d/(d-2)); {_S}"})
    rope_pi_factor: float = field(default=1.0, metadata={
        "label": "PI x{} decode-only", "values": Values(low=1, why=_WHY),
        "help": f"rope, at decoding only: position interpolation (Chen et al., 2023), positions / S; {_S}"})
    rope_yarn_factor: float = field(default=1.0, metadata={
        "label": "YaRN x{} decode-only", "values": Values(low=1, why=_WHY),
        "help": f"rope, at decoding only: YaRN (Peng et al., 2023), NTK-by-parts and temperature; {_S}"})


def chosen_scaling(cfg) -> Optional[Tuple[str, float]]:
    """(flag's field name, S) of the one scaling ``cfg`` sets, or None; two at once: one line."""
    chosen = [(f.name, float(getattr(cfg, f.name, f.default))) for f in fields(RopeScalingConfig)
              if getattr(cfg, f.name, f.default) not in (None, f.default)]
    if len(chosen) > 1:
        given = " and ".join(f"--{n.replace('_', '-')} {s:g}" for n, s in chosen)
        raise PosencError(f"{given}: rope takes one scaling at a time; give one of them")
    return chosen[0] if chosen else None


def ntk_theta(theta: float, dim: int, factor: float) -> float:
    """NTK-aware base: theta x S^(d/(d-2)) (head size 2: its one frequency theta^0 = 1 stays)."""
    return theta * factor ** (dim / (dim - 2)) if dim > 2 else theta


def inverse_frequencies(dim: int, theta: float, dtype=torch.float64, device=None) -> Tensor:
    """theta^(-2i/d), i = 0 .. d/2 - 1 (rope.py's rope_angles)."""
    return theta ** (-torch.arange(0, dim, 2, dtype=dtype, device=device) / dim)


def yarn_frequencies(dim: int, theta: float, factor: float, trained_length: float, dtype=torch.float64,
                     device=None) -> Tensor:
    """YaRN's NTK-by-parts frequencies h(theta_i) = ((1 - g_i) / S + g_i) theta_i."""
    inv = inverse_frequencies(dim, theta, dtype, device)
    ratio = trained_length * inv / (2 * math.pi)  # L / lambda_i
    ramp = ((ratio - YARN_ALPHA) / (YARN_BETA - YARN_ALPHA)).clamp(0, 1)
    return inv * ((1 - ramp) / factor + ramp)


def yarn_attention_factor(factor: float) -> float:
    """sqrt(1/t) = 0.1 ln S + 1, multiplying q and k (so the logits by 1/t)."""
    return 0.1 * math.log(factor) + 1


def scaled_angles(name: str, factor: float, positions: Tensor, dim: int, theta: float, trained_length: float,
                  dtype) -> Tuple[Tensor, float]:
    """(angles (n, d) laid out as rope.py's rope_angles, the factor on q and k) of scaling ``name``."""
    if name == "rope_yarn_factor":
        inv = yarn_frequencies(dim, theta, factor, trained_length, dtype, positions.device)
        multiplier = yarn_attention_factor(factor)
    else:
        inv = inverse_frequencies(dim, ntk_theta(theta, dim, factor) if name == "rope_ntk_factor" else theta,
                                  dtype, positions.device)
        multiplier = 1.0
    scaled = positions.to(dtype) / factor if name == "rope_pi_factor" else positions.to(dtype)
    angles = scaled[:, None] * inv[None, :]
    return torch.cat((angles, angles), dim=-1), multiplier
