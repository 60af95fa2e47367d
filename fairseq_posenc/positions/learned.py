"""A learned vector per absolute position, at the input (fairseq's own embedding) or at every block.

At every block (``--position-blocks all``) each block n has its own table p^(n), L_max x d
parameters as fairseq's input embedding (plus its padding rows), N tables per stack in all:
block 1's is fairseq's input embedding, blocks 2..N's live here and are looked up at the same
positions (fairseq's numbering, left padding and decoding steps included). The tables end at
``--max-source-positions`` / ``--max-target-positions``; with ``--randomized-positions`` at L =
``--randomized-max-position`` (L - max positions more rows of d parameters, each table).
"""
from typing import Optional

import torch.nn as nn
from fairseq.modules import PositionalEmbedding

from .base import PositionEncoding
from .randomized import TakesRandomizedPositions
from .sinusoidal import AbsoluteConfig, check_input_embedding, newest_positions


class LearnedPositionEncoding(TakesRandomizedPositions, PositionEncoding):
    input_embedding = "learned"
    extrapolates = False
    config = AbsoluteConfig
    default_blocks = "input"

    def use_input_embedding(self, embedding: Optional[nn.Module]):
        super().use_input_embedding(embedding)  # --randomized-positions: a learned table grown first
        if self.position_blocks == "all" and not hasattr(self, "block_tables"):
            check_input_embedding(embedding)
            # initialised as fairseq initialises the input table
            self.block_tables = nn.ModuleList(
                PositionalEmbedding(embedding.max_positions, embedding.embedding_dim, embedding.padding_idx,
                                    learned=True)
                for _ in range(self.num_layers - 1))

    def begin_forward(self, tokens, continues=False):
        super().begin_forward(tokens, continues)
        self._tokens = tokens

    def block_input(self, layer, x):
        if self.position_blocks != "all" or layer == 0:  # block 1's table is the input embedding
            return x
        return x + newest_positions(self.block_tables[layer - 1], self._tokens, x.size(0)).to(x.dtype)
