"""Every plugin flag, with every registered encoding, at a value other than its default: either it
changes the model (its parameters, its output on a fixed batch, or both after two updates), or
parsing and building refuse it with one line that names the flag. A flag that changes nothing
would let a sweep over it train the same model again and again without a word.

The flags are the fields of the plugin's config dataclasses (models/config.py's ALL_CONFIGS: the
general flags and every encoding's and the segment bias's ``config``), the encodings the registry's:
a new flag or encoding is in the grid without a line here. The value is chosen by type (flip a
bool, +1 an int, double a non-zero float, another choice); ``OTHER_VALUES`` holds the fields for
which that does not work, and a new field that needs one fails ``test_every_flag_has_a_value``
until it gets one. Each case is parsed by fairseq's own parser (``options.parse_args_and_arch``
with ``--user-dir``) and built as ``fairseq-train`` builds it (``fairseq.models.build_model``).
"""
import atexit
import dataclasses
import enum
import functools
import os
import shutil
import tempfile

import pytest
import torch
from fairseq import models, options
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.transformer import TransformerModel
from fairseq.optim.adam import Adam

from fairseq_posenc import update_hooks
from posenc_workflow import pipeline
from fairseq_posenc.models.config import ALL_CONFIGS, SWITCHED, scheme_flags
from fairseq_posenc.positions import POSITION_ENCODINGS
from fairseq_posenc.positions.segments import SegmentBias
from helpers.toy import TINY, ToyTask, full_log_probs

SEGMENTS = "--segment-attention"
CONTEXTS = {"alone": [], "segments": [SEGMENTS]}
#: a context per switch that options need (SWITCHED: --randomized-positions), for the encodings taking it
SWITCHES = {switch: ["--" + switch.replace("_", "-")] for switch in sorted(set(SWITCHED.values()))}
FIELDS = {f.name: f for config in ALL_CONFIGS for f in dataclasses.fields(config)
          if not f.name.startswith("_") and f.name != "position_encoding"}  # the grid's other axis
SEPARATOR, OTHER_SEPARATOR = "<sep>", "w3"


def _vanilla_checkpoint(context):
    """A sinusoidal model of the grid's size and context saved as fairseq saves one:
    --floater-init-from's value."""
    path = os.path.join(_tmp_dir(), f"vanilla_{'_'.join(context)}.pt")
    if not os.path.exists(path):
        torch.save({"model": _build(_parse("--position-encoding", "sinusoidal", *context)).state_dict()}, path)
    return path


@functools.lru_cache(maxsize=None)
def _tmp_dir():
    path = tempfile.mkdtemp(prefix="flags_change_the_model_")
    atexit.register(shutil.rmtree, path, True)
    return path


#: fields whose changed value the type does not give: defaults of None (the encoding's own
#: default, or one computed from the model's size), strings, and numbers whose next value changes
#: nothing on a batch as short as the test's. Each takes the encoding and the context's flags.
OTHER_VALUES = {
    "attention_head_dim": lambda scheme, context: 16,  # default d / heads = 8
    # default: the encoding's own, so the other one
    "position_blocks": lambda scheme, context: "input" if scheme.default_blocks == "all" else "all",
    "position_sharing": lambda scheme, context: "heads",  # default layers (diet_abs) or none (diet_rel)
    "diet_rank": lambda scheme, context: 2,  # default the head size
    "max_relative_distance": lambda scheme, context: 3,  # defaults 128 and 16: more than the batch spans
    # 129 buckets the batch's distances (below 23) as 128 does; 16 or less is refused (t5.py)
    "t5_max_distance": lambda scheme, context: 24,
    "alibi_encoder": lambda scheme, context: "split",  # default symmetric
    "floater_solver": lambda scheme, context: "euler",  # default rk4
    "floater_step": lambda scheme, context: 0.05,  # default dt / 5
    "floater_hidden": lambda scheme, context: 16,  # default the attention width
    "floater_lr_scale": lambda scheme, context: 2.0,  # default --floater-solve-every's N, here 1
    "floater_dissipation": lambda scheme, context: 1.0,  # default 0, the paper's FLOATER
    "floater_init_from": lambda scheme, context: _vanilla_checkpoint(context),
    "segment_separator": lambda scheme, context: OTHER_SEPARATOR,  # default <sep>; both are in the batch
}


