"""Every value of the plugin's flags is taken or refused, through fairseq-train, in one line that
names the flag: the walk over every option the plugin adds to fairseq-train's parser (found in the
real parsers: fairseq's with the plugin's models and criterions selected, less fairseq's own without
the plugin), with values it must refuse (of another type, out of its range, not one of its values),
derived from the option's type and its declared values (fairseq_posenc/positions/values.py); an
unknown or misspelled plugin flag, in fairseq-train and fairseq-generate, in one line with the flag
meant; and --no-token-positional-embeddings with every encoding. All runs in one process
(tests/helpers/fairseq_runs.py)."""
import json
import math
import re
import subprocess
import sys

import pytest
from fairseq import options as fairseq_options
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.models import ARCH_MODEL_INV_REGISTRY, MODEL_REGISTRY
from fairseq.tasks.translation import TranslationConfig

from posenc_workflow import pipeline, toy_data
from fairseq_posenc.options import plugin_options
from fairseq_posenc.positions import POSITION_ENCODINGS
from fairseq_posenc.positions.values import declared, value_type
from helpers.fairseq_runs import generate_command, preprocess_here, run_all, train_command
from helpers.registries import fairseq_base, plugin, registered
from helpers.toy import TINY, build_model, model_args

TRAIN = ["--arch", "transformer_posenc", "--cpu", *TINY, "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "300",
         "--max-update", "1", "--no-progress-bar", "--num-workers", "0", "--disable-validation", "--no-save"]

#: what each plugin criterion needs to be built besides its selector (its values walked after it)
CRITERION_NEEDS = {"relation_distillation": lambda teacher: ["--teacher-path", teacher, "--relation-heads", "4"]}

#: a record of fairseq's log in its CLI's format: the only lines of a refused run's output (stdout and
#: stderr) other than its refusal. Python's warnings are off in the runs (PYTHONWARNINGS=ignore): hydra's
#: deprecation warnings, printed where fairseq composes its config, are not the plugin's.
LOG_RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| [A-Z]+ \| [\w.]+ \| ")

_OWN_OPTIONS = r"""
import json, sys
from fairseq import options
found = set()
for arch, criterion in json.loads(sys.argv[1]):
    parser = options.get_training_parser()
    options.parse_args_and_arch(parser, ["data", "--arch", arch, "--criterion", criterion], parse_known=True)
    found |= set(parser._option_string_actions)
print(json.dumps(sorted(found)))
"""


