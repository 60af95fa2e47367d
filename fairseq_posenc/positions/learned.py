"""A learned vector per absolute position, at the input (fairseq's own embedding) or at every block.

At every block (``--position-blocks all``) each block n has its own table p^(n), L_max x d
parameters as fairseq's input embedding (plus its padding rows), N tables per stack in all:
block 1's is fairseq's input embedding, blocks 2..N's live here and are looked up at the same
positions (fairseq's numbering, left padding and decoding steps included). The tables end at
``--max-source-positions`` / ``--max-target-positions``.
"""
from typing import Optional

import torch.nn as nn
from fairseq.modules import PositionalEmbedding

from .base import PositionBlocksConfig, PositionEncoding
from .sinusoidal import check_input_embedding, newest_positions


class LearnedPositionEncoding(PositionEncoding):
    input_embedding = "learned"
    extrapolates = False
    config = PositionBlocksConfig
    default_blocks = "input"

    def use_input_embedding(self, embedding: Optional[nn.Module]):
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
