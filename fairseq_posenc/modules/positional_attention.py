"""The one attention module of ``transformer_posenc``, for every block and every encoding.

It subclasses fairseq's :class:`MultiheadAttention` to keep its contract and its machinery
(parameter names and initialisation, the incremental-state buffer, ``reorder_incremental_state``
and the beamable encoder-decoder cache) but runs its own forward: fairseq's forward hands most
calls to ``F.multi_head_attention_forward``, which leaves no place for a position term.
Attention runs through ``F.scaled_dot_product_attention`` unless the caller asks for the
attention weights or a scheme needs the probabilities (Shaw's value term).

What a position scheme contributes comes through the hooks of
:class:`~fairseq_posenc.positions.PositionEncoding`; the stack that owns the schemes attaches
them to its layers (:meth:`PositionalAttention.attach`).
"""
import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq import utils
from fairseq.modules import MultiheadAttention
from fairseq.modules.quant_noise import quant_noise
from torch import Tensor

from ..positions.base import AttentionPositions, cast

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


def guards_rows_without_keys(q: Tensor) -> bool:
    """Whether SDPA's rows with no visible key are zeroed by hand: on CUDA, where a kernel has
    given NaN for them; torch's CPU kernels give 0 themselves (tests/unit/test_alibi_encoder.py)."""
    return q.is_cuda


