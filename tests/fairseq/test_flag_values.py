"""Every value of the plugin's flags is taken or refused, through fairseq-train, in one line that
names the flag: the walk over every option of every encoding's configuration with values it must
refuse (of another type, out of its range, not one of its values), derived from the option's type
and its declared values (fairseq_posenc/positions/values.py), each refused while fairseq parses its
options; and --no-token-positional-embeddings with every encoding. All runs in one process
(tests/helpers/fairseq_runs.py)."""
import argparse
import dataclasses

import pytest

from fairseq_posenc.models.config import PosencConfig
from fairseq_posenc.positions import POSITION_ENCODINGS
from fairseq_posenc.positions.segments import SegmentBias
from fairseq_posenc.positions.values import declared, value_type
from helpers.fairseq_runs import run_all, train_command
from helpers.toy import TINY, build_model

TRAIN = ["--arch", "transformer_posenc", "--cpu", *TINY, "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "300",
         "--max-update", "1", "--no-progress-bar", "--num-workers", "0", "--disable-validation", "--no-save"]


def every_option():
    """The fields of every encoding's configuration, of the segment bias's and the general ones, each
    name once."""
    configs = [s.config for s in POSITION_ENCODINGS.values() if s.config] + [SegmentBias.config, PosencConfig]
    options = {}
    for config in configs:
        for f in dataclasses.fields(config):
            if not f.name.startswith("_"):
                options.setdefault(f.name, f)
    return list(options.values())


def _defaults():
    return argparse.Namespace(**{f.name: f.default for f in every_option()})


def invalid_values(field, tmp_path):
    """Values the option must refuse; none for a switch (it takes no value). None for an option with
    a value and no declared values: its check is missing (the walk fails on it)."""
    kind, spec = value_type(field), declared(field)
    if kind is bool:
        return []
    if spec is None:
        return None
    if spec.choices:
        return ["nonsense"]
    if spec.file:  # a path: its file is checked where it is read (test_floater.py)
        return [""]
    if spec.token:
        return ["two words"]
    low = spec.low_of(_defaults())
    outside = [low if spec.above else low - 1] + ([spec.high + 1] if spec.high is not None else [])
    wrong_type = ["1.5"] if kind is int else ["abc", "inf"]
    return wrong_type + [str(kind(v)) for v in outside]


