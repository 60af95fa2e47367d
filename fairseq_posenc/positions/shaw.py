import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .base import PositionEncoding, at_least_float32
from .diet_rel import RelativeDistanceConfig

# Shaw's terms index a^K, a^V by the clipped offset clip(j - i, -k, k) of each (query, key). The
# offsets follow the frame (the last T of S keys are the queries), so every query row holds the
# same offsets shifted by one: "skewing" (Huang et al., 2018, Music Transformer) lays a row out
# by offset with one reshape of a padded buffer. The two directions below are each other's
# transpose, so each is the other's backward; on CPU they beat gather and scatter_add (whose
# backwards scatter and gather over all T x S).


def _spans(t: int, s: int, k: int):
    """In the skewed layout row i, column x holds key j = x - (T - 1) + i, at offset
    x - (S - 1) whatever i: the columns before offset -k and after k, and the offsets present,
    [lo, hi) + k (fewer than 2k + 1 when the keys are fewer than k)."""
    return max(0, s - 1 - k), max(0, t - 1 - k), k + max(-k, 1 - s), k + min(k, t - 1) + 1


def _spread(scores: Tensor, t: int, s: int, k: int) -> Tensor:
    """(..., T, 2k+1) per offset -> (..., T, S) per key."""
    left, right, lo, hi = _spans(t, s, k)
    rows = scores.shape[:-1]
    # one spare column keeps the rows of the skew S + T - 1 long, T = 1 included
    skewed = torch.cat([scores[..., :1].expand(*rows, left), scores[..., lo:hi],
                        scores[..., -1:].expand(*rows, right + 1)], -1)
    cols = s + t - 1
    flat = skewed.flatten(-2)[..., t - 1:t - 1 + t * cols]
    return flat.unflatten(-1, (t, cols))[..., :s]


def _pool(probs: Tensor, t: int, s: int, k: int) -> Tensor:
    """(..., T, S) per key -> (..., T, 2k+1) summed per offset, the edges over all keys beyond."""
    left, right, lo, hi = _spans(t, s, k)
    cols = s + t - 1
    n = probs[..., 0, 0].numel()
    buffer = probs.new_zeros(n, t * (cols + 1))
    buffer.as_strided((n, t, s), (t * (cols + 1), cols, 1), t - 1).copy_(probs.reshape(n, t, s))
    skewed = buffer.view(*probs.shape[:-2], t, cols + 1)[..., :cols]
    if hi - lo == 1:
        pooled = skewed.sum(-1, keepdim=True)
    else:
        pooled = torch.cat([skewed[..., :left + 1].sum(-1, keepdim=True), skewed[..., left + 1:cols - right - 1],
                            skewed[..., cols - right - 1:].sum(-1, keepdim=True)], -1)
    return F.pad(pooled, (lo, 2 * k + 1 - hi))


class SpreadOffsets(torch.autograd.Function):
    """``scores[..., i, clip(j - i - (S - T), -k, k) + k]`` for every key j: (..., T, S)."""

    @staticmethod
    def forward(ctx, scores, t, s, k):
        ctx.sizes = (t, s, k)
        return _spread(scores, t, s, k)

    @staticmethod
    def backward(ctx, grad):
        return _pool(grad, *ctx.sizes), None, None, None


class PoolOffsets(torch.autograd.Function):
    """The transpose of :class:`SpreadOffsets`: (..., T, S) -> (..., T, 2k+1)."""

    @staticmethod
    def forward(ctx, probs, t, s, k):
        ctx.sizes = (t, s, k)
        return _pool(probs, t, s, k)

    @staticmethod
    def backward(ctx, grad):
        return _spread(grad, *ctx.sizes), None, None, None


class ShawRelative(PositionEncoding):
    """Shaw et al. (2018): learned vectors a^K, a^V per clipped offset j - i (size head dim,
    shared by the heads of a layer) added to the keys inside the logits and to the values.
    Offsets are taken in the padded frame: left padding shifts a sentence's queries and keys
    alike."""

    config = RelativeDistanceConfig
    needs_attention_weights = True

    def __init__(self, cfg, side, num_layers, num_heads, head_dim):
        super().__init__(cfg, side, num_layers, num_heads, head_dim)
        self.max_distance = cfg.max_relative_distance or 16
        if self.max_distance <= 0:
            raise ValueError(f"--max-relative-distance must be positive, got {self.max_distance}")
        # (layers, 2k + 1, head dim): index k + (j - i)
        self.rel_k = nn.Parameter(torch.empty(num_layers, 2 * self.max_distance + 1, head_dim))
        self.rel_v = nn.Parameter(torch.empty(num_layers, 2 * self.max_distance + 1, head_dim))
        # Xavier per layer: on the 3-D tensor the fan would count every layer, and the initial
        # scale would shrink with the depth
        for table in (*self.rel_k, *self.rel_v):
            nn.init.xavier_uniform_(table)

    def attention_bias(self, layer, q, pos):
        # q_i . a^K_ij / sqrt(d): (B, H, T, D) x (2k+1, D) -> (B, H, T, 2k+1), in float32; cast
        # before spreading to (B, H, T, S), which copies values exactly. The queries arrive as a
        # (T, B, H, D) buffer seen as (B, H, T, D): multiplying in that order spares a copy
        dtype = at_least_float32(q.dtype)
        rel = self.rel_k[layer].to(dtype).t() * self.head_dim**-0.5
        scores = torch.matmul(q.permute(2, 0, 1, 3).to(dtype), rel).permute(1, 2, 0, 3)
        _, t, s = pos.key
        return SpreadOffsets.apply(scores.to(q.dtype), t, s, self.max_distance)

    def value_term(self, layer, probs, pos):
        # sum_j p_ij a^V_ij: pool probabilities per offset, (B, H, T, 2k+1) x (2k+1, D). In
        # float32: the edge offsets pool every key beyond k, and a half-precision sum of many
        # small probabilities stalls
        dtype = at_least_float32(probs.dtype)
        _, t, s = pos.key
        pooled = PoolOffsets.apply(probs.to(dtype), t, s, self.max_distance)
        return torch.matmul(pooled, self.rel_v[layer].to(dtype)).to(probs.dtype)
