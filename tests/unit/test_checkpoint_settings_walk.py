"""models/checkpoint_settings.py: a checkpoint's position settings against the model it is loaded into.
The walk sets every option of every encoding (and of the segment bias) away from the saved value,
one at a time, on each load path: refused in one line naming both values, or allowed where
MAY_CHANGE says so, or never compared where NOT_THE_MODEL says so. The options are the models'
(flags_in_use), so a new flag is walked without a line here; the CLI paths are in
tests/fairseq/test_checkpoint_settings.py."""
import dataclasses
import enum
import typing

import pytest
import torch

from fairseq_posenc.compat import PosencError
from fairseq_posenc.labels import model_label, number
from fairseq_posenc.models.checkpoint_settings import (DECODE, FINETUNE, MAY_CHANGE, NOT_THE_MODEL, RESUME,
                                                       refuse_other_settings)
from fairseq_posenc.models.config import ALL_CONFIGS, SWITCHED, flags_in_use, scheme_flags
from fairseq_posenc.positions import POSITION_ENCODINGS
from helpers.toy import ToyTask, build_model, model_args

FIELDS = {f.name: f for config in ALL_CONFIGS for f in dataclasses.fields(config) if not f.name.startswith("_")}
#: values the type does not give (defaults of None, strings); the others: a switch flipped, a
#: number doubled (1 for 0), another choice
OTHER = {"attention_head_dim": 16, "position_sharing": "heads", "diet_rank": 2, "max_relative_distance": 3,
         "alibi_encoder": "split", "floater_solver": "euler", "floater_step": 0.05, "floater_hidden": 16,
         "floater_lr_scale": 2.0, "floater_init_from": "vanilla.pt", "segment_separator": "w3"}
CONTEXTS = {"alone": [], "segments": ["--segment-attention"]}


def _task():
    task = ToyTask()
    task.source_dictionary.add_symbol("<sep>")
    return task


def _other(f, scheme):
    if f.name == "position_blocks":
        return "input" if scheme.default_blocks == "all" else "all"
    if f.name in OTHER:
        return OTHER[f.name]
    kind = f.type
    if typing.get_origin(kind) is typing.Union:
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return next(c.value for c in kind if c.value != f.default)
    if isinstance(f.default, bool):
        return not f.default
    return 2 * f.default if f.default else type(f.default)(1)


def _flag(name, value):
    flag = "--" + name.replace("_", "-")
    return [flag] if value is True else [flag, str(value)]


def _contexts(scheme):
    """CONTEXTS, and each switch an option of the scheme needs (SWITCHED: --randomized-positions)."""
    yield from CONTEXTS.items()
    for switch in sorted(set(SWITCHED.values()) & scheme_flags(scheme)):
        yield switch, _flag(switch, True)


def _cases():
    for encoding, scheme in POSITION_ENCODINGS.items():
        for context, extra in _contexts(scheme):
            base = ["--position-encoding", encoding, *extra]
            for name in sorted(set(flags_in_use(model_args("transformer_posenc", *base))) & set(FIELDS) - {"position_encoding"}):
                if not (name in ("segment_attention", context) and extra):
                    yield pytest.param(base, name, _other(FIELDS[name], scheme), id=f"{context}-{encoding}-{name}")


@pytest.mark.parametrize("base, name, value", list(_cases()))
def test_every_option_that_differs_from_the_saved_one_is_refused_or_allowed_as_declared(base, name, value):
    saved = model_args("transformer_posenc", *base)
    changed = [] if name == "floater_init_from" else _flag(name, value)  # a warm start needs its file
    model = build_model("transformer_posenc", *base, *changed, task=_task())
    setattr(model.args, name, value)
    text = number(value) if isinstance(value, float) else str(value)
    shown = f"--{name.replace('_', '-')}" + ("" if isinstance(value, bool) else f" {text}")
    for how in (RESUME, FINETUNE, DECODE):
        if name in NOT_THE_MODEL:
            assert refuse_other_settings(saved, model, "ck.pt", how) == [], how
        elif how in MAY_CHANGE.get(name, ((),))[0]:
            assert [f.name for f, *_ in refuse_other_settings(saved, model, "ck.pt", how)] == [name], how
        else:
            with pytest.raises(PosencError) as refused:
                refuse_other_settings(saved, model, "ck.pt", how)
            line = str(refused.value)
            assert "\n" not in line and line.startswith(("ck.pt was trained with --position-encoding",
                                                         "ck.pt (--finetune-from-model) was trained with")), line
            given = line.split("; this ", 1)[1]
            assert f"--position-encoding {base[1]} {shown}: " in given or (value is False and "no " + shown in given)


