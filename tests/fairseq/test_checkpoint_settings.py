"""A checkpoint meets other position settings through fairseq's CLI (models/checkpoint_settings.py):
fairseq-generate with --model-overrides and fairseq-train going on from checkpoint_last.pt or
starting with --finetune-from-model refuse another encoding or setting in one line naming both,
before a weight is loaded; a decode-time override that may change is logged with the label the
model decodes as. Two processes: the training runs, then every load (fairseq_runs)."""
import os
import shutil

import pytest

from posenc_workflow import toy_data
from helpers.fairseq_runs import generate_command, outcome, preprocess_here, run_all, train_command
from helpers.toy import TINY

TRAIN = ["--arch", "transformer_posenc", "--cpu", *TINY, "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500",
         "--seed", "1", "--no-epoch-checkpoints", "--no-progress-bar", "--disable-validation"]
GENERATE = ["--gen-subset", "valid", "--beam", "2", "--batch-size", "8", "--max-len-b", "10"]
TRAINED = ["rope", "none", "sinusoidal", "t5", "alibi"]

#: (name, the checkpoint's encoding, the decode's --model-overrides)
DECODES = [("rope-none", "rope", {"position_encoding": "none"}),
           ("none-rope", "none", {"position_encoding": "rope"}),
           ("sinusoidal-none", "sinusoidal", {"position_encoding": "none"}),
           ("t5-rope", "t5", {"position_encoding": "rope"}),
           ("alibi-rope", "alibi", {"position_encoding": "rope"}),
           ("rope-alibi", "rope", {"position_encoding": "alibi"}),
           ("rope-theta", "rope", {"rope_theta": 500.0}),
           ("rope-ntk", "rope", {"rope_ntk_factor": 4.0}),
           ("rope-pi", "rope", {"rope_pi_factor": 4.0}),
           ("rope-yarn", "rope", {"rope_yarn_factor": 4.0})]
#: decode-time scalings (positions/rope_scaling.py): name -> (flag, label)
SCALINGS = {"rope-ntk": ("--rope-ntk-factor", "NTK x4"), "rope-pi": ("--rope-pi-factor", "PI x4 decode-only"),
            "rope-yarn": ("--rope-yarn-factor", "YaRN x4 decode-only")}
#: (name, the checkpoint's encoding, the flags of the run going on from it, --finetune-from-model)
TRAINS = [("resume-rope-none", "rope", ["--position-encoding", "none"], False),
          ("resume-rope-theta", "rope", ["--position-encoding", "rope", "--rope-theta", "500"], False),
          ("resume-t5-rope", "t5", ["--position-encoding", "rope"], False),
          ("finetune-rope-alibi", "rope", ["--position-encoding", "alibi"], True)]
#: fairseq-train runs of their own (no checkpoint) that give a decode-only setting
FRESH = [("train-rope-pi", ["--position-encoding", "rope", "--rope-pi-factor", "4"]),
         ("resume-rope-yarn", ["--position-encoding", "rope", "--rope-yarn-factor", "4"])]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoint_settings")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (40, 3, 8), "valid": (8, 3, 8)})
    data = preprocess_here(prefixes, str(root / "bin"))
    trained = run_all([(e, "fairseq-train", train_command(data, str(root / e), [*TRAIN, "--position-encoding", e,
                                                                               "--max-update", "2"]))
                       for e in TRAINED], str(root / "train"))
    jobs, paths = [], {}
    for name, encoding, overrides in DECODES:
        path = str(root / encoding / "checkpoint_last.pt")
        jobs.append((name, "fairseq-generate", generate_command(data, path, [*GENERATE, "--model-overrides",
                                                                            repr(overrides)])))
        paths[name] = path
    for name, encoding, flags, finetune in TRAINS:
        save = root / name
        save.mkdir()
        path = str(root / encoding / "checkpoint_last.pt")
        if finetune:
            flags = [*flags, "--finetune-from-model", path]
        else:
            shutil.copy(path, save / "checkpoint_last.pt")
            path = str(save / "checkpoint_last.pt")
        jobs.append((name, "fairseq-train", train_command(data, str(save), [*TRAIN, *flags, "--max-update", "3"])))
        paths[name] = path
    for name, flags in FRESH:  # the resumed one goes on from the trained rope checkpoint
        save = root / name
        save.mkdir()
        if name.startswith("resume"):
            shutil.copy(root / "rope" / "checkpoint_last.pt", save / "checkpoint_last.pt")
        jobs.append((name, "fairseq-train", train_command(data, str(save), [*TRAIN, *flags, "--max-update", "3"])))
    results = run_all(jobs, str(root / "loads"))
    with open(root / "loads" / "runs.log") as f:
        log = f.read()
    return trained, results, paths, log


