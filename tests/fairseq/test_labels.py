"""fairseq_posenc/labels.py: a report's row names the published form plainly and every option that
differs from it in brackets, derived from the model's configuration and the values its weights
carry; read from a checkpoint without its data, or refused naming the file."""
import dataclasses
import enum
import os
import shutil
import subprocess
import sys
import typing

import pytest
import torch
from fairseq.data import Dictionary

from posenc_workflow import toy_data
from fairseq_posenc.compat import PosencError
from fairseq_posenc.labels import UNLABELLED, describe, model_forms, model_label, scheme_items
from fairseq_posenc.models.config import PosencConfig
from fairseq_posenc.positions import POSITION_ENCODINGS
from fairseq_posenc.positions.segments import SegmentBias
from fairseq_posenc.positions.values import value_type
from helpers.fairseq_runs import outcome, preprocess_here, run_all, train_command
from helpers.tolerances import assert_within, magnitude
from helpers.toy import build_model, full_log_probs, toy_batch


def label(*flags):
    return model_label(build_model("transformer_posenc", *flags))


@pytest.mark.parametrize("flags, expected", [
    (("--position-encoding", "alibi"), "alibi"),
    (("--position-encoding", "alibi", "--alibi-encoder", "symmetric"), "alibi"),
    (("--position-encoding", "alibi", "--alibi-encoder", "split"), "alibi (split)"),
    (("--position-encoding", "alibi", "--alibi-encoder", "crossed"), "alibi (crossed)"),
    (("--position-encoding", "t5"), "t5"),
    (("--position-encoding", "t5", "--position-bias-scale", "10"), "t5 (bias scale 10)"),
    (("--position-encoding", "diet_rel", "--position-bias-scale", "2.5"), "diet_rel (bias scale 2.5)"),
    (("--position-encoding", "sinusoidal"), "sinusoidal"),
    (("--position-encoding", "rope", "--attention-head-dim", "16"), "rope (head size 16)"),
    (("--position-encoding", "learned", "--position-blocks", "all"), "learned (blocks all)"),
    (("--position-encoding", "sinusoidal", "--position-blocks", "input"), "sinusoidal"),
    # the list: each of these labelled as its default before
    (("--position-encoding", "rope", "--rope-theta", "500"), "rope (--rope-theta 500)"),
    (("--position-encoding", "shaw", "--max-relative-distance", "4"), "shaw (--max-relative-distance 4)"),
    (("--position-encoding", "diet_rel", "--max-relative-distance", "4"), "diet_rel (--max-relative-distance 4)"),
    (("--position-encoding", "diet_abs", "--diet-rank", "2"), "diet_abs (--diet-rank 2)"),
    (("--position-encoding", "t5", "--t5-num-buckets", "8"), "t5 (--t5-num-buckets 8)"),
    (("--position-encoding", "floater", "--floater-hidden", "8"), "floater (--floater-hidden 8)"),
    (("--position-encoding", "rnn", "--rnn-layers", "2"), "rnn (--rnn-layers 2)"),
    (("--position-encoding", "rnn", "--rnn-dt", "0.2"), "rnn (--rnn-dt 0.2)"),
    (("--position-encoding", "rnn", "--rnn-input", "vector"), "rnn (--rnn-input vector)"),
    (("--position-encoding", "diet_abs", "--position-sharing", "none"), "diet_abs (--position-sharing none)"),
    (("--position-encoding", "t5", "--keep-input-positions"), "t5 (--keep-input-positions)"),
    # a value given that is the published one is the published form
    (("--position-encoding", "shaw", "--max-relative-distance", "16"), "shaw"),
    (("--position-encoding", "diet_abs", "--diet-rank", "8", "--position-sharing", "layers"), "diet_abs"),
    (("--position-encoding", "floater", "--floater-step", "0.04", "--floater-dt", "0.2"), "floater (dt 0.2)"),
])
def test_labels_name_what_differs_from_the_published_form(flags, expected):
    assert label(*flags) == expected


@torch.no_grad()
def test_the_label_is_read_from_the_loaded_state_not_the_flags_the_model_was_built_with():
    split = build_model("transformer_posenc", "--position-encoding", "alibi", "--alibi-encoder", "split")
    built_symmetric = build_model("transformer_posenc", "--position-encoding", "alibi", seed=2)
    assert model_label(built_symmetric) == "alibi"
    built_symmetric.load_state_dict(split.state_dict())
    assert model_label(built_symmetric) == "alibi (split)"
    # T5's weights learned with S = 10, loaded into a model built with S = 1: rescaled to compute
    # the same biases, and labelled with the S they learned with
    scaled = build_model("transformer_posenc", "--position-encoding", "t5", "--position-bias-scale", "10")
    plain = build_model("transformer_posenc", "--position-encoding", "t5", seed=2)
    plain.load_state_dict(scaled.state_dict())
    assert model_label(plain) == "t5 (bias scale 10)"


