"""The registry of position encodings: one file per scheme, one line here per scheme.

``--position-encoding NAME`` picks ``POSITION_ENCODINGS[NAME]``; the model, its stacks and its
attention layers only ever talk to the :class:`PositionEncoding` interface.
"""
from .base import PositionEncoding
from .learned import LearnedPositionEncoding
from .sinusoidal import SinusoidalPositionEncoding

POSITION_ENCODINGS = {
    "sinusoidal": SinusoidalPositionEncoding,
    "learned": LearnedPositionEncoding,
}


def get_position_encoding(name: str) -> type:
    try:
        return POSITION_ENCODINGS[name]
    except KeyError:
        raise ValueError(
            f"unknown --position-encoding {name!r}; choose one of: {', '.join(POSITION_ENCODINGS)}"
        ) from None


__all__ = ["POSITION_ENCODINGS", "PositionEncoding", "get_position_encoding"]
