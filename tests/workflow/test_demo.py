"""scripts/demo.py (make demo) end to end, on a budget: the recipes' workflow with the demo's
configuration, and the report it promises, from one run.

Three models of 300 updates: sinusoidal learns the toy pair in range, `none` (a bag of words to
its encoder) cannot, so the report's numbers have known places with wide margins; three more of
40 updates warm-started from sinusoidal."""
import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(REPO, "scripts", "demo.py")
SNAKEFILE = os.path.join(REPO, "recipes", "Snakefile")
DEMO_CONFIG = os.path.join(REPO, "recipes", "conf", "demo.yaml")


# the demo's FLOATER (--floater-step 0.1, its OVERRIDES) and the same with its flow model solved
# every 10 updates: each row labelled from its trained model (warm-started, which the weights
# record; C defaults to 1 there, the published C of a warm start, not the min(N, 10) of a FLOATER
# from scratch)
FLOATER = "floater (warm start, step 0.1)"
FLOATER_N10 = "floater (warm start, solve every 10, step 0.1)"
ROWS = ["none", "sinusoidal", "sinusoidal (--encoder-layers 1)", FLOATER, FLOATER_N10, "vanilla_continued"]
SLUGS = ["none", "sinusoidal", "sinusoidal-encoder-layers-1", "floater", "floater-floater-solve-every-10",
         "vanilla_continued"]
DEMO_ARGS = ["--encodings", "none", "sinusoidal", "sinusoidal:--encoder-layers=1", "floater",
             "floater:--floater-solve-every=10", "--max-update", "300", "--warm-start", "40", "--train-size", "1000",
             "--test-size", "60", "--size", "tiny"]


def demo(out, *args):
    return subprocess.run([sys.executable, DEMO, *DEMO_ARGS, "--out", str(out), *args], capture_output=True, text=True)