def test_the_two_stacks_are_named_once_or_by_side():
    model = build_model("transformer_posenc", "--position-encoding", "t5", "--position-bias-scale", "10")
    # both stacks learned at S = 10: said once
    assert scheme_items(model.encoder.position_encoding) == scheme_items(model.decoder.position_encoding) == [
        "bias scale 10"]
    assert model_forms(model) == ["bias scale 10"]
    model.decoder.position_encoding.trained_bias_scale = 3.0
    assert model_forms(model) == ["encoder bias scale 10", "decoder bias scale 3"]


# --- the walk: every option of every encoding's configuration changes the label -----------------

#: values to try for the options whose type names no choices (a new such option fails the walk
#: until it has some here)
STRINGS = {"alibi_encoder": ["split", "crossed"], "position_sharing": ["heads", "layers", "none"],
           "floater_solver": ["euler", "dopri5"], "segment_separator": ["<sep2>"]}


class Task:
    source_dictionary = target_dictionary = Dictionary()


for _symbol in ["<sep>", "<sep2>"] + [f"w{i}" for i in range(26)]:
    Task.source_dictionary.add_symbol(_symbol)


def _build(*flags):
    # fairseq's 1024 positions: diet_rel's published distance 128 and the walk's 256 and 129 are
    # distances within them (at most positions - 1)
    return build_model("transformer_posenc", *flags, task=Task(), max_positions=1024)


def _choices(field):
    kind = field.type
    if typing.get_origin(kind) is typing.Union:  # Optional[X]
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    return [member.value for member in kind] if isinstance(kind, type) and issubclass(kind, enum.Enum) else None


def _alternatives(field, published, vanilla):
    """Values of the option other than its published one, from its type (numbers: twice, or 1 for
    0, then one more; a switch: on; choices: the others)."""
    if field.name == "floater_init_from":
        return [vanilla]
    if field.name in STRINGS:
        return [v for v in STRINGS[field.name] if v != published]
    choices = _choices(field)
    if choices is not None:
        return [c for c in choices if c != published]
    if isinstance(published, bool):
        return [not published]
    if isinstance(published, (int, float)):
        return [published * 2 if published else type(published)(1), published + 1]
    pytest.fail(f"the walk has no value to try for --{field.name.replace('_', '-')}: add some to STRINGS")


def _neighbours(field, value, published, others):
    """Other values of an option beside ``value``, for the labels to tell apart: a float's neighbour
    within 1e-7 (6 significant digits printed 20000 and 20000.002 alike), a whole number's next ones,
    a choice's other choices; none for a switch, the warm start's file (named "warm start") and the
    options UNLABELLED exempts."""
    if isinstance(value, bool) or field.name == "floater_init_from" or field.name in UNLABELLED:
        return []
    if isinstance(value, float):
        return [value * (1 + 1e-7)]
    if isinstance(value, int):
        return [v for v in (value + 1, value - 1) if v != published]
    return [v for v in others if v != value]


def _every_field():
    configs = [e.config for e in POSITION_ENCODINGS.values() if e.config] + [PosencConfig, SegmentBias.config]
    return [f for config in configs for f in dataclasses.fields(config) if not f.name.startswith("_")]


def _flag(name, value):
    flag = "--" + name.replace("_", "-")
    return [flag] if value is True else [flag, str(value)]


def _options(encoding):
    """(base flags, the published model's label, [(field, published value)]) of every option an
    encoding's model takes: its config's, the general position flags, and the segment bias's."""
    base = ["--position-encoding", encoding]
    model = _build(*base)
    scheme, head_dim = model.encoder.position_encoding, model.encoder.layers[0].self_attn.head_dim
    published = {**scheme.published_options(), "attention_head_dim": head_dim}
    fields = list(dataclasses.fields(scheme.config)) if scheme.config else []
    fields += [f for f in dataclasses.fields(PosencConfig) if not f.name.startswith("_")]
    yield base, model_label(model), [(f, published.get(f.name, f.default)) for f in fields if "needs" not in f.metadata]
    for switch in sorted({f.metadata["needs"] for f in fields if "needs" in f.metadata}):  # --randomized-positions
        switched = base + _flag(switch, True)
        yield switched, model_label(_build(*switched)), [(f, f.default) for f in fields
                                                         if f.metadata.get("needs") == switch]
    with_segments = base + ["--segment-attention"]
    segments = _build(*with_segments)
    yield with_segments, model_label(segments), [(f, f.default) for f in dataclasses.fields(SegmentBias.config)]


