"""The registry of position encodings: one file per scheme, one line here per scheme.

``--position-encoding NAME`` picks ``POSITION_ENCODINGS[NAME]``; the model, its stacks and its
attention layers only ever talk to the :class:`PositionEncoding` interface, and each scheme's
flags come from its own ``config`` dataclass. Everything that lists encodings (the architectures,
the demo, the tests' walks, scripts/mutation_test.py's targets) reads ``SCHEMES``.
"""
from importlib import import_module

from ..compat import PosencError
from .base import REGISTERED, AttentionPositions, PositionEncoding

#: --position-encoding NAME -> "module.Class" of this package (a line here is the whole registration)
SCHEMES = {
    "sinusoidal": "sinusoidal.SinusoidalPositionEncoding",
    "learned": "learned.LearnedPositionEncoding",
    "none": "none.NoPositionEncoding",
    "diet_abs": "diet_abs.DietAbs",
    "diet_rel": "diet_rel.DietRel",
    "shaw": "shaw.ShawRelative",
    "t5": "t5.T5Bias",
    "rope": "rope.RotaryPositionEncoding",
    "xpos": "xpos.XPos",
    "alibi": "alibi.ALiBi",
    "floater": "floater.FloaterPositionEncoding",
    "rnn": "rnn.RNNPositionEncoding",
    "kerple": "kerple.Kerple",
    "fire": "fire.Fire",
}


def _scheme(where: str) -> type:
    module, name = where.rsplit(".", 1)
    return getattr(import_module(f".{module}", __name__), name)


POSITION_ENCODINGS = {name: _scheme(where) for name, where in SCHEMES.items()}
REGISTERED.update(POSITION_ENCODINGS)


def get_position_encoding(name: str) -> type:
    try:
        return POSITION_ENCODINGS[name]
    except KeyError:
        raise PosencError(
            f"unknown --position-encoding {name!r}; choose one of: {', '.join(POSITION_ENCODINGS)}"
        ) from None


__all__ = ["POSITION_ENCODINGS", "SCHEMES", "AttentionPositions", "PositionEncoding", "get_position_encoding"]
