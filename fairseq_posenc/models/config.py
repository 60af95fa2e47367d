"""The plugin's model flags, in one place: the general ones here, each encoding's own from its
``config`` dataclass, ``--segment-attention``'s from :class:`~..positions.segments.SegmentConfig`
(fairseq's Transformer flags come from fairseq).

A flag that the chosen model does not use is refused (:func:`refuse_unused_flags`), so that a
sweep over it cannot train the same model several times without a word. What a model uses is
declared, not listed here: the general flags of :class:`PosencConfig` (``--keep-input-positions``
only where the encoding drops fairseq's input embedding), the fields of its encoding's ``config``,
and with ``--segment-attention`` the fields of the segment bias's ``config``. A new encoding's
flags are refused with every other encoding as soon as its ``config`` declares them.
"""
import argparse
import dataclasses
import functools
from dataclasses import dataclass, field
from typing import FrozenSet, Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from ..compat import PosencError
from ..positions import POSITION_ENCODINGS, get_position_encoding
from ..positions.base import FROM_CHECKPOINT
from ..positions.float_bounds import attention_head_dim_high
from ..positions.segments import SegmentBias
from ..positions import values
from ..positions.values import Values

PositionEncodingChoice = ChoiceEnum(list(POSITION_ENCODINGS))


@dataclass
class PosencConfig(FairseqDataclass):
    position_encoding: PositionEncodingChoice = field(
        default="sinusoidal",
        metadata={"help": "how the model knows where its tokens are"},
    )
    keep_input_positions: bool = field(
        default=False,
        metadata={
            "help": "also add fairseq's sinusoidal input embedding to an encoding that lives "
            "inside attention (by default such encodings drop it); refused with those that keep it"
        },
    )
    attention_head_dim: Optional[int] = field(
        default=None,
        metadata={
            "label": "head size {}",
            "values": Values(low=1, high=attention_head_dim_high,
                             why="larger, the attention's projections alone exceed this machine's memory"),
            "help": "size of each attention head, independent of embed dim / heads "
            "(Bhojanapalli et al., 2020); logits scaled by 1/sqrt(N). Default: embed dim / heads"
        },
    )
    segment_attention: bool = field(
        default=False,
        metadata={"label": "segment attention", "help": "DIET segment attention in the encoder: a learned scalar per "
                  "(query segment, key segment) pair per head, on top of the position encoding"},
    )


def _names(config) -> FrozenSet[str]:
    return frozenset(f.name for f in dataclasses.fields(config)) if config is not None else frozenset()


def scheme_flags(scheme: type) -> FrozenSet[str]:
    """The flags a registered encoding takes: the fields of its ``config``."""
    return _names(scheme.config)


def _scheme_fields():
    """The fields of every encoding's config and of the segment bias's, each name once (schemes
    may share a flag)."""
    seen = {}
    for config in [scheme.config for scheme in POSITION_ENCODINGS.values()] + [SegmentBias.config]:
        for f in dataclasses.fields(config) if config else ():
            seen.setdefault(f.name, f)
    return [(f.name, f.type, field(default=f.default, metadata=f.metadata)) for f in seen.values()]


def _switched():
    """{option: the switch it needs}: the fields that declare ``metadata["needs"]`` (the range of
    --randomized-positions), used only where that switch is on."""
    return {name: f.metadata["needs"] for name, _, f in _scheme_fields() if "needs" in f.metadata}


SWITCHED = _switched()
PositionFlags = dataclasses.make_dataclass("PositionFlags", _scheme_fields(), bases=(FairseqDataclass,))
ALL_CONFIGS = (PosencConfig, PositionFlags)


