"""fairseq's Transformer layers with :class:`PositionalAttention` in every attention block.

Only the ``build_*_attention`` extension points change, and the input of each layer passes
through its schemes' ``block_input`` first (an encoder at every block adds p^(n) there); fairseq's
layer ``forward`` (residuals, layer norms, dropout, fairseq's incremental-state handling) is used
as it is.
"""
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from .positional_attention import PositionalAttention


def _attention(layer, cfg, embed_dim: int, num_heads: int, **kwargs) -> PositionalAttention:
    return PositionalAttention(
        embed_dim,
        num_heads,
        head_dim=getattr(cfg, "attention_head_dim", None),
        dropout=cfg.attention_dropout,
        q_noise=layer.quant_noise,
        qn_block_size=layer.quant_noise_block_size,
        **kwargs,
    )


class PosencEncoderLayer(TransformerEncoderLayerBase):
    def forward(self, x, encoder_padding_mask, attn_mask=None):
        return super().forward(self.self_attn.block_input(x), encoder_padding_mask, attn_mask)

    def build_self_attention(self, embed_dim, cfg):
        return _attention(self, cfg, embed_dim, cfg.encoder.attention_heads, self_attention=True)


class PosencDecoderLayer(TransformerDecoderLayerBase):
    def forward(self, x, *args, **kwargs):
        return super().forward(self.self_attn.block_input(x), *args, **kwargs)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if add_bias_kv or add_zero_attn or cfg.cross_self_attention:
            raise ValueError(
                "transformer_posenc does not support --cross-self-attention or "
                "bias/zero key-value attention in the decoder"
            )
        return _attention(self, cfg, embed_dim, cfg.decoder.attention_heads, self_attention=True)

    def build_encoder_attention(self, embed_dim, cfg):
        return _attention(
            self,
            cfg,
            embed_dim,
            cfg.decoder.attention_heads,
            kdim=cfg.encoder.embed_dim,
            vdim=cfg.encoder.embed_dim,
            encoder_decoder_attention=True,
        )
