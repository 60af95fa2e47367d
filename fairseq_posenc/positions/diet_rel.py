from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn

from .base import PositionEncoding
from .sharing import SharingConfig, resolve_sharing


@dataclass
class RelativeDistanceConfig:
    max_relative_distance: Optional[int] = field(
        default=None,
        metadata={"help": "clip relative offsets to [-K, K]. Default: 128 for diet_rel, 16 for shaw"},
    )


@dataclass
class DietRelConfig(SharingConfig, RelativeDistanceConfig):
    pass


class DietRel(PositionEncoding):
    """DIET-REL (Chen et al., 2021): a learned scalar per head per relative offset i - j,
    clipped to [-K, K], added to the logits. T5's bias without buckets."""

    config = DietRelConfig

    def __init__(self, cfg, side, num_layers, num_heads, head_dim):
        super().__init__(cfg, side, num_layers, num_heads, head_dim)
        self.sharing, groups, heads = resolve_sharing(cfg, "none", num_layers, num_heads)
        self.max_distance = cfg.max_relative_distance or 128
        if self.max_distance <= 0:
            raise ValueError(f"--max-relative-distance must be positive, got {self.max_distance}")
        # (groups, heads, 2K + 1): index K + (i - j)
        self.weight = nn.Parameter(torch.empty(groups, heads, 2 * self.max_distance + 1))
        nn.init.normal_(self.weight, std=0.02)

    def attention_bias(self, layer, q, pos):
        group = 0 if self.sharing == "layers" else layer
        k = self.max_distance

        def per_offset(offsets):  # offsets are key - query = -(i - j)
            return self.weight[group][:, (-offsets).clamp(-k, k) + k].expand(self.num_heads, -1)

        return self.relative_bias(("diet_rel", group), pos, per_offset)