def set_defaults(args, architecture):
    """Architecture-style defaults (``args.x = getattr(args, "x", default)``) for every flag, then
    fairseq's ``architecture`` (the model's sizes), then every value checked (:func:`check_values`,
    against those sizes; :func:`refuse_positions_removed`). Every architecture calls it: fairseq-train's
    option parsing (``parse_args_and_arch``) refuses a value before the data is read, and a model built
    from a namespace or a checkpoint is checked before it is built."""
    for config in ALL_CONFIGS:
        for f in dataclasses.fields(config):
            if not f.name.startswith("_"):
                setattr(args, f.name, getattr(args, f.name, f.default))
    architecture(args)
    check_values(args)
    refuse_positions_removed(args)


def flags_in_use(args) -> FrozenSet[str]:
    """The plugin flags (field names) that the model ``args`` describes uses."""
    scheme = get_position_encoding(args.position_encoding)
    used = _names(PosencConfig) | scheme_flags(scheme)
    if getattr(args, "segment_attention", False):
        used |= _names(SegmentBias.config)
    if scheme.input_embedding is not None:  # it keeps fairseq's input embedding anyway
        used -= {"keep_input_positions"}
    return used - {name for name, switch in SWITCHED.items() if not getattr(args, switch, False)}


def _flag(name: str, value) -> str:
    flag = "--" + name.replace("_", "-")
    return flag if value is True else f"{flag} {value}"


def _takers(name: str) -> str:
    if name == "keep_input_positions":
        return "the encodings that drop fairseq's input position embedding: " + ", ".join(
            e for e, scheme in POSITION_ENCODINGS.items() if scheme.input_embedding is None)
    takers = [e for e, scheme in POSITION_ENCODINGS.items() if name in scheme_flags(scheme)]
    where = [f"--position-encoding {' or '.join(takers)}"] if takers else []
    if name in _names(SegmentBias.config):
        where.append("--segment-attention" + (" with any encoding" if takers else ""))
    return ", or ".join(where)


def from_checkpoint(args) -> bool:
    """Whether the model ``args`` describes is rebuilt from a checkpoint's saved configuration
    (:func:`load_checkpoints_as_saved`), not a training run's command line."""
    return bool(getattr(args, FROM_CHECKPOINT, False))


def as_saved(args):
    """``args``, marked as a checkpoint's saved configuration: the model built from it is built and
    loaded as fairseq's loaders do (:func:`load_checkpoints_as_saved`), never refused for a flag."""
    setattr(args, FROM_CHECKPOINT, True)
    return args


def _mark_saved(state):
    """Mark a checkpoint state's saved model configuration (``args``, or ``cfg``'s model namespace
    of the legacy architectures, as here) :func:`as_saved`, as fairseq's ``arg_overrides`` would."""
    cfg = state.get("cfg")
    for args in (state.get("args"), cfg.get("model") if cfg is not None else None):
        if isinstance(args, argparse.Namespace):
            as_saved(args)


def load_checkpoints_as_saved():
    """A checkpoint's saved configuration is rebuilt, never refused: it was accepted when it was
    trained, or it predates a change of default (ALiBi's encoder form was ``split``, so every
    checkpoint of that time stores it, whatever its encoding). Every loader of fairseq (generate,
    the hub, --load-checkpoint of a teacher) goes through ``load_model_ensemble_and_task``: it
    adds :data:`~..positions.base.FROM_CHECKPOINT` to the ``arg_overrides`` it passes on (to a
    state given to it, which fairseq does not override, directly), so the model's configuration
    says so; a training run builds from its command line and is still checked."""
    from fairseq import checkpoint_utils

    load = checkpoint_utils.load_model_ensemble_and_task
    if getattr(load, "posenc_as_saved", False):
        return

    @functools.wraps(load)
    def load_as_saved(filenames, arg_overrides=None, task=None, strict=True, suffix="", num_shards=1, state=None):
        if state is not None:
            _mark_saved(state)
        overrides = {**(arg_overrides or {}), FROM_CHECKPOINT: True}
        return load(filenames, overrides, task, strict, suffix, num_shards, state)

    load_as_saved.posenc_as_saved = True
    checkpoint_utils.load_model_ensemble_and_task = load_as_saved


