"""The values each option of the plugin takes, declared beside the option in its configuration
dataclass (``field(metadata={"values": Values(...)})``) and checked in one place, :func:`check`,
before the model is built (``transformer_posenc``'s ``build_model``) and when a scheme is built by
hand; each refusal is one line (:class:`~..compat.PosencError`). A switch takes no value, and a
``ChoiceEnum`` option's values are its type's. tests/fairseq/test_flag_values.py walks every option of
every encoding's configuration with values it must refuse, through fairseq-train.
"""
import dataclasses
import enum
import math
import typing
from dataclasses import dataclass
from typing import Callable, Optional, Tuple, Union

from ..compat import PosencError


@dataclass(frozen=True)
class Values:
    """What an option takes. A number (finite): ``low`` (a value, or a function of the model's flags
    named in messages by ``bound``) and up, past it with ``above``, up to ``high`` (a value or a
    function of the model's flags). A string: one of
    ``choices`` (``noun`` names what they are), with ``subset`` a comma-separated list of them, each
    once, a ``file``'s path, or one ``token`` (no spaces). ``layer``: the index of a layer of the
    stack it names (negative: from the last), checked where that model is known (:func:`layer_refusal`).
    ``why``: the reason, in brackets after the requirement."""

    low: Union[float, Callable, None] = None
    above: bool = False
    high: Union[float, Callable, None] = None
    bound: Optional[str] = None
    choices: Tuple[str, ...] = ()
    noun: Optional[str] = None
    subset: bool = False
    file: bool = False
    token: bool = False
    layer: Optional[str] = None
    why: Optional[str] = None

    def low_of(self, args):
        return self.low(args) if callable(self.low) else self.low

    def high_of(self, args):
        return self.high(args) if callable(self.high) else self.high


def value_type(field: dataclasses.Field):
    """The type of an option's values: int, float, str, bool or a ChoiceEnum (Optional[X]: X)."""
    kind = field.type
    if typing.get_origin(kind) is typing.Union:
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    return kind


def declared(field: dataclasses.Field) -> Optional[Values]:
    """The option's declared values; a ChoiceEnum's are its members."""
    spec = field.metadata.get("values")
    kind = value_type(field)
    if spec is None and isinstance(kind, type) and issubclass(kind, enum.Enum):
        spec = Values(choices=tuple(member.value for member in kind))
    return spec


def _requirement(spec: Values, kind, args) -> str:
    low, high = spec.low_of(args), spec.high_of(args)
    if kind is float:
        if low == 0 and high is None:
            return "a positive finite number" if spec.above else "a finite number >= 0"
        text = f"a finite number {'>' if spec.above else '>='} {low:g}"
        return text + (f" and <= {high:g}" if high is not None else "")
    if high is not None:
        return f"{low} or {high}" if high - low == 1 else f"from {low} to {high}"
    if spec.above:
        return f"exceed {spec.bound} = {low}" if spec.bound else f"exceed {low}"
    return "positive" if low == 1 else f"at least {low}"


def refusal(field: dataclasses.Field, value, args) -> Optional[str]:
    """Why ``value`` of option ``field`` is refused (one line), or None."""
    spec, kind = declared(field), value_type(field)
    flag = "--" + field.name.replace("_", "-")
    if value is None or spec is None:
        return None
    why = f" ({spec.why})" if spec.why else ""
    if spec.subset:
        items = [item.strip() for item in str(value).split(",")]
        if all(items) and set(items) <= set(spec.choices) and len(set(items)) == len(items):
            return None
        return f"{flag} must be a comma-separated list of {', '.join(spec.choices)}, each once, got {value!r}"
    if spec.choices:
        if value in spec.choices:
            return None
        if spec.noun:
            return f"{flag} {value!r} is not {spec.noun}; choose one of {', '.join(spec.choices)}"
        return f"{flag} must be one of {', '.join(spec.choices)}, got {value!r}"
    if spec.file:
        # a path, not its file: the workflow resolves commands whose start is not trained yet; the
        # file is checked where it is read (one line too, before anything is loaded from it)
        return None if str(value).strip() else f"{flag} must be the path of a checkpoint, got {value!r}"
    if spec.token:
        return None if str(value) and not any(c.isspace() for c in str(value)) else (
            f"{flag} must be one token, without spaces{why}, got {value!r}")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        return f"{flag} must be a whole number, got {value!r}"
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return f"{flag} must be a number, got {value!r}"
    if spec.layer:
        return None
    low, high = spec.low_of(args), spec.high_of(args)
    inside = math.isfinite(value) and (low is None or (value > low if spec.above else value >= low)) and (
        high is None or value <= high)
    if inside:
        return None
    verb = "" if _requirement(spec, kind, args).startswith("exceed") else "be "
    return f"{flag} must {verb}{_requirement(spec, kind, args)}{why}, got {value}"


def check(fields, args):
    """One line (:class:`PosencError`) for the first of ``fields`` whose value in ``args`` (a
    namespace, or a scheme's configuration) is refused."""
    for field in fields:
        reason = refusal(field, getattr(args, field.name, field.default), args)
        if reason is not None:
            raise PosencError(reason)


def layer_refusal(field: dataclasses.Field, index: int, count: int) -> Optional[str]:
    """Why layer ``index`` of a stack of ``count`` layers (the one ``field``'s ``layer`` names) is
    refused (one line), or None."""
    if -count <= index < count:
        return None
    flag = "--" + field.name.replace("_", "-")
    return (f"{flag} {index}: the {declared(field).layer} has {count} layers; choose from {-count} to {count - 1} "
            "(-1 is the last)")


def check_when_parsed(parser, fields, also: Callable = lambda args: None):
    """Check ``fields``' declared values, and ``also(args)``, each time ``parser`` has parsed a
    command line: fairseq parses once more after adding a criterion's options (``add_args``), before
    any data is read, and a refusal there is one line (:class:`~..compat.PosencError`)."""
    original = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        parsed, extra = original(args, namespace)
        check(fields, parsed)
        also(parsed)
        return parsed, extra

    parser.parse_known_args = parse_known_args
