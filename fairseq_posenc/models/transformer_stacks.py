"""Encoder and decoder stacks: fairseq's, with the plugin's layers and position encoding.

Each stack owns its :class:`~fairseq_posenc.positions.PositionEncoding`, so that tables shared
by its layers live in one place (fairseq keeps the input embedding in ``embed_positions``).
"""
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from ..modules import PosencDecoderLayer, PosencEncoderLayer
from ..positions import get_position_encoding


def _wrap_layer(layer, cfg):
    # As fairseq's build_*_layer: activation checkpointing, then FSDP wrapping.
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


def _build_position_encoding(cfg, side, layers_cfg):
    heads = layers_cfg.attention_heads
    head_dim = getattr(cfg, "attention_head_dim", None) or layers_cfg.embed_dim // heads
    return get_position_encoding(cfg.position_encoding)(cfg, side, layers_cfg.layers, heads, head_dim)


class PosencTransformerEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens)
        self.position_encoding = _build_position_encoding(cfg, "encoder", cfg.encoder)

    def build_encoder_layer(self, cfg):
        return _wrap_layer(PosencEncoderLayer(cfg, return_fc=self.return_fc), cfg)


class PosencTransformerDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.position_encoding = _build_position_encoding(cfg, "decoder", cfg.decoder)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_layer(PosencDecoderLayer(cfg, no_encoder_attn), cfg)
