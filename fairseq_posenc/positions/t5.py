import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch import Tensor

from .base import PositionEncoding
from .bias_scale import INIT_STD, BiasScaleConfig, ScaledBiases, bias_scale
from .values import Values


def relative_position_bucket(relative_position: Tensor, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """T5's bucket of each relative position (Raffel et al., 2020; as in Mesh TensorFlow).

    ``relative_position`` is key position minus query position ("memory - query"). Bidirectional
    (encoder): half the buckets for keys after the query, half for keys at or before it. Causal
    (decoder): keys after the query go to bucket 0 (the mask hides them anyway). Within each half,
    the first half of the buckets are exact distances 0, 1, 2, ...; the rest grow logarithmically
    up to ``max_distance``, and every larger distance shares the last bucket.

    Returns an integer tensor of the same shape with values in [0, num_buckets).
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # log-spaced buckets for max_exact <= distance < max_distance
    log_bucket = max_exact + (
        torch.log(distance.float().clamp(min=1) / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    log_bucket = log_bucket.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, log_bucket)


@dataclass
class T5Config(BiasScaleConfig):
    t5_num_buckets: int = field(default=32, metadata={
        "values": Values(low=4, why="the encoder's two sides each need an exact and a log-spaced bucket"),
        "help": "t5: number of relative position buckets"})
    # the decoder's exact buckets cover distances below num_buckets / 2; the log-spaced ones span
    # from there to the maximum distance (log(max_distance / max_exact) divides)
    t5_max_distance: int = field(default=128, metadata={
        "values": Values(low=lambda args: getattr(args, "t5_num_buckets", 32) // 2, above=True,
                         bound="--t5-num-buckets / 2", why="the distances the decoder's exact buckets cover"),
        "help": "t5: distances from here on share the last bucket"})


class T5Bias(ScaledBiases, PositionEncoding):
    """A learned scalar per head per bucket of (key - query), shared by all layers of a stack;
    bidirectional buckets in the encoder, one-sided in the decoder. The bias is
    ``--position-bias-scale`` S times the stored ``bias.weight`` (:mod:`.bias_scale`)."""

    config = T5Config
    scaled_parameters = ("bias.weight",)
    keeps_tables = True

    def __init__(self, cfg, side, num_layers, num_heads, head_dim):
        super().__init__(cfg, side, num_layers, num_heads, head_dim)
        self.num_buckets, self.max_distance = cfg.t5_num_buckets, cfg.t5_max_distance
        self.bias_scale = bias_scale(cfg)
        self.bias = nn.Embedding(self.num_buckets, num_heads)
        nn.init.normal_(self.bias.weight, std=INIT_STD / self.bias_scale)

    @staticmethod
    def largest_bias(state, scale: float) -> float:
        """The largest |bias| on the logits, from this scheme's state dict (keys without the
        stack's prefix) and its --position-bias-scale."""
        return scale * state["bias.weight"].abs().max().item()

    def attention_bias(self, layer, q, pos):
        def per_offset(offsets):
            buckets = relative_position_bucket(offsets, not self.causal, self.num_buckets, self.max_distance)
            return self.bias(buckets).t() * self.bias_scale  # (H, offsets)

        return self.relative_bias("t5", pos, per_offset)
