"""Randomized positions (Ruoss et al., 2023): an option of the encodings that read absolute positions.

With ``--randomized-positions`` a sentence of n real tokens is given, in place of the positions
0 .. n-1, an ordered random sample p_0 < ... < p_{n-1} of n distinct integers from [0, L), L =
``--randomized-max-position`` (the paper's 2048): the n smallest of L keys drawn per sentence,
sorted. The paper's models are encoders (non-causal, the whole output at once), which draw in
training and at test time (google-deepmind/randomized_positional_encodings#1: "we also randomize at
test time"); so does the encoder here, its closest form, and every layer of the stack uses its draw.
The decoder reads 0 .. n-1: a step-by-step decode fixes the positions of the prefix before its
length is known, so it cannot draw as in training. ``--randomized-decoder`` (a labelled variant)
trains the decoder on its own draws too and still decodes it at 0 .. n-1, positions it never
trained on (docs/encodings.md has what that does on the toy pair).

The keys are a hash, not a random generator's stream: of fairseq's ``--seed``, the update number
(evaluation: one fixed stream), the side, L, the key's index j and the sentence's real tokens. A
sentence's positions thus do not depend on its batch, its padding, or the process that holds it, so
two processes train as one, and a decode is the same on any batching.

Which encodings take it is declared by their ``config`` (:class:`RandomizedConfig` among its bases):
sinusoidal and learned (fairseq's input embedding, and the tables of ``--position-blocks all``) and
rope (the rotation angles). The others are refused in one line (``config.refuse_unused_flags``).
"""
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn
from fairseq.modules import LearnedPositionalEmbedding, SinusoidalPositionalEmbedding
from torch import Tensor

from ..compat import PosencError
from .float_bounds import longest_positions
from .values import Values

#: the paper's L (its experiments and its reference code's ``noise_max_length``)
PAPER_MAX_POSITION = 2048
#: above it the keys of one batch ((sentences, L) int64) outgrow a forward's other tensors
MAX_POSITION_HIGH = 65536
_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
#: the modulus of a sentence's hash (a prime below 2^31: products stay inside int64)
_PRIME = 2 ** 31 - 1
_BASE = 1_000_003
_SIDES = {"encoder": 1, "decoder": 2}
#: the update number of evaluation's stream (training counts from 0)
EVALUATION = -1


@dataclass
class RandomizedConfig:
    """The flags of randomized positions, a base of each ``config`` of an encoding that takes them."""

    randomized_positions: bool = field(default=False, metadata={
        "label": "randomized positions",
        "help": "sinusoidal, learned, rope: the encoder reads an ordered random sample of positions from "
                "[0, L), in training and evaluation (Ruoss et al., 2023)"})
    randomized_decoder: bool = field(default=False, metadata={
        "label": "decoder too",
        "needs": "randomized_positions",
        "before": True,  # a checkpoint saved before this flag: its decoder drew in training
        "help": "--randomized-positions in the decoder's training too (a variant: its decode reads 0 .. n-1, "
                "which it never trained on)"})
    randomized_max_position: int = field(default=PAPER_MAX_POSITION, metadata={
        "label": "randomized L {}",
        "needs": "randomized_positions",
        "values": Values(low=longest_positions, high=MAX_POSITION_HIGH,
                         why="L holds the longest input (--max-source/target-positions); each sentence draws L keys"),
        "help": "L of --randomized-positions: positions are drawn from [0, L) (the paper's 2048)"})


