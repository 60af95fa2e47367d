"""The interface every position encoding implements.

A scheme is a small module owned by one Transformer stack (the encoder or the decoder). It can
keep fairseq's own input position embedding (``input_embedding``), and it tells the model how
far it can go (``max_positions``: ``None`` means it extrapolates to any length).
"""
from typing import Optional

import torch.nn as nn


class PositionEncoding(nn.Module):
    #: fairseq input embedding to add to the token embeddings: "sinusoidal", "learned" or None
    input_embedding: Optional[str] = None
    #: True where the scheme has a hard length limit fixed when the model is built
    length_limited: bool = False

    def __init__(self, cfg, side: str, num_layers: int, num_heads: int, head_dim: int):
        super().__init__()
        if side not in ("encoder", "decoder"):
            raise ValueError(f"side must be 'encoder' or 'decoder', got {side!r}")
        self.side = side
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.head_dim = head_dim

    @classmethod
    def add_args(cls, parser):
        """Add the scheme's own flags (none by default)."""
