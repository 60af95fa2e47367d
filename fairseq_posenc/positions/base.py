"""The interface every position encoding implements, and what attention tells it.

A scheme is a small module owned by one Transformer stack (encoder or decoder). It may

- keep fairseq's own input position embedding (``input_embedding``),
- change the new queries, keys and values of an attention call before they are cached
  (``transform_qkv``: rotary embeddings, FLOATER's projection biases),
- add a per-head bias to the self-attention logits (``attention_bias``: DIET, T5, ALiBi, Shaw's
  key term),
- add a term computed from the attention probabilities to the output (``value_term``: Shaw),
- add a position term p^(n) to the input of block n (``block_input``: the additive encoders at
  every block, ``--position-blocks all``; FLOATER's Table 2).

The stack calls ``begin_forward`` once per forward (each decoding step is a forward) and hands
the scheme to every attention layer; the layers call the hooks with their index and an
:class:`AttentionPositions`. Tables that do not depend on the input are built once per forward
for all layers that share them (``shared``), and kept across forwards while no gradient is
recorded and neither the parameters nor the module's settings, device or dtype have changed
(``table``; :mod:`.kept` says how that is decided), which is what decoding needs.
"""
import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Callable, Dict, Hashable, Optional, Tuple

import torch
import torch.nn as nn
from fairseq.dataclass import ChoiceEnum
from torch import Tensor

from ..compat import PosencError
from . import values
from .kept import ForgetsKeptOnCopy, KeptFrom, kept_key

#: --position-encoding NAME -> its scheme, filled by the registry (positions/__init__.py) as it
#: loads them: what a module below the registry (a flag's bound) looks a scheme up in
REGISTERED: Dict[str, type] = {}

#: the attribute of a model's configuration that says it is rebuilt from a checkpoint's saved
#: configuration (set by the models layer through fairseq's ``arg_overrides``), not from a training
#: run's command line: encodings read it from the configuration they are built with
FROM_CHECKPOINT = "posenc_from_checkpoint"

#: positions a table covers at least when it is kept for decoding
MIN_TABLE = 64

POSITION_BLOCKS = ("input", "all")


@dataclass
class PositionBlocksConfig:
    """The flag of the encoders that can act at the input block only or at every block."""

    position_blocks: Optional[ChoiceEnum(list(POSITION_BLOCKS))] = field(
        default=None,
        metadata={"label": "blocks {}",
                  "help": "sinusoidal, learned, floater, rnn: the position encoder at the first block of each stack "
                  "only (input) or at every block (all: FLOATER's Table 2). Default: the encoding's own"},
    )


@dataclass
class AttentionPositions:
    """Where the queries and keys of one attention call sit.

    ``q`` (B or 1, T) and ``k`` (B or 1, S) count real tokens from 0 in each sentence: fairseq
    left-pads sources, so in a padded batch these differ from the column index (pads get 0).
    ``q_frame`` (T,) and ``k_frame`` (S,) are column indices in the padded frame, including the
    decoding-step offset. Left padding shifts a sentence's queries and keys alike, so relative
    schemes use the frame and stay independent of the batch. ``padded`` is False when ``q`` and
    ``k`` equal the frame.
    """

    q: Tensor
    k: Tensor
    q_frame: Tensor
    k_frame: Tensor
    padded: bool

    @staticmethod
    def build(tgt_len: int, src_len: int, key_padding_mask: Optional[Tensor], device) -> "AttentionPositions":
        """Queries are the last ``tgt_len`` of the ``src_len`` keys (self-attention)."""
        k_frame = torch.arange(src_len, device=device)
        q_frame = k_frame[src_len - tgt_len:]
        padded = key_padding_mask is not None and bool(key_padding_mask[:, 0].any())
        if padded:
            k = (~key_padding_mask.to(torch.bool)).long().cumsum(-1).sub_(1).clamp_(min=0)
            return AttentionPositions(k[:, src_len - tgt_len:], k, q_frame, k_frame, True)
        return AttentionPositions(q_frame[None], k_frame[None], q_frame, k_frame, False)

    @property
    def key(self) -> Tuple[int, int, int]:
        """Identifies the frame within one forward: (offset, T, S)."""
        return int(self.k_frame.numel() - self.q_frame.numel()), self.q_frame.numel(), self.k_frame.numel()


