from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..compat import PosencError
from .base import PositionEncoding, at_least_float32, cast
from .float_bounds import rope_theta_low
from .randomized import RandomizedConfig, TakesRandomizedPositions
from .values import Values


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


def rotation_rows(angles: Tensor) -> Tensor:
    """(2, n, dim): cos, and sin with its first half negated (signed_sin), so that
    ``x * cos + x.roll(dim / 2, -1) * signed_sin == x * cos + rotate_half(x) * sin`` exactly (a
    product's sign moves from one factor to the other exactly): two operations fewer a rotation."""
    sin = angles.sin()
    half = sin.size(-1) // 2
    return torch.stack((angles.cos(), torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)))


@dataclass
class RopeConfig(RandomizedConfig):
    rope_theta: float = field(default=10000.0, metadata={
        "values": Values(low=rope_theta_low, why="below it the last position's rotation angles overflow float32"),
        "help": "rope: base of the rotation frequencies"})


class RotaryPositionEncoding(TakesRandomizedPositions, PositionEncoding):
    """RoPE (Su et al., 2021): rotate each query and key by angles proportional to its
    position, so that q_i . k_j depends on i - j. Self-attention only."""

    config = RopeConfig
    keeps_tables = True

    def __init__(self, cfg, side, num_layers, num_heads, head_dim):
        super().__init__(cfg, side, num_layers, num_heads, head_dim)
        if head_dim % 2:
            raise PosencError(f"rope needs an even head size, got {head_dim}; set --attention-head-dim")
        self.theta = cfg.rope_theta

    def acts_through(self, hook, role):
        return super().acts_through(hook, role) and role == "self"

    def transform_qkv(self, layer, role, q, k, v, pos):
        if role != "self":
            return q, k, v

        # float32, or the model's dtype if wider (a float64 model rotates in float64)
        dtype = at_least_float32(q.dtype)

        def rows():
            if self._drawn is not None:  # --randomized-positions: a full forward, (2, B, 1, T, D)
                return rotation_rows(rope_angles(self._drawn.clamp(min=0).reshape(-1), self.head_dim, self.theta,
                                                 dtype)).view(2, *self._drawn.shape, -1).unsqueeze(2).unbind(0)
            # (2, n, D) cos, signed sin
            table = self.table("rope", pos.k_frame.numel(), lambda n: rotation_rows(
                rope_angles(torch.arange(n, device=q.device), self.head_dim, self.theta, dtype)))
            if pos.padded:  # the new tokens are the queries: (2, B, T, D)
                table = table[:, pos.q]
            else:  # the queries are the last T of the frame: a slice, (2, 1, T, D)
                start = pos.key[0]
                table = table[:, None, start:start + pos.q.size(-1)]
            return table.unsqueeze(2).unbind(0)  # (B or 1, 1, T, D) each

        cos, signed_sin = self.shared(("rope", pos.padded) + pos.key, rows)
        half = self.head_dim // 2

        def rotate(x):
            x32 = cast(x, dtype)
            return cast(x32 * cos + x32.roll(half, -1) * signed_sin, x.dtype)  # = x32 cos + rotate_half(x32) sin

        return rotate(q), rotate(k), v
