from .positional_attention import PositionalAttention
from .transformer_layers import PosencDecoderLayer, PosencEncoderLayer

__all__ = ["PositionalAttention", "PosencDecoderLayer", "PosencEncoderLayer"]