def refuse_misplaced_blocks(args):
    """One line for ``--position-blocks`` with an encoding that has no position encoder to place."""
    blocks = getattr(args, "position_blocks", None)
    if blocks is not None and get_position_encoding(args.position_encoding).default_blocks is None:
        placeable = ", ".join(name for name, scheme in POSITION_ENCODINGS.items() if scheme.default_blocks)
        raise PosencError(f"--position-blocks {blocks}: --position-encoding {args.position_encoding} has no "
                          f"position encoder to place at the input or at every block (only {placeable} have one)")


def refuse_unused_flags(args):
    """One line (:class:`PosencError`) for the first plugin flag set away from its default that
    the model ``args`` describes does not use: it would change nothing. Not for a model rebuilt
    from a checkpoint (:func:`load_checkpoints_as_saved`)."""
    if from_checkpoint(args):
        return
    used = flags_in_use(args)
    for config in ALL_CONFIGS:
        for f in dataclasses.fields(config):
            value = getattr(args, f.name, f.default)
            if f.name in used or f.name.startswith("_") or value == f.default:
                continue
            model = f"--position-encoding {args.position_encoding}"
            if f.name == "keep_input_positions":
                why = f"{model} keeps fairseq's input position embedding anyway"
            elif f.name in _names(SegmentBias.config) and not args.segment_attention:
                why = f"{model} without --segment-attention does not use it"
            elif f.name in SWITCHED and f.name in scheme_flags(get_position_encoding(args.position_encoding)):
                why = f"{model} without {_flag(SWITCHED[f.name], True)} does not use it"
            else:
                why = f"{model} does not use it"
            raise PosencError(f"{_flag(f.name, value)} would change nothing: {why} (it is for {_takers(f.name)})")


def check_values(args):
    """One line (:class:`PosencError`) for the first plugin flag whose value it does not take
    (:mod:`..positions.values`); a checkpoint's saved flags too."""
    for config in ALL_CONFIGS:
        values.check([f for f in dataclasses.fields(config) if not f.name.startswith("_")], args)


#: set in a namespace where the command line gave --no-token-positional-embeddings
POSITIONS_REMOVED_GIVEN = "posenc_no_token_positional_embeddings_given"


class _GivenStoreTrue(argparse._StoreTrueAction):
    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        setattr(namespace, POSITIONS_REMOVED_GIVEN, True)


def mark_positions_removed_given(parser):
    """fairseq's --no-token-positional-embeddings, once ``add_args`` added it, also records that the
    command line gave it: ``build_model`` sets the flag itself for the encodings that drop the
    input embedding, so its value alone cannot tell (a checkpoint's saved flags, ``model.args``)."""
    for action in parser._actions:
        if "--no-token-positional-embeddings" in action.option_strings:
            action.__class__ = _GivenStoreTrue


def refuse_positions_removed(args):
    """``--no-token-positional-embeddings`` (fairseq's) given on the command line, only with
    ``--position-encoding none``: it removes the input embedding that sinusoidal, learned, floater
    and rnn are built on, and the other encodings drop that embedding anyway (unless
    --keep-input-positions keeps it)."""
    if from_checkpoint(args) or not getattr(args, POSITIONS_REMOVED_GIVEN, False):
        return
    model = f"--position-encoding {args.position_encoding}"
    kept = get_position_encoding(args.position_encoding).input_embedding
    if kept is not None:
        raise PosencError(f"--no-token-positional-embeddings would remove the {kept} input position embedding that "
                          f"{model} is built on: for a model without positions use --position-encoding none")
    if args.keep_input_positions:
        raise PosencError("--no-token-positional-embeddings contradicts --keep-input-positions: give one of them")
    if args.position_encoding != "none":
        raise PosencError(f"--no-token-positional-embeddings would change nothing: {model} drops fairseq's input "
                          "position embedding anyway (it is for --position-encoding none)")