#: the flags of the issue that stopped under a traceback, with their one line
ONE_LINE = {
    ("--floater-dt", "-1"): "--floater-dt must be a positive finite number, got -1.0",
    ("--floater-solver", "nonsense"): "--floater-solver 'nonsense' is not a torchdiffeq method; choose one of euler,",
    ("--alibi-encoder", "nonsense"): "--alibi-encoder 'nonsense' is not a form; choose one of symmetric, split, "
                                     "crossed",
    ("--t5-num-buckets", "0"): "--t5-num-buckets must be at least 4 (the encoder's two sides each need an exact and "
                               "a log-spaced bucket), got 0",
    ("--t5-max-distance", "-5"): "--t5-max-distance must exceed --t5-num-buckets / 2 = 16 (the distances the "
                                 "decoder's exact buckets cover), got -5",
    ("--position-bias-scale", "0"): "--position-bias-scale must be a positive finite number, got 0.0",
    # TINY's head size 8: the bound is float32's smallest normal number (positions/float_bounds.py)
    ("--rope-theta", "-1"): "--rope-theta must be a finite number >= 1.17549e-38 (below it the last position's "
                            "rotation angles overflow float32), got -1.0",
    # issue 53: taken, then NaN in training
    ("--rope-theta", "1e-300"): "--rope-theta must be a finite number >= 1.17549e-38 (below it the last position's "
                                "rotation angles overflow float32), got 1e-300",
    ("--floater-lr-scale", "1e-300"): "--floater-lr-scale must be a finite number >= 1.17549e-38 (the weights are "
                                      "stored as W / C in float32), got 1e-300",
    # a width the model would not have built: the attention width was built and labelled as 0
    ("--floater-hidden", "0"): "--floater-hidden must be positive, got 0",
    ("--floater-hidden", "-1"): "--floater-hidden must be positive, got -1",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run is refused while fairseq parses its options, before the data directory (absent
    here) is read: a refusal that came later would fail on the missing data instead."""
    root = tmp_path_factory.mktemp("flag_values")
    data = str(root / "no data")
    jobs, walked = [], {}
    for field in every_option():
        flag = "--" + field.name.replace("_", "-")
        for value in invalid_values(field, root) or []:
            walked[(flag, value)] = f"{flag} {value}"
    for (flag, value) in ONE_LINE:
        walked.setdefault((flag, value), f"{flag} {value}")
    for (flag, value), name in walked.items():
        jobs.append((name, "fairseq-train", train_command(data, str(root / "save"), [*TRAIN, flag, value])))
    for encoding in POSITION_ENCODINGS:
        jobs.append((f"{encoding} without positions", "fairseq-train", train_command(
            data, str(root / "save"), [*TRAIN, "--position-encoding", encoding, "--no-token-positional-embeddings"])))
    return walked, run_all(jobs, str(root / "runs")), root


def _one_line(result, name):
    """The error line of a refused run: its stderr's last, the only error and no traceback (fairseq's
    first run in a process that reaches its config may print hydra's deprecation warnings before)."""
    assert not result["ok"], f"{name}: taken"
    lines = result["stderr"].strip().splitlines()
    assert "Traceback" not in result["stderr"] and [line for line in lines if "error" in line] == lines[-1:], (
        f"{name}:\n{result['stderr'][-3000:]}")
    return lines[-1]


def test_every_option_refuses_each_invalid_value_in_one_line_naming_the_flag(runs):
    walked, results, root = runs
    options = every_option()
    assert {f.name for f in options} >= {f.name for s in POSITION_ENCODINGS.values() if s.config
                                         for f in dataclasses.fields(s.config) if not f.name.startswith("_")}
    for field in options:
        flag = "--" + field.name.replace("_", "-")
        values = invalid_values(field, root)
        assert values is not None, f"{flag} declares no values (field metadata 'values', positions/values.py)"
        assert values or value_type(field) is bool
        for value in values:
            name = walked[(flag, value)]
            line = _one_line(results[name], name)
            # ours ("--flag ...") or argparse's for a value not of the flag's type ("argument --flag: ...")
            assert line.startswith((f"fairseq-train: error: {flag} ", f"fairseq-train: error: {flag}: ",
                                    f"fairseq-train: error: argument {flag}: ")), (name, line)


@pytest.mark.parametrize("flag, value", list(ONE_LINE))
def test_the_issues_values_end_in_one_line(runs, flag, value):
    walked, results, _ = runs
    name = walked[(flag, value)]
    assert _one_line(results[name], name).startswith("fairseq-train: error: " + ONE_LINE[(flag, value)])


@pytest.mark.parametrize("encoding", list(POSITION_ENCODINGS))
def test_no_token_positional_embeddings_is_refused_but_with_none(runs, encoding):
    """Where the encoding is built on fairseq's input embedding (sinusoidal, learned, floater, rnn) the
    flag removes its positions: refused naming --position-encoding none; elsewhere it changes
    nothing (the encoding drops that embedding anyway)."""
    _, results, root = runs
    name = f"{encoding} without positions"
    if encoding == "none":  # taken: parsed, it fails only on the absent data; the model has no positions
        assert not results[name]["ok"] and "no-token-positional" not in results[name]["stderr"]
        assert results[name]["error"].rstrip().endswith(f"No such file or directory: {str(root / 'no data')!r}")
        model = build_model("transformer_posenc", "--position-encoding", "none", "--no-token-positional-embeddings")
        assert model.encoder.embed_positions is None and model.decoder.embed_positions is None
        return
    line = _one_line(results[name], name)
    if POSITION_ENCODINGS[encoding].input_embedding is not None:
        assert line == (f"fairseq-train: error: --no-token-positional-embeddings would remove the "
                        f"{POSITION_ENCODINGS[encoding].input_embedding} input position embedding that "
                        f"--position-encoding {encoding} is built on: for a model without positions use "
                        "--position-encoding none")
    else:
        assert line == (f"fairseq-train: error: --no-token-positional-embeddings would change nothing: "
                        f"--position-encoding {encoding} drops fairseq's input position embedding anyway (it is "
                        "for --position-encoding none)")
    assert {e for e, s in POSITION_ENCODINGS.items() if s.input_embedding} == {"sinusoidal", "learned", "floater",
                                                                               "rnn"}