def _by_type(f):
    """The changed value by type, or None where the type gives none."""
    if isinstance(f.type, type) and issubclass(f.type, enum.Enum):  # fairseq's ChoiceEnum
        return next((c.value for c in f.type if c.value != f.default), None)
    if f.type is bool:
        return not f.default
    if f.type is int and f.default is not None:
        return f.default + 1
    if f.type is float and f.default:
        return 2 * f.default
    return None


def _changed(name, scheme, context=()):
    """The command-line arguments that set field ``name`` away from its default."""
    f = FIELDS[name]
    value = OTHER_VALUES[name](scheme, context) if name in OTHER_VALUES else _by_type(f)
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        assert value is not f.default
        return [flag]  # fairseq's parser: store_true for a False default, store_false for a True one
    assert value is not None and value != f.default, name
    return [flag, str(value)]


def _parse(*flags):
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, [
        "data-bin", "--user-dir", pipeline.USER_DIR, "--arch", "transformer_posenc", *TINY, "--dropout", "0",
        "--max-source-positions", "64", "--max-target-positions", "64", *flags])


def _task():
    task = ToyTask()
    task.source_dictionary.add_symbol(SEPARATOR)
    return task


def _build(args):
    torch.manual_seed(1)
    return models.build_model(args, _task())


@functools.lru_cache(maxsize=None)
def _batch():
    """Sources of 23, 9 and 14 tokens (left-padded) with the separator and the other separator."""
    g = torch.Generator().manual_seed(0)
    dictionary = _task().source_dictionary
    lengths = [23, 9, 14]
    src = torch.full((3, 23), dictionary.pad())
    for b, n in enumerate(lengths):
        src[b, 23 - n:] = torch.randint(dictionary.nspecial, len(dictionary), (n,), generator=g)
    src[:, -1] = dictionary.eos()
    src[:, -4] = dictionary.index(SEPARATOR)
    src[:, -7] = dictionary.index(OTHER_SEPARATOR)
    prev = torch.randint(dictionary.nspecial, len(dictionary), (3, 20), generator=g)
    prev[:, 0] = dictionary.eos()
    return src, torch.tensor(lengths), prev


def _output(model):
    model.eval()
    with torch.no_grad():
        return full_log_probs(model, *_batch())