def _mul32(x: Tensor, c: int) -> Tensor:
    """x * c mod 2^32 for 0 <= x < 2^32, in int64 without overflow (c in 16-bit halves)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def mix32(x):
    """A 32-bit integer hash (Wellons' lowbias32), of a Python int or an int64 tensor of them."""
    if isinstance(x, int):
        x &= _M32
        x ^= x >> 16
        x = (x * 0x7FEB352D) & _M32
        x ^= x >> 15
        x = (x * 0x846CA68B) & _M32
        return x ^ (x >> 16)
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def stream(seed: int, step: int, side: str, max_position: int) -> int:
    """The key stream of one update (or of evaluation) on one side, for one range (another L, other
    keys: not the same sample with one more position)."""
    return mix32(mix32(mix32(mix32(seed) ^ (step & _M32)) ^ _SIDES[side]) ^ max_position)


def sentence_hash(tokens: Tensor, real: Tensor) -> Tensor:
    """(B,) sum over the real tokens of token * BASE^k mod PRIME, k counting real tokens from 0: the
    same for a sentence whatever its padding."""
    k = real.long().cumsum(1) - 1
    powers = torch.tensor([pow(_BASE, i, _PRIME) for i in range(tokens.size(1))], device=tokens.device)
    terms = (tokens.long() % _PRIME) * powers[k.clamp(min=0)] % _PRIME
    return (terms * real).sum(1) % _PRIME


def draw(tokens: Tensor, padding_idx: int, max_position: int, seed: int, step: int, side: str) -> Tensor:
    """(B, T) sampled positions: the k-th real token of each sentence gets the k-th smallest of its
    sample of n distinct integers from [0, ``max_position``) (n: its real tokens); pads get -1."""
    real = tokens.ne(padding_idx)
    length = tokens.size(1)
    if length > max_position:
        raise PosencError(f"{side} input of length {length} exceeds the {max_position} positions that "
                          f"--randomized-max-position draws from; raise it")
    s = stream(seed, step, side, max_position)
    h = mix32(sentence_hash(tokens, real) ^ s)  # (B,)
    j = torch.arange(max_position, device=tokens.device)
    keys = mix32((h[:, None] + j[None, :] * _GOLDEN) & _M32) * max_position + j  # distinct: ties cannot reorder
    chosen = keys.topk(length, dim=1, largest=False).indices  # the T smallest keys, in order
    n = real.sum(1, keepdim=True)
    columns = torch.arange(length, device=tokens.device)[None, :]
    # the first n of a row are a uniform n-subset; sort them, the rest after them
    sample = torch.where(columns < n, chosen, max_position).sort(dim=1).values
    k = real.long().cumsum(1) - 1
    return torch.where(real, sample.gather(1, k.clamp(min=0)), -1)


class RandomizedPositions(nn.Module):
    """A stack's draw of randomized positions (no parameters: the state dict does not change)."""

    def __init__(self, cfg, side: str):
        super().__init__()
        self.side = side
        self.max_position = int(cfg.randomized_max_position)
        self.seed = int(getattr(cfg, "seed", 1) or 0)
        self._step = 0

    def start_update(self, num_updates: int):
        """Called before each of fairseq's updates (:mod:`fairseq_posenc.update_hooks`)."""
        self._step = int(num_updates)

    def positions(self, tokens: Tensor, padding_idx: int) -> Optional[Tensor]:
        """(B, T) this forward's positions from 0 (pads -1), or None where the stack reads 0 .. n-1
        (the decoder in evaluation)."""
        if not self.training and self.side == "decoder":
            return None
        step = self._step if self.training else EVALUATION
        return draw(tokens, padding_idx, self.max_position, self.seed, step, self.side)


def build(cfg, side: str) -> Optional[RandomizedPositions]:
    """The scheme's sampler where ``cfg`` asks for randomized positions on ``side`` (the encoder; the
    decoder with ``--randomized-decoder`` too), else None (a range given without them is refused with
    the unused flags: its field ``needs`` the switch)."""
    if not getattr(cfg, "randomized_positions", False):
        return None
    if side == "decoder" and not getattr(cfg, "randomized_decoder", False):
        return None
    return RandomizedPositions(cfg, side)


# fairseq's input embeddings, reading the drawn positions where a stack set them (``drawn``: fairseq's
# position numbers, padding_idx + 1 + p; pads padding_idx); a decoding step reads fairseq's own
class RandomizedSinusoidal(SinusoidalPositionalEmbedding):
    drawn: Optional[Tensor] = None
    #: the rows the drawn positions may read: padding_idx + 1 + L (set with ``drawn``)
    rows: int = 0

    def forward(self, input, incremental_state=None, timestep=None, positions=None):
        if self.drawn is None or incremental_state is not None:
            return super().forward(input, incremental_state, timestep, positions)
        if self.rows > self.weights.size(0):  # the whole range, once (no host sync per forward)
            self.weights = SinusoidalPositionalEmbedding.get_embedding(
                self.rows, self.embedding_dim, self.padding_idx).to(self.weights)
        bsz, seq_len = self.drawn.shape
        return self.weights.index_select(0, self.drawn.reshape(-1)).view(bsz, seq_len, -1).detach()


class RandomizedLearned(LearnedPositionalEmbedding):
    drawn: Optional[Tensor] = None

    def forward(self, input, incremental_state=None, positions=None):
        if self.drawn is None or incremental_state is not None:
            return super().forward(input, incremental_state, positions)
        return nn.functional.embedding(self.drawn, self.weight, self.padding_idx)


_RANDOMIZED = {SinusoidalPositionalEmbedding: RandomizedSinusoidal, LearnedPositionalEmbedding: RandomizedLearned}


def randomize(embedding: nn.Module) -> nn.Module:
    """Make fairseq's input embedding ``embedding`` read drawn positions (same class otherwise, same
    state dict keys)."""
    embedding.__class__ = _RANDOMIZED.get(type(embedding), type(embedding))
    return embedding


def grow_learned(embedding: LearnedPositionalEmbedding, max_position: int):
    """A learned table over L = ``max_position`` positions (fairseq's covers --max-*-positions):
    (L - max positions) x d parameters more, initialised as fairseq initialises it."""
    if embedding.max_positions >= max_position:
        return
    rows = max_position + embedding.padding_idx + 1
    weight = torch.empty(rows, embedding.embedding_dim, device=embedding.weight.device, dtype=embedding.weight.dtype)
    nn.init.normal_(weight, mean=0, std=embedding.embedding_dim ** -0.5)
    nn.init.constant_(weight[embedding.padding_idx], 0)
    embedding.weight = nn.Parameter(weight)
    embedding.num_embeddings = rows
    embedding.max_positions = max_position


def fairseq_numbers(drawn: Tensor, padding_idx: int) -> Tensor:
    """Drawn positions from 0 (pads -1) as fairseq's position numbers: the unrandomized first token
    is padding_idx + 1."""
    return torch.where(drawn >= 0, drawn + padding_idx + 1, padding_idx)


class TakesRandomizedPositions:
    """Mixin of an encoding that takes ``--randomized-positions`` (a base before
    :class:`~.base.PositionEncoding`; its ``config`` has :class:`RandomizedConfig` among its bases).
    Each forward draws the stack's positions (``_drawn``: (B, T) from 0, pads -1; None where the stack
    reads 0 .. n-1) and hands them to fairseq's input embedding and the scheme's own tables."""

    #: fairseq's padding index (its dictionaries' pad), taken from the input embedding where there is one
    padding_idx = 1

    def __init__(self, cfg, side, *args, **kwargs):
        super().__init__(cfg, side, *args, **kwargs)
        # a subclass whose config does not take them (xpos of rope) reads 0 .. n-1
        self.randomized = build(cfg, side) if issubclass(self.config, RandomizedConfig) else None
        self._drawn: Optional[Tensor] = None
        self._readers = ()

    def use_input_embedding(self, embedding):
        """Called first by the scheme's own (which builds its tables after it, from the grown one)."""
        if self.randomized is not None and embedding is not None:
            if isinstance(embedding, LearnedPositionalEmbedding):
                grow_learned(embedding, self.randomized.max_position)
            self.padding_idx = embedding.padding_idx
        self._readers = (embedding,) if embedding is not None else ()
        super().use_input_embedding(embedding)

    def begin_forward(self, tokens, continues=False):
        super().begin_forward(tokens, continues)
        if self.randomized is None:
            return
        self._drawn = None if continues else self.randomized.positions(tokens, self.padding_idx)
        numbers = None if self._drawn is None else fairseq_numbers(self._drawn, self.padding_idx)
        for reader in (*self._readers, *getattr(self, "block_tables", ())):
            randomize(reader).drawn = numbers
            reader.rows = self.padding_idx + 1 + self.randomized.max_position
