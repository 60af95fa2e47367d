"""What a re-run of a recipe redoes, table-driven: each row changes one declared input or setting
of a finished run and lists the training stages that must run again (and from which update), or
the refusal; nothing else may train. fairseq-train is a stub here (tests/stubs/fairseq-train:
checkpoints with one fake weight), so the table is fast; tests/test_recipe_floater.py and
tests/test_recipes.py run the same recipes with fairseq itself."""
import json
import os
import shutil
import subprocess

import pytest

from fairseq_posenc import pipeline, toy_data

REPO = os.path.dirname(pipeline.USER_DIR)
STUBS = os.path.join(REPO, "tests", "stubs")
FLOATER = os.path.join(REPO, "recipes", "floater", "train.sh")
# vanilla to update 6, FLOATER to update 4 (its one epoch is longer: the stub's epochs are 1000)
BASE = {"DEVICE": "cpu", "MAX_UPDATE": "6", "FLOATER_EPOCHS": "1", "FLOATER_MAX_UPDATE": "4",
        "SAVE_INTERVAL_UPDATES": "1", "AVERAGE": "2", "WARMUP": "3", "LR": "2e-3", "MAX_TOKENS": "200",
        "UPDATE_FREQ": "1", "EXTRA_FLAGS": "--seed 1", "OMP_NUM_THREADS": "1"}


def _corpus(directory, seed):
    prefixes = toy_data.write_toy_corpus(os.path.join(directory, "raw"), {"train": (300, 3, 8), "valid": (30, 3, 8)},
                                         seed=seed)
    return pipeline.preprocess(prefixes, os.path.join(directory, "bin"))


def _run(out, data_bin, log, **env):
    path = f"{STUBS}:{os.path.join(REPO, '.venv', 'bin')}:{os.environ['PATH']}"
    full = {**os.environ, **BASE, "DATA_BIN": data_bin, "OUT": out, "STUB_LOG": log, "PATH": path, **env}
    return subprocess.run(["bash", FLOATER], env=full, capture_output=True, text=True)


def _calls(log):
    """(stage, from, to) of each stub fairseq-train call."""
    if not os.path.isfile(log):
        return []
    with open(log, encoding="utf-8") as f:
        return [(os.path.basename(c["save_dir"]), c["from"], c["to"]) for c in map(json.loads, f)]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished FLOATER protocol run (vanilla 0-6, FLOATER 0-4) and its corpus."""
    base = tmp_path_factory.mktemp("finished")
    data_bin = _corpus(str(base / "corpus"), seed=1)
    log = str(base / "calls.jsonl")
    proc = _run(str(base / "run"), data_bin, log)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _calls(log) == [("vanilla", 0, 6), ("floater", 0, 4)]
    return base, data_bin


def _copy_bin(data_bin, target):
    shutil.copytree(data_bin, target)
    return str(target)


def _other_corpus_at_the_same_path(data_bin, tmp_path):
    other = _corpus(str(tmp_path / "other"), seed=2)
    shutil.rmtree(data_bin)
    shutil.copytree(other, data_bin)
    return data_bin


def _remove(*parts):
    def change(out):
        os.remove(os.path.join(out, *parts))
    return change


def _interrupted_floater(out):
    """FLOATER's stage preempted after its update 3: its last checkpoint at 3, its record unfinished."""
    record_path = os.path.join(out, "floater", "stage.json")
    with open(record_path) as f:
        record = json.load(f)
    record["finished"] = False
    with open(record_path, "w") as f:
        json.dump(record, f)
    shutil.copy(os.path.join(out, "floater", "checkpoint_1_3.pt"), os.path.join(out, "floater", "checkpoint_last.pt"))


# id: (environment changed, change to the run's directory, change to the corpus, expected calls or refusal)
ROWS = {
    "nothing changed: nothing trains (fairseq would train one update more)": ({}, None, None, []),
    "a larger MAX_UPDATE: vanilla resumes, FLOATER starts over from the new vanilla":
        ({"MAX_UPDATE": "8"}, None, None, [("vanilla", 6, 8), ("floater", 0, 4)]),
    "a larger FLOATER_MAX_UPDATE: FLOATER resumes, vanilla stays":
        ({"FLOATER_MAX_UPDATE": "5"}, None, None, [("floater", 4, 5)]),
    "another lr: refused, nothing trains":
        ({"LR": "1e-3"}, None, None, "holds checkpoints of a run with other settings (settings changed: lr 2e-3 -> 1e-3"),
    "a smaller MAX_UPDATE: refused (the averaged window would not be the stage's last)":
        ({"MAX_UPDATE": "4"}, None, None, "was trained to update 6 (epoch 0 finished), past the budget asked now"),
    "the same corpus at another path: nothing trains": ({}, None, "copy", []),
    "another corpus at the same path: refused (the data changed)":
        ({}, None, "other", "holds checkpoints of a run with other settings (settings changed: data "),
    "checkpoints with no record (an older recipe's): refused":
        ({}, _remove("vanilla", "stage.json"), None, "holds checkpoints but no record of the settings"),
    "no record, ADOPT_RUN=1: vanilla adopted as finished, FLOATER starts over from it":
        ({"ADOPT_RUN": "1"}, _remove("vanilla", "stage.json"), None, [("floater", 0, 4)]),
    "FLOATER preempted: it resumes where it stopped, vanilla stays":
        ({}, _interrupted_floater, None, [("floater", 3, 4)]),
}


@pytest.mark.parametrize("row", list(ROWS), ids=list(ROWS))
def test_a_rerun_redoes_exactly_the_stages_that_depend_on_what_changed(finished, tmp_path, row):
    env, change_run, change_corpus, expected = ROWS[row]
    base, data_bin = finished
    out = str(tmp_path / "run")
    shutil.copytree(base / "run", out)
    if change_corpus == "copy":
        data_bin = _copy_bin(data_bin, tmp_path / "elsewhere" / "bin")
    elif change_corpus == "other":
        data_bin = _other_corpus_at_the_same_path(_copy_bin(data_bin, tmp_path / "bin"), tmp_path)
    else:
        # the run recorded its corpus by content: a copy is the same corpus (and the module's stays intact)
        data_bin = _copy_bin(data_bin, tmp_path / "bin")
    if change_run:
        change_run(out)
    log = str(tmp_path / "calls.jsonl")
    proc = _run(out, data_bin, log, **env)
    if isinstance(expected, str):
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert expected in proc.stderr, proc.stderr
        assert _calls(log) == []
    else:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert _calls(log) == expected, proc.stdout
        # the average is always of the FLOATER stage's last two interval checkpoints
        assert "== 3/3 averaging the last 2 interval checkpoints" in proc.stdout
    with open(os.path.join(out, "vanilla", "train.log")) as f:
        assert f.read().count("== ") >= 2  # appended to, never truncated: the first run's lines are still there