def _refusal(results, name):
    """The one line a refused run printed (fails the test where it ran or printed more)."""
    run = results[name]
    assert not run["ok"], f"{name} ran: {run['stdout'][-1000:]}"
    lines = run["stderr"].strip().splitlines()
    # the line that says what went wrong, and no other (hydra's deprecation warnings are not errors)
    assert "Traceback" not in run["stderr"] and [line for line in lines if "error" in line] == lines[-1:], (
        run["stderr"][-3000:])
    return lines[-1]


DECODE_ADVICE = ("a decode runs the model as trained: drop the position settings from --model-overrides (those a "
                 "decode may change: docs/encodings.md)")
RESUME_ADVICE = "a run goes on as the model it was trained as: give its flags, or another --save-dir for a new model"
SAVED = {"rope": "--position-encoding rope --rope-theta 10000", "none": "--position-encoding none",
         "sinusoidal": "--position-encoding sinusoidal", "t5": "--position-encoding t5 --t5-num-buckets 32 "
         "--t5-max-distance 128", "alibi": "--position-encoding alibi --alibi-encoder symmetric"}


@pytest.mark.parametrize("name, saved, overrides", [d for d in DECODES if "position_encoding" in d[2]])
def test_generate_refuses_another_encoding_in_one_line(runs, name, saved, overrides):
    trained, results, paths, _ = runs
    outcome(trained, saved)
    given = SAVED[overrides["position_encoding"]]
    assert _refusal(results, name) == (f"fairseq-generate: error: {paths[name]} was trained with {SAVED[saved]}; "
                                       f"this decode gives {given}: {DECODE_ADVICE}")


def test_generate_with_another_rope_theta_decodes_and_logs_the_label(runs):
    trained, results, paths, log = runs
    hypotheses = [line for line in outcome(results, "rope-theta")["stdout"].splitlines() if line.startswith("H-")]
    assert len(hypotheses) == 8
    assert (f"{paths['rope-theta']}: runs with --rope-theta 500 (trained with --rope-theta 10000: the spacing of "
            "positions, which a decode may rescale for inputs longer than trained); the model is rope "
            "(--rope-theta 500)") in log


@pytest.mark.parametrize("name, saved, flags, finetune", TRAINS)
def test_fairseq_train_refuses_to_go_on_as_another_model_in_one_line(runs, name, saved, flags, finetune):
    trained, results, paths, _ = runs
    outcome(trained, saved)
    given = " ".join(flags) if name != "resume-rope-theta" else "--position-encoding rope --rope-theta 500"
    if name == "resume-rope-theta":
        saved_text = SAVED["rope"]
    else:
        saved_text = SAVED[saved]
        given = SAVED[flags[1]]
    if finetune:
        expected = (f"fairseq-train: error: {paths[name]} (--finetune-from-model) was trained with {saved_text}; "
                    f"this run gives {given}: --finetune-from-model trains the same model on: give its flags "
                    "(FLOATER from a sinusoidal model: --floater-init-from)")
    else:
        expected = f"fairseq-train: error: {paths[name]} was trained with {saved_text}; this run gives {given}: " \
                   f"{RESUME_ADVICE}"
    assert _refusal(results, name) == expected


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_generate_with_a_rope_scaling_decodes_and_logs_the_label(runs, name):
    trained, results, paths, log = runs
    flag, label = SCALINGS[name]
    hypotheses = [line for line in outcome(results, name)["stdout"].splitlines() if line.startswith("H-")]
    assert len(hypotheses) == 8
    assert (f"{paths[name]}: runs with {flag} 4 (trained with {flag} 1: the spacing of positions, which a decode may "
            f"rescale for inputs longer than trained); the model is rope ({label})") in log


@pytest.mark.parametrize("name, flags", FRESH)
def test_fairseq_train_refuses_a_decode_only_scaling_in_one_line(runs, name, flags):
    _, results, _, _ = runs
    assert _refusal(results, name) == (f"fairseq-train: error: {flags[-2]} 4 is applied at decoding only: train "
                                       "without it, then give it to fairseq-generate's --model-overrides")