def parser_options():
    """The options of fairseq-train's parser with each plugin model and criterion selected, less
    fairseq's own (its parser without the plugin, in a fresh process, with the fairseq model and
    criterion they extend)."""
    ours, theirs = set(), []
    for model in [cls for cls in MODEL_REGISTRY.values() if plugin(cls)]:
        for criterion in [cls for cls in CRITERION_REGISTRY.values() if plugin(cls)]:
            parser = fairseq_options.get_training_parser()
            fairseq_options.parse_args_and_arch(parser, [
                "data", "--user-dir", pipeline.USER_DIR, "--arch", ARCH_MODEL_INV_REGISTRY[registered(
                    MODEL_REGISTRY, model)][0], "--criterion", registered(CRITERION_REGISTRY, criterion)],
                parse_known=True)
            ours |= set(parser._option_string_actions)
            theirs.append((ARCH_MODEL_INV_REGISTRY[fairseq_base(MODEL_REGISTRY, model)][0],
                           fairseq_base(CRITERION_REGISTRY, criterion)))
    own = subprocess.run([sys.executable, "-c", _OWN_OPTIONS, json.dumps(theirs)], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    return {flag for flag in ours - set(json.loads(own)) if flag.startswith("--")}


OPTIONS = plugin_options()  # {flag: (field, what selects it)}: the options the plugin's flag errors know


def _walked_args(*flags):
    """The model's configuration in the walk's runs (TRAIN's sizes, the positions of fairseq's
    translation task), with ``flags``: the bounds of values derived from the model are its."""
    return model_args("transformer_posenc", *flags, max_positions=TranslationConfig().max_source_positions)


def invalid_values(field, tmp_path):
    """Values the option must refuse; none for a switch (it takes no value). None for an option with
    a value and no declared values: its check is missing (the walk fails on it)."""
    kind, spec = value_type(field), declared(field)
    if kind is bool:
        return []
    if spec is None:
        return None
    if spec.subset:
        return ["nonsense", f"{spec.choices[0]},{spec.choices[0]}"]
    if spec.choices:
        return ["nonsense"]
    if spec.file:  # a path: its file is checked where it is read (test_floater.py)
        return [""]
    if spec.token:
        return ["two words"]
    if spec.layer:  # an index: its range is checked where the model is known
        return ["1.5", "99"]
    args = _walked_args()
    low, high = spec.low_of(args), spec.high_of(args)
    if kind is float:  # the nearest numbers past the bounds
        outside = [low if spec.above else math.nextafter(low, -math.inf)]
        outside += [math.nextafter(high, math.inf)] if high is not None else []
        return ["abc", "inf"] + [repr(v) for v in outside]
    outside = [low if spec.above else low - 1] + ([high + 1] if high is not None else [])
    return ["1.5"] + [str(v) for v in outside]


#: the flags of the issue that stopped under a traceback, with their one line
ONE_LINE = {
    ("--floater-solver", "nonsense"): "--floater-solver 'nonsense' is not a torchdiffeq method; choose one of euler,",
    ("--alibi-encoder", "nonsense"): "--alibi-encoder 'nonsense' is not a form; choose one of symmetric, split, "
                                     "crossed",
    ("--t5-num-buckets", "0"): "--t5-num-buckets must be at least 4 (the encoder's two sides each need an exact and "
                               "a log-spaced bucket), got 0",
    ("--t5-max-distance", "-5"): "--t5-max-distance must exceed --t5-num-buckets / 2 = 16 (the distances the "
                                 "decoder's exact buckets cover), got -5",
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
    # the criterion's (issue 53): a traceback, or trained
    ("--relation-heads", "0"): "--relation-heads must be positive, got 0",
    ("--relation-heads", "3"): "--relation-heads 3 must divide both attention widths, the teacher's (32) and the "
                               "student's (32); choose one of 1, 2, 4, 8, 16, 32",
    ("--teacher-encoder-layer", "99"): "--teacher-encoder-layer 99: the teacher's encoder has 2 layers; choose from "
                                       "-2 to 1 (-1 is the last)",
    ("--student-decoder-layer", "-3"): "--student-decoder-layer -3: the student's decoder has 2 layers; choose from "
                                       "-2 to 1 (-1 is the last)",
    ("--relation-weight", "-1"): "--relation-weight must be a positive finite number (at 0 use --criterion "
                                 "label_smoothed_cross_entropy), got -1.0",
    ("--relation-weight", "nan"): "--relation-weight must be a positive finite number (at 0 use --criterion "
                                  "label_smoothed_cross_entropy), got nan",
    # a weight 0 is plain label-smoothed cross-entropy: a flag that changes nothing
    ("--relation-weight", "0"): "--relation-weight must be a positive finite number (at 0 use --criterion "
                                "label_smoothed_cross_entropy), got 0.0",
    ("--relations", "qq,qq"): "--relations must be a comma-separated list of qq, kk, vv, each once, got 'qq,qq'",
}


#: issue 53's values past a bound derived from the model's sizes, the machine's memory or float32
#: (fairseq_posenc/positions/float_bounds.py), with the encoding that takes the flag: (its flags, flag,
#: value); 1e12 tried to allocate 64 TB, the others trained into NaN or stopped under a traceback
BOUNDED = [
    (["--position-encoding", "shaw"], "--max-relative-distance", "1000000000000"),
    (["--position-encoding", "diet_rel"], "--max-relative-distance", "1000000000000"),
    ([], "--attention-head-dim", "1000000000000"),
    (["--position-encoding", "t5"], "--position-bias-scale", "1e300"),
    (["--position-encoding", "diet_rel"], "--position-bias-scale", "1e-300"),
    (["--position-encoding", "t5"], "--position-bias-scale", "0"),
    (["--position-encoding", "floater"], "--floater-dt", "1e300"),
    (["--position-encoding", "floater"], "--floater-dt", "1e-300"),
    (["--position-encoding", "floater"], "--floater-dt", "-1"),
    (["--position-encoding", "floater"], "--floater-step", "1e300"),
    (["--position-encoding", "floater"], "--floater-step", "1e-300"),
]


def _bounded_line(flags, flag, value):
    """The refusal of ``value``, with the range its declared bounds derive for the run's model."""
    field = OPTIONS[flag][0]
    spec, kind, args = declared(field), value_type(field), _walked_args(*flags)
    low, high = spec.low_of(args), spec.high_of(args)
    usable = f"a finite number >= {low:g} and <= {high:g}" if kind is float else f"from {low} to {high}"
    return f"{flag} must be {usable} ({spec.why}), got {kind(value)}"


#: (name, program, its flags after the data): unknown and misplaced plugin flags
UNKNOWN = [
    ("train --rope-thetaa", "fairseq-train", [*TRAIN, "--rope-thetaa", "5"],
     "unrecognized arguments: --rope-thetaa 5; did you mean --rope-theta?"),
    ("train --relation-weigth", "fairseq-train", [*TRAIN, "--criterion", "relation_distillation", "--relation-weigth",
                                                  "2"],
     "unrecognized arguments: --relation-weigth 2; did you mean --relation-weight?"),
    ("train --relation-heads without its criterion", "fairseq-train", [*TRAIN, "--relation-heads", "4"],
     "unrecognized arguments: --relation-heads 4; --relation-heads is an option of --criterion relation_distillation"),
    ("train two misspelt", "fairseq-train", [*TRAIN, "--rope-thetaa", "5", "--segment-attentio"],
     "unrecognized arguments: --rope-thetaa 5 --segment-attentio; --rope-thetaa: did you mean --rope-theta?; "
     "--segment-attentio: did you mean --segment-attention?"),
    ("generate --rope-thetaa", "fairseq-generate", ["--rope-thetaa", "5"],
     "unrecognized arguments: --rope-thetaa 5; did you mean --rope-theta? --rope-theta is a training option "
     "(fairseq-train --arch transformer_posenc): fairseq-generate takes the model's options from its checkpoint"),
]


def _generate_flags(flag):
    field, _ = OPTIONS[flag]
    return [flag] if value_type(field) is bool else [flag, "1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run of an encoding's option is refused while fairseq parses its options, before the data
    directory (absent here) is read: a refusal that came later would fail on the missing data
    instead. A criterion's options are walked on toy data with a teacher trained first (some are
    checked where the criterion is built, against the teacher and the student)."""
    root = tmp_path_factory.mktemp("flag_values")
    data = str(root / "no data")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (60, 3, 10), "valid": (10, 3, 10),
                                                              "test": (10, 3, 10)})
    toy = preprocess_here(prefixes, str(root / "bin"))
    teacher = str(root / "teacher" / "checkpoint_last.pt")
    jobs = [("teacher", "fairseq-train", train_command(toy, str(root / "teacher"), [
        *[f for f in TRAIN if f != "--no-save"], "--no-epoch-checkpoints"]))]
    walked = {}
    for flag, (field, _) in OPTIONS.items():
        for value in invalid_values(field, root) or []:
            walked[(flag, value)] = f"{flag} {value}"
    for (flag, value) in ONE_LINE:
        walked.setdefault((flag, value), f"{flag} {value}")
    for (flag, value), name in walked.items():
        selector = OPTIONS[flag][1].split()
        if selector[0] == "--criterion":
            jobs.append((name, "fairseq-train", train_command(toy, str(root / "save"), [
                *TRAIN, *selector, *CRITERION_NEEDS[selector[1]](teacher), flag, value])))
        else:
            jobs.append((name, "fairseq-train", train_command(data, str(root / "save"), [*TRAIN, flag, value])))
    for flags, flag, value in BOUNDED:
        jobs.append((f"bound {' '.join(flags)} {flag} {value}", "fairseq-train", train_command(
            data, str(root / "save"), [*TRAIN, *flags, flag, value])))
    for name, program, flags, _ in UNKNOWN:
        command = train_command(data, str(root / "save"), flags) if program == "fairseq-train" else (
            generate_command(data, str(root / "x.pt"), flags))
        jobs.append((name, program, command))
    for flag in OPTIONS:
        jobs.append((f"generate {flag}", "fairseq-generate", generate_command(data, str(root / "x.pt"),
                                                                              _generate_flags(flag))))
    jobs.append(("train --lrr", "fairseq-train", train_command(data, str(root / "save"), [*TRAIN, "--lrr", "5"])))
    for encoding in POSITION_ENCODINGS:
        jobs.append((f"{encoding} without positions", "fairseq-train", train_command(
            data, str(root / "save"), [*TRAIN, "--position-encoding", encoding, "--no-token-positional-embeddings"])))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONWARNINGS", "ignore")
        results = run_all(jobs, str(root / "runs"))
    return walked, results, root


def _one_line(result, name, program="fairseq-train"):
    """The refusal of a refused run: its output (stdout and stderr) less fairseq's log records
    (:data:`LOG_RECORD`) is exactly one line, the program's error."""
    assert not result["ok"], f"{name}: taken"
    lines = [line for line in (result["stdout"] + result["stderr"]).splitlines() if not LOG_RECORD.match(line)]
    assert len(lines) == 1 and lines[0].startswith(f"{program}: error: "), (
        f"{name}: {len(lines)} lines:\n" + "\n".join(lines)[-3000:])
    return lines[0]


def test_the_walk_covers_every_option_the_plugin_adds_to_fairseqs_parser():
    """The options found in the parsers are those the plugin's flag errors know
    (fairseq_posenc/options.py): of each kind, and none of fairseq's own."""
    found = parser_options()
    assert found == set(OPTIONS)
    assert {"--position-encoding", "--rope-theta", "--segment-attention", "--relation-heads",
            "--teacher-encoder-layer"} <= found
    assert not {"--encoder-layers", "--label-smoothing", "--lr"} & found


def test_every_option_refuses_each_invalid_value_in_one_line_naming_the_flag(runs):
    walked, results, root = runs
    assert "teacher" in results and results["teacher"]["ok"], results["teacher"].get("error", "")[-3000:]
    for flag, (field, _) in OPTIONS.items():
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


@pytest.mark.parametrize("flags, flag, value", BOUNDED, ids=[" ".join([*b[0], b[1], b[2]]) for b in BOUNDED])
def test_a_value_past_its_derived_bound_is_refused_in_one_line(runs, flags, flag, value):
    _, results, _ = runs
    name = f"bound {' '.join(flags)} {flag} {value}"
    line = _one_line(results[name], name)
    assert line == "fairseq-train: error: " + _bounded_line(flags, flag, value)


@pytest.mark.parametrize("name, program, flags, line", UNKNOWN, ids=[u[0] for u in UNKNOWN])
def test_an_unknown_plugin_flag_gets_one_line_with_the_flag_meant(runs, name, program, flags, line):
    _, results, _ = runs
    assert _one_line(results[name], name, program) == f"{program}: error: {line}"


@pytest.mark.parametrize("flag", sorted(OPTIONS))
def test_fairseq_generate_says_a_plugin_flag_is_a_training_option(runs, flag):
    _, results, _ = runs
    given = " ".join(_generate_flags(flag))
    assert _one_line(results[f"generate {flag}"], flag, "fairseq-generate") == (
        f"fairseq-generate: error: unrecognized arguments: {given}; {flag} is a training option (fairseq-train "
        f"{OPTIONS[flag][1]}): fairseq-generate takes the model's options from its checkpoint")


def test_a_misspelled_flag_of_fairseqs_own_keeps_fairseqs_usage(runs):
    """Only flags that look like the plugin's are shortened: --lrr's closest option is fairseq's --lr."""
    _, results, _ = runs
    output = results["train --lrr"]["stderr"]
    assert output.startswith("usage: fairseq-train ") and len(output.splitlines()) > 100
    assert output.rstrip().endswith("fairseq-train: error: unrecognized arguments: --lrr 5")


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