def test_demo_writes_the_report_table_json_and_plot_with_floater_warm_started_beside_its_control(tmp_path):
    """One study of every kind of row (one run, the suite's budget): an encoding, a row that differs
    from another in a fairseq flag only (--encoder-layers: a model of its own, named by its label and
    that option), and --warm-start N: each FLOATER row (one with --floater-solve-every 10 from its
    spec) and vanilla_continued start from sinusoidal seed 1's best checkpoint and train N updates at
    half the lr; the report compares each FLOATER row with the one control. Then Snakemake's own
    report of the run, a re-run that trains nothing, and --baseline given as a spec, which redoes the
    report only."""
    import torch

    proc = demo(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| plan total: 6 model(s), 6 to train, 1020 updates" in proc.stderr
    results = json.load(open(tmp_path / "results.json"))
    assert [row["encoding"] for row in results["rows"]] == ROWS
    assert [row["slug"] for row in results["rows"]] == SLUGS
    # tiny: a layer of the encoder holds 4 x (64 x 64 + 64) + (64 x 128 + 128 + 128 x 64 + 64) + 2 x 128 parameters
    assert [row["parameters"] for row in results["rows"]][:3] == [178_176, 178_176, 178_176 - 33_472]
    assert all(len(row["train_seconds"]) == 1 for row in results["rows"])
    records = [json.load(open(tmp_path / "models" / name / "seed1" / "trained.json"))
               for name in ("sinusoidal", "sinusoidal-encoder-layers-1")]
    assert records[0]["checkpoints"] != records[1]["checkpoints"] and records[1]["updates"] == 300
    assert "--encoder-layers 1" in " ".join(records[1]["command"])
    # each training's progress in its job's log
    log = open(tmp_path / "models" / "sinusoidal-encoder-layers-1" / "seed1" / "train.log").read()
    assert "| sinusoidal-encoder-layers-1/seed1: 300/300 updates (100%)" in log
    report = results["report"]
    assert results["edges"] == [3, 13, 19, 25] and report["baseline"] == "sinusoidal" and results["seeds"] == [1]
    # the toy test set is drawn from --data-seed 1: the same sentences on every machine
    assert [(b["bin"], b["sentences"]) for b in report["bins"]] == [
        ("[3,13)", 19), ("[13,19)", 22), ("[19,25)", 5), ("[25,inf)", 14)]
    sinusoidal, none = report["models"]["sinusoidal"][0], report["models"]["none"][0]
    # in range, after these 300 updates: sinusoidal 58.8 BLEU, ratio 0.96; none 8.5 BLEU; after 20
    # updates sinusoidal had 0.0 BLEU and a ratio of 0.22
    assert sinusoidal["bleu"] > 30 and sinusoidal["ratio"] > 0.8 and none["bleu"] < 25
    # measured -50.3 [-65.3, -37.1]
    assert none["vs_baseline"]["significant"] and none["vs_baseline"]["high"] < -10
    assert "Decoding limit: the demo's fairseq-generate --max-len-a 1.5 --max-len-b 50, 1024 positions allow 96 " \
           "target tokens for the longest source (31 tokens)" in report["footer"]
    table = open(tmp_path / "results.md").read()
    assert table.startswith("| encoding | parameters | training (s) |")
    assert "| encoding | [3,13) n=19 | [13,19) n=22 | [19,25) n=5 | [25,inf) n=14 |" in table
    # one seed: each star carries the dagger that says seed variance is not in the interval
    assert table.count("]*†)") >= 1 and "(one seed; n = sentences)" in table and "SEED VARIANCE IS NOT INCLUDED" in table
    png = open(tmp_path / "bleu_by_length.png", "rb").read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 30_000  # two panels
    for encoding in ("none", "sinusoidal"):  # the fairseq-generate output and its log, for bleu_by_length.py
        assert (tmp_path / "models" / encoding / "seed1" / "test.txt").read_text().count("\nH-") == 60
    for encoding in ("none", "sinusoidal"):  # what each encoding looks like (scripts/plot_positions.py)
        assert (tmp_path / f"positions_{encoding}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "positions_none.png, positions_sinusoidal.png" in proc.stdout

    # the warm start: each FLOATER row against the one control, from sinusoidal's best checkpoint
    assert report["controls"] == {FLOATER: "vanilla_continued", FLOATER_N10: "vanilla_continued"}
    assert results["warm_start"] == 40
    assert all("vs_control" in row for label in (FLOATER, FLOATER_N10) for row in report["models"][label])
    for model in ("floater", "floater-floater-solve-every-10", "vanilla_continued"):
        state = torch.load(tmp_path / "models" / model / "seed1" / "checkpoints" / "checkpoint_last.pt",
                           map_location="cpu", weights_only=False)
        assert state["optimizer_history"][-1]["num_updates"] == 40
        assert state["cfg"]["optimization"]["lr"] == [1.5e-3]
    start = os.path.join(records[0]["checkpoints"], "checkpoint_best.pt")
    log = open(tmp_path / "models" / "vanilla_continued" / "seed1" / "checkpoints" / "train.log").read()
    assert f"loading pretrained model from {start}" in log
    # (the saved config forgets the warm start, so that loading the model does not redo it)
    for model, every in (("floater", False), ("floater-floater-solve-every-10", True)):
        command = [line for line in open(tmp_path / "models" / model / "seed1" / "checkpoints" / "train.log")
                   if line.startswith("== ")][0]
        assert f" --floater-init-from {start} " in command and " --lr 0.0015 " in command
        assert (" --floater-solve-every 10" in command) == every
    assert sorted(os.listdir(tmp_path / "models")) == sorted(SLUGS)
    # trained 340 updates in all: in range all are well past the untrained 0 BLEU (sinusoidal
    # alone reaches 58.8 at 300 updates here)
    for model in (FLOATER, FLOATER_N10, "vanilla_continued"):
        assert report["models"][model][0]["bleu"] > 30
    assert f"| {FLOATER} - vanilla_continued | " in table and f"| {FLOATER_N10} - vanilla_continued | " in table
    assert f"| {FLOATER_N10} | " in table

    # the table and the plot in Snakemake's browsable report of the run
    html_report = subprocess.run([sys.executable, "-m", "snakemake", "-s", SNAKEFILE, "--configfile", DEMO_CONFIG,
                                  str(tmp_path / "demo_config.yaml"), "--report", str(tmp_path / "report.html")],
                                 capture_output=True, text=True)
    assert html_report.returncode == 0, html_report.stderr[-3000:]
    html = open(tmp_path / "report.html").read()
    assert "results.md" in html and "bleu_by_length.png" in html
    # a re-run trains nothing: every job's outputs are up to date
    again = demo(tmp_path, "--dry-run")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    # --baseline as a row's spec: the report alone is redone, against that row's model
    rebased = demo(tmp_path, "--baseline", "floater")
    assert rebased.returncode == 0, rebased.stderr[-3000:]
    done = re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", rebased.stdout + rebased.stderr)
    assert sorted(done) == ["all", "demo_report", "study_config"], done
    report = json.load(open(tmp_path / "results.json"))["report"]
    assert report["baseline"] == FLOATER
    assert "vs_baseline" in report["models"]["sinusoidal"][0] and "vs_baseline" not in report["models"][FLOATER][0]


def _demo_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo", DEMO)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    return demo


def test_demo_flags_are_checked_before_any_work(tmp_path, capsys):
    demo = _demo_module()
    for args, message in ((["--seeds", "2", "2"], "--seeds takes a count N >= 1 or distinct non-negative seeds"),
                          (["--encodings", "t5", "--baseline", "rope"], "--baseline rope is not among --encodings"),
                          (["--encodings", "t5", "alibi:--alibi-encoder"],
                           "--encodings alibi:--alibi-encoder: argument --alibi-encoder: expected one argument"),
                          (["--encodings", "t5", "alibi:alibi-encoder=split"], "'alibi-encoder=split' is not --flag=value"),
                          (["--encodings", "alibi", "alibi:--alibi-encoder=symmetric"],
                           "--encodings alibi and alibi:--alibi-encoder=symmetric are the same model, 'alibi'"),
                          (["--encodings", "alibi:--alibi-encoder=split", "alibi:--alibi-encoder=split"],
                           "are the same row"),
                          (["--encodings", "sinusoidal:--alibi-encoder=split"],
                           "--encodings sinusoidal:--alibi-encoder=split: --alibi-encoder split would change nothing: "
                           "--position-encoding sinusoidal does not use it (it is for --position-encoding alibi)"),
                          (["--encodings", "rotary"], "'rotary' is not a position encoding"),
                          (["--encodings", "floater", "--warm-start", "10"],
                           "--warm-start 10: a number of updates >= 0, with sinusoidal (the start) and floater among "
                           "--encodings")):
        with pytest.raises(SystemExit) as exit_:
            demo.main([*args, "--out", str(tmp_path)])
        assert exit_.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]
        assert not os.listdir(tmp_path)
    assert demo.parse_seeds([3]) == [1, 2, 3] and demo.parse_seeds([1, 5, 9]) == [1, 5, 9]


def test_row_specs_add_flags_name_a_directory_and_a_label():
    from posenc_workflow import workflow

    rows = workflow.parse_rows(["alibi", "alibi:--alibi-encoder=split", "t5:--position-bias-scale=10",
                                "floater:--floater-solve-every=10,--floater-lr-scale=1", "t5:--segment-attention"])
    assert [(r.encoding, r.flags, r.slug) for r in rows] == [
        ("alibi", [], "alibi"),
        ("alibi", ["--alibi-encoder", "split"], "alibi-alibi-encoder-split"),
        ("t5", ["--position-bias-scale", "10"], "t5-position-bias-scale-10"),
        ("floater", ["--floater-solve-every", "10", "--floater-lr-scale", "1"],
         "floater-floater-solve-every-10-floater-lr-scale-1"),
        ("t5", ["--segment-attention"], "t5-segment-attention")]
    demo_flags = {"floater": ["--floater-step", "0.1"]}
    assert [workflow.preflight_label(r.encoding, demo_flags.get(r.encoding, []) + r.flags) for r in rows] == [
        "alibi", "alibi (split)", "t5 (bias scale 10)", "floater (solve every 10, lr scale 1, step 0.1)",
        "t5 (segment attention)"]
    # warm-started (warm_start.enabled): FLOATER rows are built warm-started, as they train: N = 10
    # takes C = 1 there, so that a row asking for C = 10 is another model (issue 38)
    assert [workflow.preflight_label(row.encoding, demo_flags.get(row.encoding, []) + row.flags, warm_start=True)
            for row in workflow.parse_rows(["floater:--floater-solve-every=10",
                                            "floater:--floater-solve-every=10,--floater-lr-scale=10"])] == [
        "floater (warm start, solve every 10, step 0.1)", "floater (warm start, solve every 10, lr scale 10, step 0.1)"]
