"""The registry of position encodings: one file per scheme, one line here per scheme.

``--position-encoding NAME`` picks ``POSITION_ENCODINGS[NAME]``; the model, its stacks and its
attention layers only ever talk to the :class:`PositionEncoding` interface, and each scheme's
flags come from its own ``config`` dataclass.
"""
from ..compat import PosencError
from .alibi import ALiBi
from .base import AttentionPositions, PositionEncoding
from .diet_abs import DietAbs
from .diet_rel import DietRel
from .floater import FloaterPositionEncoding
from .learned import LearnedPositionEncoding
from .none import NoPositionEncoding
from .rnn import RNNPositionEncoding
from .rope import RotaryPositionEncoding
from .shaw import ShawRelative
from .sinusoidal import SinusoidalPositionEncoding
from .t5 import T5Bias

POSITION_ENCODINGS = {
    "sinusoidal": SinusoidalPositionEncoding,
    "learned": LearnedPositionEncoding,
    "none": NoPositionEncoding,
    "diet_abs": DietAbs,
    "diet_rel": DietRel,
    "shaw": ShawRelative,
    "t5": T5Bias,
    "rope": RotaryPositionEncoding,
    "alibi": ALiBi,
    "floater": FloaterPositionEncoding,
    "rnn": RNNPositionEncoding,
}


def get_position_encoding(name: str) -> type:
    try:
        return POSITION_ENCODINGS[name]
    except KeyError:
        raise PosencError(
            f"unknown --position-encoding {name!r}; choose one of: {', '.join(POSITION_ENCODINGS)}"
        ) from None


__all__ = ["POSITION_ENCODINGS", "AttentionPositions", "PositionEncoding", "get_position_encoding"]
