"""fairseq's Transformer layers with :class:`PositionalAttention` in every attention block.

Only the ``build_*_attention`` extension points change; fairseq's layer ``forward`` (residuals,
layer norms, dropout, fairseq's incremental-state handling) is used as it is.
"""
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from .positional_attention import PositionalAttention


def _head_dim(cfg):
    return getattr(cfg, "attention_head_dim", None)


class PosencEncoderLayer(TransformerEncoderLayerBase):
    def build_self_attention(self, embed_dim, cfg):
        return PositionalAttention(
            embed_dim,
            cfg.encoder.attention_heads,
            head_dim=_head_dim(cfg),
            dropout=cfg.attention_dropout,
            self_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
        )


class PosencDecoderLayer(TransformerDecoderLayerBase):
    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if add_bias_kv or add_zero_attn or cfg.cross_self_attention:
            raise ValueError(
                "transformer_posenc does not support --cross-self-attention or "
                "bias/zero key-value attention in the decoder"
            )
        return PositionalAttention(
            embed_dim,
            cfg.decoder.attention_heads,
            head_dim=_head_dim(cfg),
            dropout=cfg.attention_dropout,
            self_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
        )

    def build_encoder_attention(self, embed_dim, cfg):
        return PositionalAttention(
            embed_dim,
            cfg.decoder.attention_heads,
            head_dim=_head_dim(cfg),
            kdim=cfg.encoder.embed_dim,
            vdim=cfg.encoder.embed_dim,
            dropout=cfg.attention_dropout,
            encoder_decoder_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
        )
