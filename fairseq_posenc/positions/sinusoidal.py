"""Vaswani et al.'s fixed sinusoids, at the input (fairseq's own embedding) or at every block.

At every block (``--position-blocks all``) block n's input gets FLOATER's Eq. 7, the Universal
Transformer's timing and depth signal: p_i^(n) = s(i) + s(n), where s(r) is fairseq's sinusoidal
row r, [sin(r w_0) .. sin(r w_{h-1}), cos(r w_0) .. cos(r w_{h-1})] with w_k = 10000^(-k/(h-1)),
h = d / 2. That is the paper's Eq. 7 (c = 1e-4) in the layout and frequencies of fairseq's input
embedding (sines then cosines, not interleaved; h - 1 where the paper has h), so that s(i) at
block 1 is exactly the input embedding and every later block sees the same s(i). i is fairseq's
position number (the first real token of a left-padded source is padding index + 1 = 2) and n
counts blocks from 1 in each stack, as the paper's Eq. 5: block 1 gets s(1) on top of the input
embedding's s(i).
"""
from dataclasses import dataclass
from typing import Optional

import torch.nn as nn
from fairseq.modules.sinusoidal_positional_embedding import SinusoidalPositionalEmbedding
from torch import Tensor

from ..compat import PosencError
from .base import PositionBlocksConfig, PositionEncoding
from .randomized import RandomizedConfig, TakesRandomizedPositions


@dataclass
class AbsoluteConfig(PositionBlocksConfig, RandomizedConfig):
    """The flags of the encoders of absolute positions at the input (sinusoidal, learned)."""


def check_input_embedding(embedding: Optional[nn.Module]):
    """The later blocks of ``--position-blocks all`` are computed as block 1's input embedding is."""
    if embedding is None:
        raise PosencError("--position-blocks all adds fairseq's input position embedding at every block: "
                          "drop --no-token-positional-embeddings")


def newest_positions(embedding: nn.Module, tokens: Tensor, steps: int) -> Tensor:
    """fairseq's input position embedding of the newest ``steps`` of ``tokens`` (B, T): (steps, B, C).
    Fewer steps than tokens is a decoding step, whose position fairseq's decoder takes from the
    length of the prefix (as its incremental state does)."""
    incremental = {} if steps < tokens.size(1) else None
    return embedding(tokens, incremental_state=incremental)[:, -steps:].transpose(0, 1)


class SinusoidalPositionEncoding(TakesRandomizedPositions, PositionEncoding):
    input_embedding = "sinusoidal"
    config = AbsoluteConfig
    default_blocks = "input"

    def use_input_embedding(self, embedding: Optional[nn.Module]):
        super().use_input_embedding(embedding)  # --randomized-positions: a learned table grown first
        # a reference, not a submodule: the embedding belongs to the stack
        self._embedding = (embedding,)
        if self.position_blocks == "all":
            check_input_embedding(embedding)
            depth = SinusoidalPositionalEmbedding.get_embedding(self.num_layers + 1, embedding.embedding_dim)
            self.register_buffer("depth", depth, persistent=False)

    def begin_forward(self, tokens, continues=False):
        super().begin_forward(tokens, continues)
        self._tokens = tokens

    def block_input(self, layer, x):
        if self.position_blocks != "all":
            return x
        depth = self.depth[layer + 1]
        if layer == 0:  # s(i) came with the input embedding
            return x + depth.to(x.dtype)
        steps = x.size(0)
        timing = self.shared(("timing", steps), lambda: newest_positions(self._embedding[0], self._tokens, steps))
        return x + (timing + depth).to(x.dtype)