@functools.lru_cache(maxsize=None)
def at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """The dtype position terms are computed in: float32, or the model's if wider. Under
    --fp16/--bf16 they are computed in float32 and cast where attention adds them. (Remembered per
    dtype: attention asks in every layer of every decoding step.)"""
    return torch.promote_types(dtype, torch.float32)


def cast(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x.to(dtype)``, without dispatching an operator when ``x`` already has it (the common
    float32 case, in every layer of every decoding step)."""
    return x if x.dtype == dtype else x.to(dtype)


def gather_square(table: Tensor, pos: AttentionPositions) -> Tensor:
    """Per-head bias over absolute positions: ``table`` (H, L, L) -> (B or 1, H, T, S)."""
    if not pos.padded:
        start, t, s = pos.key
        return table[:, start:start + t, :s].unsqueeze(0)
    # (H, B, T, S) -> (B, H, T, S)
    return table[:, pos.q[:, :, None], pos.k[:, None, :]].transpose(0, 1)


class PositionEncoding(ForgetsKeptOnCopy, nn.Module):
    #: fairseq input embedding added to the token embeddings: "sinusoidal", "learned" or None
    input_embedding: Optional[str] = None
    #: False where the scheme has a table fixed in size when the model is built: inputs longer
    #: than --max-source/target-positions are refused in ``begin_forward``
    extrapolates: bool = True
    #: True where ``value_term`` needs the attention probabilities (no fused attention kernel)
    needs_attention_weights: bool = False
    #: True where ``attention_bias`` can hide keys with -inf (ALiBi's split encoder): only then can
    #: the bias leave a query row with no visible key, which attention must then guard
    bias_masks_keys: bool = False
    #: the dataclass holding the scheme's own flags (None: no flags)
    config = None
    #: where the position encoder acts when --position-blocks is not given ("input" or "all");
    #: None where the flag has no meaning (the encoding lives inside attention, or is absent)
    default_blocks: Optional[str] = None
    #: True where the scheme keeps a table (``table``, ``relative_bias``) or a solution between
    #: no-grad forwards (decoding), which :mod:`.kept` keys by settings, device and dtype
    keeps_tables: bool = False
    #: False where what the scheme adds depends on |i - j| only (or on nothing): the encoder then
    #: encodes a reversed sentence as the reversed encoding (a bag of words, symmetric ALiBi)
    tells_left_from_right: bool = True

    def __init__(self, cfg, side: str, num_layers: int, num_heads: int, head_dim: int):
        super().__init__()
        if side not in ("encoder", "decoder"):
            raise ValueError(f"side must be 'encoder' or 'decoder', got {side!r}")
        self.side = side
        self.causal = side == "decoder"
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.max_positions = getattr(cfg, "max_source_positions" if side == "encoder" else "max_target_positions", None)
        self.length_flag = "--max-source-positions" if side == "encoder" else "--max-target-positions"
        if self.config is not None:  # a scheme built by hand: a model checked them before (values.py)
            values.check(dataclasses.fields(self.config), cfg)
        self._forget_kept()
        # where the module lives, for the key of its kept tables (a scheme may have no parameters)
        self.register_buffer("_placement", torch.zeros(()), persistent=False)
        #: the value of each of the scheme's options (its ``config``'s fields) it was built with, as
        #: given (None: left to the scheme, :meth:`published_options`); the label of a report is
        #: derived from them (:mod:`fairseq_posenc.labels`)
        self.options = {f.name: getattr(cfg, f.name, f.default)
                        for f in (dataclasses.fields(self.config) if self.config else ())}
        blocks = getattr(cfg, "position_blocks", None)
        #: "input" or "all" (see ``default_blocks``)
        self.position_blocks = blocks or self.default_blocks

    def published_options(self) -> Dict[str, object]:
        """The published value of each option whose default (None) the scheme resolves itself, as
        it resolves it (Shaw's ``max_relative_distance`` 16, DIET-ABS's ``diet_rank`` the head size).
        Options absent here are published at their field's default."""
        return {"position_blocks": self.default_blocks} if "position_blocks" in self.options else {}

    def option(self, name: str):
        """Option ``name`` as the scheme uses it: as given, or its published value."""
        value = self.options[name]
        return self.published_options()[name] if value is None else value

    def carried_options(self) -> Dict[str, object]:
        """Option values the loaded weights carry (buffers, extra state), which the label takes over
        the configuration: a run resumed or a checkpoint rebuilt with other flags keeps what its
        weights were trained with (ALiBi's encoder form, the bias scale, FLOATER's N and C)."""
        return {}

    # hooks; the defaults do nothing
    @classmethod
    def finish_model(cls, model, args):
        """Called once the whole model is built: hands each stack's scheme its input embedding, links
        the decoder's scheme to the encoder's."""
        for stack in (model.encoder, model.decoder):
            stack.position_encoding.use_input_embedding(stack.embed_positions)
        model.decoder.position_encoding.tie(model.encoder.position_encoding)

    def use_input_embedding(self, embedding: Optional[nn.Module]):
        """Given fairseq's input position embedding of the owning stack (None without one), the
        module that computes block 1's p (an encoder at every block computes the later ones alike)."""

    def tie(self, encoder_scheme: "PositionEncoding"):
        """On the decoder's scheme, with the encoder's: share what the two should share."""

    def begin_forward(self, tokens: Tensor, continues: bool = False):
        """Called by the stack with its input tokens (B, T) before its layers run. ``continues``:
        this forward is a later step of a step-by-step decode (fairseq's incremental state is not
        empty), whose parameters are those of its first step."""
        if not self.extrapolates:
            self.check_length(tokens.size(1), self.max_positions, self.length_flag)
        self._forward_cache.clear()
        # a later step of a decode keeps the check of its first step: nothing can change the
        # parameters in between without breaking fairseq's cached keys anyway (.kept)
        self._tables_checked = continues and self._tables_checked
        self._continues = continues

    #: the hooks attention calls with :class:`AttentionPositions`; attention calls a hook only on
    #: the schemes that act through it (:meth:`acts_through`)
    ATTENTION_HOOKS = ("transform_qkv", "attention_bias", "value_term")

    def acts_through(self, hook: str, role: str) -> bool:
        """Whether ``hook`` (one of :attr:`ATTENTION_HOOKS`) can change anything in ``role``
        attention ("self" or "cross"), so that attention skips the rest and builds no positions for
        a call in which no scheme reads them. Derived from the class: a hook acts where the class
        overrides it, ``attention_bias`` and ``value_term`` in self-attention only (attention adds
        them there alone), ``value_term`` where the scheme needs the attention weights. A scheme
        whose ``transform_qkv`` acts in one role only narrows it here
        (tests/unit/test_position_schemes.py checks every registered scheme's answer against what its
        hooks do)."""
        overridden = getattr(type(self), hook) is not getattr(PositionEncoding, hook)
        if hook == "transform_qkv":
            return overridden
        if hook == "value_term":
            overridden = overridden and self.needs_attention_weights
        return overridden and role == "self"

    def transform_qkv(self, layer: int, role: str, q: Tensor, k: Optional[Tensor], v: Optional[Tensor],
                      pos: AttentionPositions):
        """New queries (B, H, T, D) and keys/values (B, H, T_new, D) before they are cached.
        ``role`` is "self" or "cross"; ``k``/``v`` are None when cross-attention reuses its cache."""
        return q, k, v

    def attention_bias(self, layer: int, q: Tensor, pos: AttentionPositions) -> Optional[Tensor]:
        """Additive bias (B or 1, H, T, S) on the scaled self-attention logits, or None."""
        return None

    def value_term(self, layer: int, probs: Tensor, pos: AttentionPositions) -> Optional[Tensor]:
        """A term added to the self-attention output (B, H, T, D), from probabilities (B, H, T, S)."""
        return None

    def block_input(self, layer: int, x: Tensor) -> Tensor:
        """Phi^(n)(x) of block n = ``layer`` + 1: the input ``x`` (T, B, C) of the layer, the
        residual stream entering it (in a decoding step: its newest T positions), with p^(n) added,
        or ``x`` itself. Block 1's p^(1) is fairseq's input embedding, added before the layers."""
        return x

    # caching
    def _forget_kept(self):
        self._forward_cache: Dict[Hashable, Tensor] = {}
        # name -> (table, positions it covers), computed from the tensors ``_kept_from`` remembers
        self._tables: Dict[Hashable, Tuple[Tensor, int]] = {}
        self._kept_from = KeptFrom()
        self._tables_checked = False
        self._continues = False

    def kept_key(self):
        """What the kept tables were built for besides the parameters: this module's settings, its
        device and dtype (:func:`.kept.kept_key`)."""
        return kept_key(self, self._placement.device, self._placement.dtype)

    def _table_inputs(self):
        """What kept tables are computed from: the parameters, and the buffers that say where
        the module lives (ALiBi's slopes)."""
        return list(self.parameters()) + list(self.buffers())

    def _check_kept_tables(self):
        """Drop the kept tables if the parameters or the key changed since they were built: once
        per forward (neither changes within one)."""
        if self._tables_checked:
            return
        key, inputs = self.kept_key(), self._table_inputs()
        if not self._kept_from.still_current(key, inputs, contents=not self._continues):
            self._tables.clear()
            self._kept_from.remember(key, inputs)
        self._tables_checked = True

    def shared(self, key: Hashable, compute: Callable[[], Tensor]) -> Tensor:
        """``compute()`` once per forward (``begin_forward`` starts one) for every layer asking
        with the same ``key``."""
        key = (key, torch.is_grad_enabled())
        if key not in self._forward_cache:
            self._forward_cache[key] = compute()
        return self._forward_cache[key]

    def table(self, name: Hashable, length: int, compute: Callable[[int], Tensor],
              max_length: Optional[int] = None) -> Tensor:
        """A table over ``length`` (or more, up to ``max_length``) positions from ``compute(n)``.

        Recomputed for each forward while gradients are recorded (training); otherwise kept and
        grown by doubling, so that decoding step by step builds it a few times, not every step.
        """
        if torch.is_grad_enabled():
            return self.shared(("table", name, length), lambda: compute(length))
        self._check_kept_tables()
        cached = self._tables.get(name)
        if cached is None or cached[1] < length:
            size = max(length, 2 * cached[1] if cached is not None else MIN_TABLE)
            size = min(size, max_length) if max_length else size
            cached = (compute(size), size)
            self._tables[name] = cached
        return cached[0]

    def relative_bias(self, name: Hashable, pos: AttentionPositions,
                      per_offset: Callable[[Tensor], Tensor]) -> Tensor:
        """(1, H, T, S) bias from ``per_offset(offsets) -> (H, len(offsets))``, where an offset
        is key position minus query position (T5's convention), built once per forward."""
        device = pos.k_frame.device

        def build():
            table = self.table(name, pos.k_frame.numel(),
                               lambda n: per_offset(torch.arange(-(n - 1), n, device=device)))
            centre = (table.size(1) - 1) // 2
            offset, t, s = pos.key
            if t == 1:
                # a decoding step: its offsets -(S - 1) .. 0 are a slice of the table, a view
                return table[:, centre - offset:centre - offset + s].unsqueeze(0).unsqueeze(2)
            # (T, S) offsets -> (H, T, S)
            return table[:, pos.k_frame[None, :] - pos.q_frame[:, None] + centre].unsqueeze(0)

        return self.shared((name,) + pos.key, build)

    def positions(self, role: str, tgt_len: int, src_len: int, key_padding_mask: Optional[Tensor],
                  device) -> AttentionPositions:
        """:meth:`AttentionPositions.build`, once per forward for all layers: they see the same
        lengths and the same padding mask. The cache keeps the mask itself, so that its id
        cannot name another mask while the entry lives."""
        def build():
            return key_padding_mask, AttentionPositions.build(tgt_len, src_len, key_padding_mask, device)

        return self.shared(("positions", role, tgt_len, src_len, id(key_padding_mask)), build)[1]

    def check_length(self, length: int, limit: int, flag: str):
        if length > limit:
            raise PosencError(
                f"{self.side} input of length {length} exceeds the {limit} positions this "
                f"{type(self).__name__} was built with ({flag}); it cannot extrapolate past them"
            )
