from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..compat import PosencError
from .base import PositionEncoding, at_least_float32


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_angles(positions: Tensor, dim: int, theta: float = 10000.0, dtype: torch.dtype = torch.float32) -> Tensor:
    """Angles (len(positions), dim): position * theta^(-2i/dim), the halves repeated so that
    ``x * cos + rotate_half(x) * sin`` rotates the pairs (x_i, x_{i + dim/2})."""
    inv_freq = theta ** (-torch.arange(0, dim, 2, dtype=dtype, device=positions.device) / dim)
    angles = positions.to(dtype)[:, None] * inv_freq[None, :]
    return torch.cat((angles, angles), dim=-1)


def _cos_sin(angles: Tensor):
    return angles.cos(), angles.sin()


@dataclass
class RopeConfig:
    rope_theta: float = field(default=10000.0, metadata={"help": "rope: base of the rotation frequencies"})


class RotaryPositionEncoding(PositionEncoding):
    """RoPE (Su et al., 2021): rotate each query and key by angles proportional to its
    position, so that q_i . k_j depends on i - j. Self-attention only."""

    config = RopeConfig

    def __init__(self, cfg, side, num_layers, num_heads, head_dim):
        super().__init__(cfg, side, num_layers, num_heads, head_dim)
        if head_dim % 2:
            raise PosencError(f"rope needs an even head size, got {head_dim}; set --attention-head-dim")
        self.theta = cfg.rope_theta

    def transform_qkv(self, layer, role, q, k, v, pos):
        if role != "self":
            return q, k, v

        # float32, or the model's dtype if wider (a float64 model rotates in float64)
        dtype = at_least_float32(q.dtype)

        def rows():
            # (2, n, D) cos and sin
            table = self.table("rope", pos.k_frame.numel(), lambda n: torch.stack(_cos_sin(
                rope_angles(torch.arange(n, device=q.device), self.head_dim, self.theta, dtype))))
            # the new tokens are the queries: (B or 1, T, D) -> (B or 1, 1, T, D)
            return table[:, pos.q].unsqueeze(2)

        cos, sin = self.shared(("rope", pos.padded) + pos.key, rows).unbind(0)

        def rotate(x):
            x32 = x.to(dtype)
            return (x32 * cos + rotate_half(x32) * sin).to(x.dtype)

        return rotate(q), rotate(k), v