def _assert_the_same_model(published, other, what):
    """What UNLABELLED claims of an option: the model computes the same (its log-probs on a batch,
    bit for bit) and learns the same (its gradients, to 1e-3 of the model's largest: the adjoint
    method backpropagates through its own rk4 solve of the adjoint ODE, whose error at a step of
    dt / 5 is far below that; a gradient that is 0 but for rounding, as the keys' bias has, is
    compared at the model's scale, not its own)."""
    batch = toy_batch(published.encoder.dictionary, [5, 3], tgt_len=4)
    grads = []
    for model in (published, other):
        torch.manual_seed(0)  # the same dropout
        lprobs = full_log_probs(model.train(), *batch)
        lprobs.mean().backward()
        grads.append({name: p.grad for name, p in model.named_parameters() if p.grad is not None})
    with torch.no_grad():
        assert torch.equal(full_log_probs(published.eval(), *batch), full_log_probs(other.eval(), *batch)), what
    assert grads[0].keys() == grads[1].keys(), what
    scale = magnitude(*grads[0].values())
    for name, grad in grads[0].items():
        assert_within(grads[1][name], grad, 1e-3 * scale, f"{what}: {name}")


def test_every_option_of_every_encoding_changes_its_label(tmp_path):
    """Each option set away from its published value, one at a time, for every encoding: the label
    names it (by its short name or its flag, with the value), unless the option is in UNLABELLED,
    where the label stays. An option the model refuses as changing nothing is not its option."""
    vanilla = str(tmp_path / "vanilla.pt")
    torch.save({"model": _build("--position-encoding", "sinusoidal").state_dict()}, vanilla)
    walked, refused, told_apart = set(), [], set()
    for encoding in POSITION_ENCODINGS:
        for base, published_label, options in _options(encoding):
            for field, published in options:
                if field.name == "position_encoding":
                    continue
                walked.add(field.name)
                for value in _alternatives(field, published, vanilla):
                    try:
                        model = _build(*base, *_flag(field.name, value))
                    except PosencError as error:
                        if "would change nothing" in str(error):  # not an option of this model
                            refused.append((encoding, field.name))
                            break
                        continue  # a value this option refuses here: the next one
                    except ValueError:
                        continue
                    got = model_label(model)
                    if field.name in UNLABELLED:
                        assert got == published_label, (encoding, field.name, value, got)
                        _assert_the_same_model(_build(*base), model, f"{encoding} --{field.name} {value}")
                    else:
                        shown = describe(field, True if field.name == "floater_init_from" else value)
                        assert got != published_label and shown in model_forms(model), (
                            encoding, field.name, value, got)
                    others = _alternatives(field, published, vanilla)
                    for neighbour in _neighbours(field, value, published, others):
                        try:
                            other = model_label(_build(*base, *_flag(field.name, neighbour)))
                        except ValueError:  # not a value of this option (PosencError too)
                            continue
                        # two values, two labels, neither the published form's
                        assert len({got, other, published_label}) == 3, (encoding, field.name, value, neighbour, got)
                        told_apart.add(field.name)
                    break
                else:
                    pytest.fail(f"{encoding}: no value of --{field.name} builds a model: "
                                f"{_alternatives(field, published, vanilla)}")
    every = {f.name for e in POSITION_ENCODINGS.values() if e.config for f in dataclasses.fields(e.config)}
    every |= {f.name for f in dataclasses.fields(PosencConfig) + dataclasses.fields(SegmentBias.config)}
    assert walked == every - {"_name", "position_encoding"}
    # every option with a number (a switch has one other value, a file is named "warm start") was told
    # apart from its neighbour; choices where there are two other than the published
    numbers = {f.name for f in _every_field() if value_type(f) in (int, float)} - set(UNLABELLED)
    assert numbers - {"rnn_layers"} <= told_apart, numbers - told_apart  # rnn takes 1 (published) or 2
    assert {"alibi_encoder", "position_sharing", "floater_solver"} <= told_apart
    assert set(UNLABELLED) <= every  # no stale reason
    # --keep-input-positions: refused where the encoding keeps fairseq's input embedding anyway
    assert {e for e, name in refused} == {e for e, s in POSITION_ENCODINGS.items() if s.input_embedding}
    assert {name for e, name in refused} == {"keep_input_positions"}


