from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn

from .base import PositionEncoding
from .bias_scale import INIT_STD, BiasScaleConfig, ScaledBiases, bias_scale
from .float_bounds import max_relative_distance_high
from .sharing import SharingConfig, resolve_sharing
from .values import Values


@dataclass
class RelativeDistanceConfig:
    max_relative_distance: Optional[int] = field(
        default=None,
        metadata={"values": Values(low=1, high=max_relative_distance_high,
                                   why="no two of the model's positions are further apart"),
                  "help": "clip relative offsets to [-K, K]. Default: 128 for diet_rel, 16 for shaw"},
    )


@dataclass
class DietRelConfig(SharingConfig, RelativeDistanceConfig, BiasScaleConfig):
    pass


class DietRel(ScaledBiases, PositionEncoding):
    """DIET-REL (Chen et al., 2021): a learned scalar per head per relative offset i - j,
    clipped to [-K, K], added to the logits. T5's bias without buckets. The bias is
    ``--position-bias-scale`` S times the stored ``weight`` (:mod:`.bias_scale`)."""

    config = DietRelConfig
    scaled_parameters = ("weight",)
    keeps_tables = True

    def __init__(self, cfg, side, num_layers, num_heads, head_dim):
        super().__init__(cfg, side, num_layers, num_heads, head_dim)
        self.sharing, groups, heads = resolve_sharing(self.option("position_sharing"), num_layers, num_heads)
        self.max_distance = self.option("max_relative_distance")
        self.bias_scale = bias_scale(cfg)
        # (groups, heads, 2K + 1): index K + (i - j)
        self.weight = nn.Parameter(torch.empty(groups, heads, 2 * self.max_distance + 1))
        nn.init.normal_(self.weight, std=INIT_STD / self.bias_scale)

    def published_options(self):
        return {**super().published_options(), "max_relative_distance": 128, "position_sharing": "none"}

    @staticmethod
    def largest_bias(state, scale: float) -> float:
        """The largest |bias| on the logits, from this scheme's state dict (keys without the
        stack's prefix) and its --position-bias-scale."""
        return scale * state["weight"].abs().max().item()

    def attention_bias(self, layer, q, pos):
        group = 0 if self.sharing == "layers" else layer
        k = self.max_distance

        def per_offset(offsets):  # offsets are key - query = -(i - j)
            bias = self.weight[group][:, (-offsets).clamp(-k, k) + k] * self.bias_scale
            return bias.expand(self.num_heads, -1)

        return self.relative_bias(("diet_rel", group), pos, per_offset)