class PositionalAttention(MultiheadAttention):
    """Multi-head attention with an optional head size independent of ``embed_dim / num_heads``.

    ``head_dim`` (Bhojanapalli et al., 2020): queries, keys and values are projected to
    ``num_heads * head_dim`` and the logits are scaled by ``1 / sqrt(head_dim)``. ``None`` keeps
    fairseq's ``embed_dim // num_heads``, and then the parameters are exactly fairseq's.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        head_dim: Optional[int] = None,
        kdim: Optional[int] = None,
        vdim: Optional[int] = None,
        dropout: float = 0.0,
        bias: bool = True,
        self_attention: bool = False,
        encoder_decoder_attention: bool = False,
        q_noise: float = 0.0,
        qn_block_size: int = 8,
    ):
        if head_dim is None and embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim {embed_dim} is not divisible by {num_heads} heads; "
                "set --attention-head-dim to choose the head size"
            )
        if head_dim is not None and head_dim <= 0:
            raise ValueError(f"--attention-head-dim must be positive, got {head_dim}")
        # fairseq's constructor asserts embed_dim % num_heads == 0 even when the head size is
        # decoupled; give it a divisible shape and rebuild the projections below.
        super().__init__(
            embed_dim if embed_dim % num_heads == 0 else num_heads * head_dim,
            num_heads,
            kdim=kdim if kdim is not None else embed_dim,
            vdim=vdim if vdim is not None else embed_dim,
            dropout=dropout,
            bias=bias,
            self_attention=self_attention,
            encoder_decoder_attention=encoder_decoder_attention,
            q_noise=q_noise,
            qn_block_size=qn_block_size,
        )
        if head_dim is not None and (head_dim != self.head_dim or embed_dim != self.embed_dim):
            inner = num_heads * head_dim
            self.embed_dim, self.head_dim = embed_dim, head_dim
            self.qkv_same_dim = self.kdim == embed_dim and self.vdim == embed_dim
            self.q_proj = quant_noise(nn.Linear(embed_dim, inner, bias=bias), q_noise, qn_block_size)
            self.k_proj = quant_noise(nn.Linear(self.kdim, inner, bias=bias), q_noise, qn_block_size)
            self.v_proj = quant_noise(nn.Linear(self.vdim, inner, bias=bias), q_noise, qn_block_size)
            self.out_proj = quant_noise(nn.Linear(inner, embed_dim, bias=bias), q_noise, qn_block_size)
            self.reset_parameters()
        self.scaling = self.head_dim**-0.5
        self.inner_dim = num_heads * self.head_dim
        self.layer_idx = 0
        # The schemes belong to the stack: a plain tuple keeps them out of this module's
        # parameters and state dict.
        self.attach((), 0)

    def attach(self, terms, layer_idx: int):
        """Use the position ``terms`` (PositionEncoding modules of the owning stack) as layer
        ``layer_idx``. Each hook is called on the terms that act through it in this attention's
        role only (:meth:`PositionEncoding.acts_through`), and a call builds the positions only
        where one of them reads them: a decoding step of an input encoding (sinusoidal, learned)
        does no position work in attention at all."""
        self.position_terms = tuple(terms)
        self.layer_idx = layer_idx
        role = "self" if self.self_attention else "cross"
        self._qkv_terms = tuple(t for t in self.position_terms if t.acts_through("transform_qkv", role))
        self._bias_terms = tuple(t for t in self.position_terms if t.acts_through("attention_bias", role))
        self._value_terms = tuple(t for t in self.position_terms if t.acts_through("value_term", role))
        self._reads_positions = bool(self._qkv_terms or self._bias_terms or self._value_terms)

    def block_input(self, x: Tensor) -> Tensor:
        """The input (T, B, C) of the layer this attention opens, with what the position terms add
        to it there (:meth:`PositionEncoding.block_input`)."""
        for term in self.position_terms:
            x = term.block_input(self.layer_idx, x)
        return x

    def _split_heads(self, x: Tensor) -> Tensor:
        # (T, B, H * D) -> (B, H, T, D)
        length, batch, _ = x.shape
        return x.view(length, batch, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[IncrementalState] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Input (T, B, C); returns the output (T, B, C) and, on request, the weights:
        (H, B, T, S) with ``need_head_weights``, else averaged over heads (B, T, S)."""
        if before_softmax:
            raise ValueError("PositionalAttention does not return pre-softmax logits")
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, _ = query.shape

        saved_state = None
        if incremental_state is not None:
            saved_state = self._get_input_buffer(incremental_state)
            if static_kv and "prev_key" in saved_state:
                key = value = None  # the encoder's keys and values are cached

        q = self._split_heads(self.q_proj(query))
        k = v = None
        if self.self_attention:
            k, v = self._split_heads(self.k_proj(query)), self._split_heads(self.v_proj(query))
        elif key is not None:
            beamable = self.encoder_decoder_attention and incremental_state is not None
            if beamable and self.beam_size > 1 and key.size(1) == bsz:
                # In beam search every beam of a sentence sees the same encoder output: keep one
                # copy (fairseq's beamable attention; its reorder_incremental_state expects it).
                key = key[:, :: self.beam_size]
                value = key
                if key_padding_mask is not None:
                    key_padding_mask = key_padding_mask[:: self.beam_size]
            k, v = self._split_heads(self.k_proj(key)), self._split_heads(self.v_proj(value))

        role = "self" if self.self_attention else "cross"
        pos = None
        if self._reads_positions:
            pos = self._positions(q.size(2), k.size(2) if k is not None else 0, key_padding_mask, saved_state)
            for term in self._qkv_terms:
                q, k, v = term.transform_qkv(self.layer_idx, role, q, k, v, pos)

        if saved_state is not None:
            k, v, key_padding_mask = self._update_cache(
                incremental_state, saved_state, k, v, key_padding_mask, static_kv
            )
        assert k is not None and v is not None
        kv_bsz, src_len = k.size(0), k.size(2)

        # may_block: whether the mask can hide every key of a row (its -inf entries are where it
        # can: the causal mask, padding, a bias that masks keys), which attention must then guard
        if static_kv and saved_state is not None and attn_mask is None:
            mask, may_block = self._kept_padding_mask(incremental_state, saved_state, key_padding_mask, q.dtype,
                                                      src_len)
        else:
            mask = self._additive_mask(attn_mask, key_padding_mask, q.dtype, src_len)
            may_block = mask is not None
        for term in self._bias_terms:
            bias = term.attention_bias(self.layer_idx, q, pos)
            if bias is not None:
                bias = cast(bias, q.dtype)
                mask = bias if mask is None else mask + bias
                may_block = may_block or term.bias_masks_keys
        value_terms = self._value_terms

        # Beamable encoder-decoder attention: fold the beams into the query length so that
        # (B * beam) queries meet B keys without copying the keys.
        beams = bsz // kv_bsz
        if beams > 1:
            q = q.view(kv_bsz, beams, self.num_heads, tgt_len, self.head_dim)
            q = q.transpose(1, 2).reshape(kv_bsz, self.num_heads, beams * tgt_len, self.head_dim)
            if mask is not None and mask.size(-2) > 1:
                mask = mask.repeat(1, 1, beams, 1)

        weights = None
        # A decoding step's one query per sentence (beams folded: a few) on the CPU: matmul, softmax,
        # matmul, as fairseq's own attention computes it, costs fewer instructions than torch's CPU
        # SDPA kernel there (callgrind, medium model, 16 sentences: a beam-4 step 2.1% fewer in all,
        # a greedy one 0.5%). Elsewhere SDPA (a GPU's kernels fuse it; not measured there).
        single_query_step = incremental_state is not None and tgt_len == 1 and q.device.type == "cpu"
        if need_weights or value_terms or single_query_step:
            # (B, H, T, D) x (B, H, S, D) -> (B, H, T, S), as bmm over B * H: the views are free where
            # torch.matmul's folding of 4-d operands dispatches several operators
            queries = q.size(2)
            logits = torch.bmm((q * self.scaling).reshape(-1, queries, self.head_dim),
                               k.reshape(-1, src_len, self.head_dim).transpose(1, 2))
            logits = logits.view(kv_bsz, self.num_heads, queries, src_len)
            blocked = None
            if mask is not None and not may_block:
                logits = logits + mask
            elif mask is not None:
                # Rows whose every key is masked (a pad query of a head that sees one side,
                # ALiBi's split encoder): softmax would give NaN there, SDPA gives 0. Zero
                # logits keep NaN out of the softmax and its backward; only the mask decides
                # which rows, so a NaN from diverging logits still shows everywhere else.
                blocked = torch.isneginf(mask).all(dim=-1, keepdim=True)
                logits = (logits + mask).masked_fill(blocked, 0.0)
            weights = utils.softmax(logits, dim=-1)  # float32, as fairseq
            if blocked is not None:
                weights = weights.masked_fill(blocked, 0.0)
            probs = self.dropout_module(cast(weights, logits.dtype))
            out = torch.bmm(probs.reshape(-1, queries, src_len), v.reshape(-1, src_len, self.head_dim))
            out = out.view(kv_bsz, self.num_heads, queries, self.head_dim)
            for term in value_terms:
                out = out + term.value_term(self.layer_idx, probs, pos)
        else:
            blocked = None
            if may_block and guards_rows_without_keys(q):
                # torch's memory-efficient CUDA kernel has returned NaN for a row whose every
                # key is masked (pytorch/pytorch#110213) where the CPU kernels return 0, and
                # 0 x NaN is NaN in every later layer: no kernel sees such a row, and its
                # output is 0, as on CPU. Not verified on a GPU here (none was lent).
                blocked = torch.isneginf(mask).all(dim=-1, keepdim=True)
                mask = mask.masked_fill(blocked, 0.0)
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=self.dropout_module.p if self.training else 0.0,
                scale=self.scaling,
            )
            if blocked is not None:
                out = out.masked_fill(blocked, 0.0)

        if beams > 1:
            # (B, H, beam * T, D) -> (T, B * beam, H * D): one copy
            out = out.view(kv_bsz, self.num_heads, beams, tgt_len, self.head_dim).permute(3, 0, 2, 1, 4)
            if weights is not None:
                weights = weights.view(kv_bsz, self.num_heads, beams, tgt_len, src_len)
                weights = weights.transpose(1, 2).reshape(bsz, self.num_heads, tgt_len, src_len)
        else:
            # (B, H, T, D) -> (T, B, H, D)
            out = out.permute(2, 0, 1, 3)
        out = self.out_proj(out.reshape(tgt_len, bsz, self.inner_dim))

        if not need_weights:
            weights = None
        elif weights is not None:
            weights = weights.transpose(0, 1)  # (H, B, T, S)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return out, weights

    def _positions(self, tgt_len: int, new_keys: int, key_padding_mask: Optional[Tensor],
                   saved_state: Optional[Dict[str, Optional[Tensor]]]) -> AttentionPositions:
        """Positions of this call. Self-attention: the queries are the newest of the keys (the
        decoder's cache holds the earlier ones). Cross-attention: the encoder's tokens."""
        device, scheme = self.q_proj.weight.device, self.position_terms[0]
        if self.self_attention:
            cached = saved_state["prev_key"].size(2) if saved_state and "prev_key" in saved_state else 0
            src_len = cached + tgt_len
            mask = key_padding_mask if key_padding_mask is not None and key_padding_mask.size(1) == src_len else None
            return scheme.positions("self", tgt_len, src_len, mask, device)
        return scheme.positions("cross", new_keys, new_keys, key_padding_mask if new_keys else None, device)

    def _update_cache(
        self,
        incremental_state: IncrementalState,
        saved_state: Dict[str, Optional[Tensor]],
        k: Optional[Tensor],
        v: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        static_kv: bool,
    ):
        """Append this step's keys and values to fairseq's incremental buffer (B, H, S, D)."""
        if "prev_key" in saved_state:
            if static_kv:
                k, v = saved_state["prev_key"], saved_state["prev_value"]
            else:
                k = torch.cat([saved_state["prev_key"], k], dim=2)
                v = torch.cat([saved_state["prev_value"], v], dim=2)
        key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
            key_padding_mask=key_padding_mask,
            prev_key_padding_mask=saved_state.get("prev_key_padding_mask"),
            batch_size=k.size(0),
            src_len=k.size(2),
            static_kv=static_kv,
        )
        saved_state["prev_key"], saved_state["prev_value"] = k, v
        saved_state["prev_key_padding_mask"] = key_padding_mask
        self._set_input_buffer(incremental_state, saved_state)
        return k, v, key_padding_mask

    def _kept_padding_mask(self, incremental_state: IncrementalState, saved_state: Dict[str, Optional[Tensor]],
                           key_padding_mask: Optional[Tensor], dtype: torch.dtype, src_len: int):
        """(the additive mask of encoder-decoder attention in a decode, whether it can hide a whole
        row): built at the decode's first step and kept in the incremental state beside the keys,
        so that fairseq's ``reorder_incremental_state`` reorders (or, beamable, keeps) it with them.
        None where no source is padded (adding zeros changes nothing). A source of padding alone
        would leave its rows no key: such a mask is not kept, and each step builds and guards it."""
        if "key_padding_bias" in saved_state:
            mask = saved_state["key_padding_bias"]
            if mask is None or (mask.dtype == dtype and mask.size(-1) == src_len):
                return mask, False
        if key_padding_mask is None or not bool(key_padding_mask.any()):
            mask = None
        elif bool(key_padding_mask.to(torch.bool).all(-1).any()):
            return self._additive_mask(None, key_padding_mask, dtype, src_len), True
        else:
            mask = self._additive_mask(None, key_padding_mask, dtype, src_len)
        saved_state["key_padding_bias"] = mask
        self._set_input_buffer(incremental_state, saved_state)
        return mask, False

    @staticmethod
    def _additive_mask(
        attn_mask: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        dtype: torch.dtype,
        src_len: int,
    ) -> Optional[Tensor]:
        """One additive float mask, broadcastable to (B, H, T, S), or None.

        ``attn_mask`` is (T, S), boolean (True = blocked) or additive; ``key_padding_mask`` is
        (B, S), True or 1 at padding (fairseq's cache turns it into floats).
        """
        mask = None
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                attn_mask = torch.zeros_like(attn_mask, dtype=dtype).masked_fill(attn_mask, -math.inf)
            mask = attn_mask.to(dtype)[None, None]
        if key_padding_mask is not None:
            assert key_padding_mask.size(1) == src_len
            pad = key_padding_mask.to(torch.bool)[:, None, None, :]
            pad = torch.zeros(pad.shape, dtype=dtype, device=pad.device).masked_fill(pad, -math.inf)
            mask = pad if mask is None else mask + pad
        return mask
