"""DIET's segment attention: one learned scalar per (query segment, key segment) pair per head.

Not a position encoding of its own: ``--segment-attention`` adds it to the encoder's
self-attention next to whichever ``--position-encoding`` is chosen. Segments are delimited by a
separator token in the source; the separator closes the segment it ends. Its scalars are
``--position-bias-scale`` S times the stored ``weight`` (:mod:`.bias_scale`): the flag comes with
the position encodings' flags and applies here whichever encoding is chosen.
"""
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch import Tensor

from .base import PositionEncoding
from .bias_scale import BiasScaleConfig, ScaledBiases, bias_scale
from .values import Values


@dataclass
class SegmentConfig(BiasScaleConfig):
    """The flags of ``--segment-attention`` (the switch itself is a general flag): refused
    without it, as an encoding's flags are with another encoding (models/config.py)."""

    segment_separator: str = field(
        default="<sep>", metadata={"values": Values(token=True, why="a symbol of the source dictionary"),
                                   "help": "source token that ends a segment (--segment-attention)"}
    )
    max_segments: int = field(
        default=8, metadata={"values": Values(low=1),
                             "help": "segments with their own parameters; later ones share the last "
                             "(--segment-attention)"}
    )


def segment_ids(tokens: Tensor, separator: int, max_segments: int) -> Tensor:
    """(B, T) segment index of each token: the number of separators before it, capped at
    ``max_segments - 1`` (later segments share the last one)."""
    is_sep = tokens.eq(separator).long()
    return (is_sep.cumsum(-1) - is_sep).clamp_(max=max_segments - 1)


class SegmentBias(ScaledBiases, PositionEncoding):
    config = SegmentConfig
    scaled_parameters = ("weight",)

    def __init__(self, cfg, num_layers, num_heads, head_dim, separator_index: int):
        super().__init__(cfg, "encoder", num_layers, num_heads, head_dim)
        self.separator = separator_index
        self.max_segments = cfg.max_segments
        # initialised at 0, which is 0 / S for every S
        self.bias_scale = bias_scale(cfg)
        # (layers, heads, query segment, key segment)
        self.weight = nn.Parameter(torch.zeros(num_layers, num_heads, cfg.max_segments, cfg.max_segments))
        self._segments = None

    @classmethod
    def initial_stds(cls, args, head_dim):
        return ()  # initialised at 0

    @staticmethod
    def largest_bias(state, scale: float) -> float:
        """The largest |scalar| on the logits, from this module's state dict (keys without the
        encoder's prefix) and its --position-bias-scale."""
        return scale * state["weight"].abs().max().item()

    def begin_forward(self, tokens, continues=False):
        super().begin_forward(tokens, continues)
        self._segments = segment_ids(tokens, self.separator, self.max_segments)

    def attention_bias(self, layer, q, pos):
        seg = self._segments
        # (H, B, T, S) -> (B, H, T, S)
        return (self.weight[layer] * self.bias_scale)[:, seg[:, :, None], seg[:, None, :]].transpose(0, 1)