def _trained(model, updates=2):
    """``model`` after ``updates`` updates of fairseq's Adam on the batch, each run as fairseq's
    trainer runs one (update count, announced passes, the finishing hook before the step)."""
    model.train()
    optimizer = Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-8)
    src, lengths, prev = _batch()
    target = torch.roll(prev, -1, dims=1)
    for n in range(updates):
        model.set_num_updates(n)
        update_hooks.announce_update(model, 1)
        loss = -full_log_probs(model, src, lengths, prev).gather(-1, target[..., None]).sum()
        loss.backward()
        update_hooks.finish_update(model, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model


def _difference(model, other):
    """What differs between two models: "parameters", "output" or None."""
    ours, theirs = dict(model.named_parameters()), dict(other.named_parameters())
    if ours.keys() != theirs.keys() or any(
            ours[k].shape != theirs[k].shape or not torch.equal(ours[k], theirs[k]) for k in ours):
        return "parameters"
    return None if torch.equal(_output(model), _output(other)) else "output"


def _outcome(base_flags, changed):
    """("refused", message), or ("changes", what differs), or ("nothing", None)."""
    try:
        model = _build(_parse(*base_flags, *changed))
    except ValueError as e:  # compat.PosencError and the schemes' own checks
        return "refused", str(e)
    base = _build(_parse(*base_flags))
    what = _difference(model, base)
    if what is None:
        what = _difference(_trained(model), _trained(base))
        what = what and f"{what} after updates"
    return ("changes", what) if what else ("nothing", None)


def _cases():
    for context, extra in {**CONTEXTS, **SWITCHES}.items():
        for encoding, scheme in POSITION_ENCODINGS.items():
            if context in SWITCHES and context not in scheme_flags(scheme):
                continue
            for name in FIELDS:
                if name in ("segment_attention", context) and extra:
                    continue  # on in that context
                yield pytest.param(context, encoding, name, id=f"{context}-{encoding}-{name}")


def _own_flags(scheme, context):
    """Flags that the encoding's own config (or the segment bias's, with it) declares: accepted, those
    needing a switch (SWITCHED) where it is on."""
    configs = [scheme.config] + ([SegmentBias.config] if context == "segments" else [])
    own = {f.name for config in configs if config for f in dataclasses.fields(config)}
    return own - {name for name, switch in SWITCHED.items() if switch != context}


@pytest.mark.parametrize("context, encoding, name", list(_cases()))
def test_a_flag_changes_the_model_or_is_refused_in_one_line(context, encoding, name):
    scheme = POSITION_ENCODINGS[encoding]
    extra = {**CONTEXTS, **SWITCHES}[context]
    changed = _changed(name, scheme, extra)
    outcome, detail = _outcome(["--position-encoding", encoding, *extra], changed)
    assert outcome != "nothing", f"{' '.join(changed)} with --position-encoding {encoding} " \
        f"{' '.join(extra)}: built and trained the same model, without a word"
    if outcome == "refused":
        assert changed[0] in detail and "\n" not in detail, detail
        assert name not in _own_flags(scheme, context), f"refused a flag of its own config: {detail}"


def test_every_flag_has_a_value():
    """A new field whose type gives no changed value needs one in OTHER_VALUES."""
    missing = [name for name in FIELDS if name not in OTHER_VALUES and _by_type(FIELDS[name]) is None]
    assert not missing, f"add a changed value to OTHER_VALUES for: {', '.join(missing)}"


def _option_dests(model_class):
    parser = options.get_training_parser()
    model_class.add_args(parser)
    return {a.dest for a in parser._actions}


def test_the_grid_holds_every_flag_the_plugin_adds_to_fairseqs_parser():
    """A flag added to the parser other than through the config dataclasses would escape the grid."""
    added = _option_dests(ARCH_MODEL_REGISTRY["transformer_posenc"]) - _option_dests(TransformerModel)
    assert added == set(FIELDS) | {"position_encoding"}


def test_position_bias_scale_is_refused_where_it_changes_nothing_and_not_under_segment_attention():
    """The issue's case: alibi, shaw, learned and rope built and trained unchanged with it."""
    for encoding in ("alibi", "shaw", "learned", "rope"):
        outcome, message = _outcome(["--position-encoding", encoding], ["--position-bias-scale", "10"])
        assert outcome == "refused"
        assert message.startswith(f"--position-bias-scale 10.0 would change nothing: --position-encoding "
                                  f"{encoding} without --segment-attention does not use it (it is for "
                                  "--position-encoding "), message
        assert _outcome(["--position-encoding", encoding, SEGMENTS], ["--position-bias-scale", "10"])[0] == "changes"


@pytest.mark.parametrize("buckets, distance, message", [
    ("32", "16", "--t5-max-distance must exceed --t5-num-buckets / 2 = 16 (the distances the decoder's exact "
                 "buckets cover), got 16"),
    ("2", "128", "--t5-num-buckets must be at least 4"),
])
def test_t5_refuses_buckets_its_formula_cannot_fill(buckets, distance, message):
    """Found by the grid above: --t5-max-distance 16 with 32 buckets divided by log(16 / 16) = 0 in
    the decoder's buckets and indexed the table at -2^63 (an IndexError in the first forward)."""
    with pytest.raises(ValueError) as error:
        _build(_parse("--position-encoding", "t5", "--t5-num-buckets", buckets, "--t5-max-distance", distance))
    assert str(error.value).startswith(message)
    assert _outcome(["--position-encoding", "t5"], ["--t5-max-distance", "17"])[0] == "changes"
