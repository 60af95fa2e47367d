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
        # the vanilla stage lives in a directory named by its configuration's key (vanilla-ARCH-KEY)
        return [(os.path.basename(c["save_dir"]).split("-")[0], c["from"], c["to"]) for c in map(json.loads, f)]


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
    "another lr: refused before anything trains (FLOATER's stage is checked before the vanilla stage trains)":
        ({"LR": "1e-3"}, None, None, "run/floater holds checkpoints of another configuration: lr: [0.001] -> [0.0005] "
                                     "(lr_scheduler, model, optimization, optimizer)"),
    "a smaller MAX_UPDATE: refused (the averaged window would not be the stage's last)":
        ({"MAX_UPDATE": "4"}, None, None, "was trained to update 6 (epoch 0 finished), past the budget asked now"),
    "the same corpus at another path: nothing trains": ({}, None, "copy", []),
    "another corpus at the same path: refused (the data changed)":
        ({}, None, "other", "holds checkpoints of another configuration: data: "),
    "checkpoints with no record (an older recipe's): refused":
        ({}, _remove("vanilla", "stage.json"), None, "holds checkpoints but no record of the configuration"),
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


def test_a_stage_whose_checkpoints_finished_it_is_finished_whatever_the_exit_code(tmp_path):
    """fairseq-train killed just after its last save (or a rank aborting at teardown): the stage
    counts as finished, with a warning naming the exit code, and the protocol goes on to stage 2;
    killed before its budget, the run fails and a re-run resumes it."""
    data_bin = _corpus(str(tmp_path / "corpus"), seed=1)
    log = str(tmp_path / "calls.jsonl")
    proc = _run(str(tmp_path / "run"), data_bin, log, STUB_FAIL_IN="vanilla", STUB_FAIL_AFTER="6")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "WARNING: fairseq-train exited with code 1 after the stage finished (checkpoint_last.pt is at update 6" \
        in proc.stderr
    assert _calls(log) == [("vanilla", 0, 6), ("floater", 0, 4)]

    log = str(tmp_path / "calls2.jsonl")
    # another parent directory: the first run's finished vanilla stage is shared by every run under its parent
    proc = _run(str(tmp_path / "b" / "run2"), data_bin, log, STUB_FAIL_IN="vanilla", STUB_FAIL_AFTER="3")
    assert proc.returncode == 2
    assert "fairseq-train failed with exit code 1 before the stage finished" in proc.stderr
    assert _calls(log) == [("vanilla", 0, 3)]
    proc = _run(str(tmp_path / "b" / "run2"), data_bin, log)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _calls(log) == [("vanilla", 0, 3), ("vanilla", 3, 6), ("floater", 0, 4)]


def test_floater_variants_share_one_vanilla_stage_trained_once_when_started_together(tmp_path):
    """Table 2's every-block and input-block rows (other OUTs, the same vanilla configuration): the
    dry run names one vanilla directory, keyed by that configuration, for both; launched at the
    same time, one trains it, the other waits on its lock and then finds it finished."""
    data_bin = _corpus(str(tmp_path / "corpus"), seed=1)
    log = str(tmp_path / "calls.jsonl")
    rows = (("all", {}), ("input", {"POSITION_BLOCKS": "input"}))
    shared = set()
    for name, env in rows:
        proc = _run(str(tmp_path / "runs" / name), data_bin, log, DRY_RUN="1", **env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        (line,) = [x for x in proc.stdout.splitlines() if x.startswith("== 1/3 vanilla stage: ")]
        shared.add(line.split()[4])
    assert len(shared) == 1 and os.path.basename(shared.pop()).startswith("vanilla-base-")
    path = f"{STUBS}:{os.path.join(REPO, '.venv', 'bin')}:{os.environ['PATH']}"
    procs = [subprocess.Popen(["bash", FLOATER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **BASE, **env, "DATA_BIN": data_bin, "STUB_LOG": log, "PATH": path,
                                   "OUT": str(tmp_path / "runs" / name), "STUB_SECONDS_PER_UPDATE": "2"})
             for name, env in rows]
    outputs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert sorted(_calls(log)) == [("floater", 0, 4), ("floater", 0, 4), ("vanilla", 0, 6)]
    assert sum("another run is training" in out for out, _ in outputs) == 1
    assert sum(": skip finished at update 6" in out for out, _ in outputs) == 1
    assert os.path.realpath(tmp_path / "runs" / "all" / "vanilla") == os.path.realpath(
        tmp_path / "runs" / "input" / "vanilla")
    assert [d for d in os.listdir(tmp_path / "runs" / "shared") if not d.endswith(".lock")] == [
        os.path.basename(os.path.realpath(tmp_path / "runs" / "all" / "vanilla"))]


def test_a_refused_rerun_leaves_the_label_of_the_run_that_trained(finished, tmp_path):
    """train.env (what evaluate.sh labels the checkpoint with) is written once the decision accepted
    the run: a refused re-run without EVAL_BLEU keeps a BLEU-selected run's label."""
    base, data_bin = finished
    out = str(tmp_path / "run")
    shutil.copytree(base / "run", out)
    with open(os.path.join(out, "train.env"), "a") as f:
        f.write("TRAINED_BEST_METRIC=bleu\n")
    before = open(os.path.join(out, "train.env")).read()
    proc = _run(out, _copy_bin(data_bin, tmp_path / "bin"), str(tmp_path / "calls.jsonl"), LR="1e-3")
    assert proc.returncode == 2 and "another configuration" in proc.stderr
    assert open(os.path.join(out, "train.env")).read() == before
