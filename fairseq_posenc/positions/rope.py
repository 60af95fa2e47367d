from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..compat import PosencError
from .base import PositionEncoding, at_least_float32, cast
from .float_bounds import rope_theta_low
from .randomized import RandomizedConfig, TakesRandomizedPositions
from .rope_scaling import RopeScalingConfig, chosen_scaling, scaled_angles
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
class RopeConfig(RopeScalingConfig, RandomizedConfig):
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
        self.theta = getattr(cfg, "rope_theta", RopeConfig.rope_theta)
        # at decoding only (rope_scaling.py): the flag's name and S, or None
        self.scaling, self.scaling_factor = chosen_scaling(cfg) or (None, 1.0)

    @classmethod
    def finish_model(cls, model, args):
        super().finish_model(model, args)
        for stack in (model.encoder, model.decoder):  # YaRN's L: what the weights were trained on
            stack.position_encoding._longest_trained = getattr(stack, "longest_trained", None)

    def trained_length(self) -> int:
        """The longest input this stack was trained on (its weights carry it); untrained: its maximum."""
        longest = getattr(self, "_longest_trained", None)
        return int(longest) if longest is not None and int(longest) > 0 else self.max_positions

    def begin_forward(self, tokens, continues=False):
        super().begin_forward(tokens, continues)
        if self.scaling == "rope_yarn_factor" and not continues:  # read once a decode, not every step
            self._yarn_length = self.trained_length()

    def rotation_table(self, n: int, device, dtype, length: int) -> Tensor:
        """(2, n, D): cos and signed sin of positions 0 .. n - 1 (rotation_rows), rows 0-1 for q,
        the last two for k (a subclass may give k its own)."""
        return self.rotation_at(torch.arange(n, device=device), dtype, length)

    def rotation_at(self, positions: Tensor, dtype, length: int) -> Tensor:
        """(2, len(positions), D): the rotation of ``positions``, a decode-time scaling applied (also
        to randomized positions, which the encoder samples at evaluation too)."""
        if self.scaling is None:
            return rotation_rows(rope_angles(positions, self.head_dim, self.theta, dtype))
        angles, multiplier = scaled_angles(self.scaling, self.scaling_factor, positions, self.head_dim, self.theta,
                                           length, dtype)
        return rotation_rows(angles) * multiplier

    def acts_through(self, hook, role):
        return super().acts_through(hook, role) and role == "self"

    def transform_qkv(self, layer, role, q, k, v, pos):
        if role != "self":
            return q, k, v

        # float32, or the model's dtype if wider (a float64 model rotates in float64)
        dtype = at_least_float32(q.dtype)

        length = self._yarn_length if self.scaling == "rope_yarn_factor" else None

        def rows():
            if self._drawn is not None:  # --randomized-positions: a full forward, (2, B, 1, T, D)
                return self.rotation_at(self._drawn.clamp(min=0).reshape(-1), dtype, length).view(
                    2, *self._drawn.shape, -1).unsqueeze(2).unbind(0)
            # (2 or 4, n, D) cos, signed sin (of q, then of k)
            table = self.table(("rope", length), pos.k_frame.numel(),
                               lambda n: self.rotation_table(n, q.device, dtype, length))
            if pos.padded:  # the new tokens are the queries: (2, B, T, D)
                table = table[:, pos.q]
            else:  # the queries are the last T of the frame: a slice, (2, 1, T, D)
                start = pos.key[0]
                table = table[:, None, start:start + pos.q.size(-1)]
            return table.unsqueeze(2).unbind(0)  # (B or 1, 1, T, D) each

        rows = self.shared(("rope", pos.padded) + pos.key, rows)
        half = self.head_dim // 2

        def rotate(x, cos, signed_sin):
            x32 = cast(x, dtype)
            return cast(x32 * cos + x32.roll(half, -1) * signed_sin, x.dtype)  # = x32 cos + rotate_half(x32) sin

        return rotate(q, *rows[:2]), rotate(k, *rows[-2:]), v