# --- through fairseq-train: checkpoints labelled without their data; FLOATER's C on resume -------

MODEL = ["--arch", "transformer_posenc", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim",
         "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
         "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--optimizer", "adam", "--lr", "1e-3",
         "--max-tokens", "400", "--seed", "1", "--num-workers", "0", "--no-epoch-checkpoints", "--cpu",
         "--disable-validation", "--no-progress-bar"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("labels")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (60, 3, 8), "valid": (8, 3, 8)})
    data = preprocess_here(prefixes, str(root / "bin"))
    d = {name: str(root / name) for name in ("vanilla", "warm", "shaw", "rnn")}
    vanilla = os.path.join(d["vanilla"], "checkpoint_last.pt")
    floater = [*MODEL, "--position-encoding", "floater", "--floater-solve-every", "2"]
    jobs = [
        ("vanilla", "fairseq-train", train_command(data, d["vanilla"], [*MODEL, "--max-update", "2"])),
        ("warm", "fairseq-train", train_command(data, d["warm"], [*floater, "--floater-init-from", vanilla,
                                                                  "--max-update", "2"])),
        # resumed from checkpoint_last.pt without --floater-init-from, first asking for another C
        ("another C", "fairseq-train", train_command(data, d["warm"], [*floater, "--floater-lr-scale", "2",
                                                                       "--max-update", "4"])),
        ("resumed", "fairseq-train", train_command(data, d["warm"], [*floater, "--max-update", "4"])),
        ("shaw", "fairseq-train", train_command(data, d["shaw"], [*MODEL, "--position-encoding", "shaw",
                                                                  "--max-relative-distance", "4", "--max-update", "1"])),
        ("rnn", "fairseq-train", train_command(data, d["rnn"], [*MODEL, "--position-encoding", "rnn",
                                                                "--rnn-layers", "2", "--max-update", "1"])),
    ]
    results = run_all(jobs, str(root / "runs"))
    # the data moves away: labels come from the checkpoints alone
    shutil.move(data, str(root / "moved"))
    return root, d, results


def _labels(*paths):
    return subprocess.run([sys.executable, "-m", "fairseq_posenc.labels", *paths], capture_output=True, text=True)


def test_checkpoints_are_labelled_from_their_contents_without_their_data(trained):
    root, d, results = trained
    for name in ("vanilla", "shaw", "rnn", "resumed"):
        outcome(results, name)
    done = _labels(*(os.path.join(d[name], "checkpoint_last.pt") for name in ("vanilla", "shaw", "rnn", "warm")))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["sinusoidal", "shaw (--max-relative-distance 4)", "rnn (--rnn-layers 2)",
                                        "floater (warm start, solve every 2)"]


def test_a_checkpoint_without_a_label_is_refused_naming_the_file(trained):
    root, d, _ = trained
    broken = root / "broken.pt"
    broken.write_bytes(open(os.path.join(d["shaw"], "checkpoint_last.pt"), "rb").read()[:1000])
    done = _labels(os.path.join(d["shaw"], "checkpoint_last.pt"), str(broken))
    assert done.returncode == 2 and done.stdout.splitlines() == ["shaw (--max-relative-distance 4)"]
    assert done.stderr.splitlines()[-1].startswith(f"labels.py: error: {broken}: no label: ")
    assert "Traceback" not in done.stderr


def test_a_warm_started_run_resumed_without_the_flag_keeps_its_lr_scale_and_label(trained):
    """Warm-started, N = 2: C = 1 (floater/schedule.py's lr_scale). Resumed without --floater-init-from,
    the flags alone would give C = min(N, 10) = 2: the weights' C stays, and so does the label. A
    resume that asks for another C is refused, naming both."""
    root, d, results = trained
    refused = results["another C"]
    assert not refused["ok"] and ("PosencError: --floater-lr-scale 2: the FLOATER weights loaded were trained with "
                                  "--floater-lr-scale 1; drop the flag") in refused["error"]
    outcome(results, "resumed")
    state = torch.load(os.path.join(d["warm"], "checkpoint_last.pt"), map_location="cpu", weights_only=False)
    assert state["extra_state"]["train_iterator"]["epoch"] >= 1 and state["optimizer_history"][-1]["num_updates"] == 4
    ode = "encoder.position_encoding.ode."
    assert float(state["model"][ode + "dynamics._extra_state"]) == 1.0  # C
    assert state["model"][ode + "_extra_state"].tolist() == [2.0, 1.0]  # N, warm-started
