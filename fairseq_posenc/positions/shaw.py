import torch
import torch.nn as nn

from .base import PositionEncoding, at_least_float32, cast
from .diet_rel import RelativeDistanceConfig


class ShawRelative(PositionEncoding):
    """Shaw et al. (2018): learned vectors a^K, a^V per clipped offset j - i (size head dim,
    shared by the heads of a layer) added to the keys inside the logits and to the values."""

    config = RelativeDistanceConfig
    needs_attention_weights = True

    def __init__(self, cfg, side, num_layers, num_heads, head_dim):
        super().__init__(cfg, side, num_layers, num_heads, head_dim)
        self.max_distance = self.option("max_relative_distance")
        # (layers, 2k + 1, head dim): index k + (j - i)
        self.rel_k = nn.Parameter(torch.empty(num_layers, 2 * self.max_distance + 1, head_dim))
        self.rel_v = nn.Parameter(torch.empty(num_layers, 2 * self.max_distance + 1, head_dim))
        # Xavier per layer: on the 3-D tensor the fan would count every layer, and the initial
        # scale would shrink with the depth
        for table in (*self.rel_k, *self.rel_v):
            nn.init.xavier_uniform_(table)

    def published_options(self):
        return {**super().published_options(), "max_relative_distance": 16}

    def _index(self, pos):
        k = self.max_distance
        return self.shared(
            ("shaw_index",) + pos.key,
            lambda: (pos.k_frame[None, :] - pos.q_frame[:, None]).clamp(-k, k) + k,  # (T, S)
        )

    def attention_bias(self, layer, q, pos):
        # q_i . a^K_ij / sqrt(d): (B, H, T, D) x (2k+1, D) -> (B, H, T, 2k+1), in float32; cast
        # before the gather to (B, H, T, S), which copies values exactly
        dtype = at_least_float32(q.dtype)
        scores = torch.matmul(cast(q, dtype), cast(self.rel_k[layer], dtype).t()) * self.head_dim**-0.5
        scores = cast(scores, q.dtype)
        index = self._index(pos)
        return scores.gather(-1, index.expand(*scores.shape[:2], *index.shape))

    def value_term(self, layer, probs, pos):
        # sum_j p_ij a^V_ij: pool probabilities per offset, (B, H, T, 2k+1) x (2k+1, D). In
        # float32: the edge offsets pool every key beyond k, and a half-precision sum of many
        # small probabilities stalls
        index = self._index(pos).expand_as(probs)
        dtype = at_least_float32(probs.dtype)
        pooled = probs.new_zeros(*probs.shape[:3], 2 * self.max_distance + 1, dtype=dtype)
        pooled.scatter_add_(-1, index, cast(probs, dtype))
        return cast(torch.matmul(pooled, cast(self.rel_v[layer], dtype)), probs.dtype)