def test_the_declared_exceptions_are_options_of_the_plugin():
    assert set(MAY_CHANGE) | set(NOT_THE_MODEL) <= set(FIELDS)
    assert not set(MAY_CHANGE) & set(NOT_THE_MODEL)


@pytest.mark.parametrize("saved", list(POSITION_ENCODINGS))
def test_every_other_encoding_is_refused_on_every_path(saved):
    for given in POSITION_ENCODINGS:
        if given == saved:
            continue
        model = build_model("transformer_posenc", "--position-encoding", given)
        for how in (RESUME, FINETUNE, DECODE):
            with pytest.raises(PosencError, match=rf"^ck.pt (\(--finetune-from-model\) )?was trained with "
                                                  rf"--position-encoding {saved}\b.*; this (run|decode) gives "
                                                  rf"--position-encoding {given}\b"):
                refuse_other_settings(model_args("transformer_posenc", "--position-encoding", saved), model,
                                      "ck.pt", how)


def test_an_explicit_published_value_is_the_saved_default():
    """Shaw trained without --max-relative-distance (16) resumed with 16, a head size given as embed dim /
    heads: the same model."""
    for flags in (["--position-encoding", "shaw", "--max-relative-distance", "16"],
                  ["--position-encoding", "rope", "--attention-head-dim", "8"]):
        model = build_model("transformer_posenc", *flags)
        assert refuse_other_settings(model_args("transformer_posenc", *flags[:2]), model, "ck.pt", RESUME) == []


def test_a_decode_override_is_allowed_and_labelled():
    model = build_model("transformer_posenc", "--position-encoding", "rope", "--rope-theta", "500")
    allowed = refuse_other_settings(model_args("transformer_posenc", "--position-encoding", "rope"), model,
                                    "ck.pt", DECODE)
    assert [(f.name, s, g) for f, s, g in allowed] == [("rope_theta", 10000.0, 500.0)]
    assert model_label(model) == "rope (--rope-theta 500)"


@pytest.mark.parametrize("vanilla, floater, saved, given", [
    (["--attention-head-dim", "4"], [], "--attention-head-dim 4", "--attention-head-dim 8"),
    (["--segment-attention"], [], "--segment-attention", "no --segment-attention"),
    (["--segment-attention", "--max-segments", "4"], ["--segment-attention"], "--max-segments 4", "--max-segments 8"),
])
def test_the_warm_start_refuses_a_vanilla_model_of_other_general_settings(tmp_path, vanilla, floater, saved, given):
    """FLOATER's warm start changes the encoding by design; the other position settings are the run's."""
    args = model_args("transformer_posenc", "--position-encoding", "sinusoidal", *vanilla)
    path = str(tmp_path / "vanilla.pt")
    torch.save({"model": build_model("transformer_posenc", "--position-encoding", "sinusoidal", *vanilla,
                                     task=_task()).state_dict(), "cfg": {"model": args}}, path)
    with pytest.raises(PosencError) as refused:
        build_model("transformer_posenc", "--position-encoding", "floater", *floater, "--floater-init-from", path,
                    task=_task())
    assert str(refused.value) == (f"--floater-init-from: {path} was trained with {saved}; this run gives {given}: "
                                  "the warm start keeps the vanilla model's other settings, give its flags")
