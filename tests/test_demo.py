"""scripts/demo.py (make demo) end to end, on a budget: the report it promises, from the run.

Two models of 300 updates: sinusoidal learns the toy pair in range, `none` (a bag of words to its
encoder) cannot, so the report's numbers have known places with wide margins."""
import json
import os
import subprocess
import sys

import pytest

DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "demo.py")


def test_demo_writes_the_report_table_json_and_plot(tmp_path):
    proc = subprocess.run([sys.executable, DEMO, "--encodings", "none", "sinusoidal", "--max-update", "300",
                           "--train-size", "1000", "--test-size", "60", "--size", "tiny", "--out", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| [2/2] training sinusoidal seed 1 for 300 updates" in proc.stdout
    results = json.load(open(tmp_path / "results.json"))
    assert [row["encoding"] for row in results["rows"]] == ["none", "sinusoidal"]
    assert all(row["parameters"] == 178_176 and len(row["train_seconds"]) == 1 for row in results["rows"])
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
    assert "Decoding limit: demo.py's fairseq-generate --max-len-a 1.5 --max-len-b 50, 1024 positions allow 96 " \
           "target tokens for the longest source (31 tokens)" in report["footer"]
    table = open(tmp_path / "results.md").read()
    assert table.startswith("| encoding | parameters | training (s) |")
    assert "| encoding | [3,13) n=19 | [13,19) n=22 | [19,25) n=5 | [25,inf) n=14 |" in table
    # one seed: each star carries the dagger that says seed variance is not in the interval
    assert table.count("]*†)") >= 1 and "(one seed; n = sentences)" in table and "SEED VARIANCE IS NOT INCLUDED" in table
    png = open(tmp_path / "bleu_by_length.png", "rb").read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 30_000  # two panels
    assert len(os.listdir(tmp_path / "generations")) >= 2  # the fairseq-generate output, for bleu_by_length.py
    for encoding in ("none", "sinusoidal"):  # what each encoding looks like (scripts/plot_positions.py)
        assert (tmp_path / f"positions_{encoding}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "positions_none.png, positions_sinusoidal.png" in proc.stdout


# the demo's FLOATER (--floater-step 0.1, its OVERRIDES) and the same with its flow model solved
# every 10 updates: each row labelled from its trained model (warm-started, which the weights
# record; C defaults to 1 there, the published C of a warm start, not the min(N, 10) of a FLOATER
# from scratch)
FLOATER = "floater (warm start, step 0.1)"
FLOATER_N10 = "floater (warm start, solve every 10, step 0.1)"


def test_warm_start_trains_floater_rows_and_one_control_from_sinusoidals_best_checkpoint(tmp_path):
    """--warm-start N: each FLOATER row (one with --floater-solve-every 10 from its spec) and
    vanilla_continued start from sinusoidal seed 1's best checkpoint and train N updates at half
    the lr; the report names the rows by their models' labels and compares each FLOATER row with
    the one control, and the others with --baseline given as a spec (floater: N = 1)."""
    import torch

    proc = subprocess.run([sys.executable, DEMO, "--encodings", "sinusoidal", "floater",
                           "floater:--floater-solve-every=10", "--baseline", "floater", "--max-update", "300",
                           "--warm-start", "40", "--train-size", "1000", "--test-size", "60", "--size", "tiny",
                           "--out", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "training vanilla_continued seed 1 for 40 updates from sinusoidal seed 1's best checkpoint at " \
           "lr 0.0015" in proc.stdout
    assert proc.stdout.count("training vanilla_continued seed 1") == 1
    results = json.load(open(tmp_path / "results.json"))
    assert [row["encoding"] for row in results["rows"]] == ["sinusoidal", FLOATER, FLOATER_N10, "vanilla_continued"]
    assert [row["slug"] for row in results["rows"]] == [
        "sinusoidal", "floater", "floater-floater-solve-every-10", "vanilla_continued"]
    report = results["report"]
    assert report["controls"] == {FLOATER: "vanilla_continued", FLOATER_N10: "vanilla_continued"}
    assert results["warm_start"] == 40 and report["baseline"] == FLOATER
    assert all("vs_control" in row for label in (FLOATER, FLOATER_N10) for row in report["models"][label])
    for model in ("floater", "floater-floater-solve-every-10", "vanilla_continued"):
        state = torch.load(tmp_path / "checkpoints" / model / "seed1" / "checkpoint_last.pt", map_location="cpu",
                           weights_only=False)
        assert state["optimizer_history"][-1]["num_updates"] == 40
        assert state["cfg"]["optimization"]["lr"] == [1.5e-3]
    start = tmp_path / "checkpoints" / "sinusoidal" / "seed1" / "checkpoint_best.pt"
    log = open(tmp_path / "checkpoints" / "vanilla_continued" / "seed1" / "train.log").read()
    assert f"loading pretrained model from {start}" in log
    # (the saved config forgets the warm start, so that loading the model does not redo it)
    for model, every in (("floater", False), ("floater-floater-solve-every-10", True)):
        command = open(tmp_path / "checkpoints" / model / "seed1" / "train.log").readline()
        assert f" --floater-init-from {start} " in command and " --lr 0.0015 " in command
        assert (" --floater-solve-every 10" in command) == every
    assert sorted(os.listdir(tmp_path / "generations")) == [
        "floater-floater-solve-every-10.seed1.txt", "floater.seed1.txt", "sinusoidal.seed1.txt",
        "vanilla_continued.seed1.txt"]
    # trained 340 updates in all: in range all are well past the untrained 0 BLEU (sinusoidal
    # alone reaches 58.8 at 300 updates here)
    for model in (FLOATER, FLOATER_N10, "vanilla_continued"):
        assert report["models"][model][0]["bleu"] > 30
    table = open(tmp_path / "results.md").read()
    assert f"| {FLOATER} - vanilla_continued | " in table and f"| {FLOATER_N10} - vanilla_continued | " in table
    assert f"| {FLOATER_N10} | " in table


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
                          (["--encodings", "rotary"], "'rotary' is not an encoding"),
                          (["--bpe", "subword_nmt"], "--bpe and --unit describe a --data-bin corpus"),
                          (["--encodings", "floater", "--warm-start", "10"],
                           "--warm-start 10: a number of updates >= 0, with sinusoidal (the start) and floater among "
                           "--encodings")):
        with pytest.raises(SystemExit) as exit_:
            demo.main([*args, "--out", str(tmp_path)])
        assert exit_.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]
        assert not os.path.exists(tmp_path / "raw")
    assert demo.parse_seeds([3]) == [1, 2, 3] and demo.parse_seeds([1, 5, 9]) == [1, 5, 9]


def test_row_specs_add_flags_name_a_directory_and_a_label(tmp_path):
    import argparse

    demo = _demo_module()
    rows = demo.parse_rows(["alibi", "alibi:--alibi-encoder=split", "t5:--position-bias-scale=10",
                            "floater:--floater-solve-every=10,--floater-lr-scale=1", "t5:--segment-attention"])
    assert [(r.encoding, r.flags, r.slug) for r in rows] == [
        ("alibi", [], "alibi"),
        ("alibi", ["--alibi-encoder", "split"], "alibi-alibi-encoder-split"),
        ("t5", ["--position-bias-scale", "10"], "t5-position-bias-scale-10"),
        ("floater", ["--floater-solve-every", "10", "--floater-lr-scale", "1"],
         "floater-floater-solve-every-10-floater-lr-scale-1"),
        ("t5", ["--segment-attention"], "t5-segment-attention")]
    args = argparse.Namespace(size="tiny", position_bias_scale=1.0, warm_start=0)
    assert [demo.preflight_label(r, args) for r in rows] == [
        "alibi", "alibi (split)", "t5 (bias scale 10)", "floater (solve every 10, lr scale 1, step 0.1)",
        "t5 (segment attention)"]
    # --warm-start: FLOATER rows are built warm-started, as they train: N = 10 takes C = 1 there, so
    # that a row asking for C = 10 is another model (issue 38: both were labelled C = 10 and refused)
    warm = argparse.Namespace(size="tiny", position_bias_scale=1.0, warm_start=40)
    assert [demo.preflight_label(demo.parse_row(spec), warm) for spec in (
        "floater:--floater-solve-every=10", "floater:--floater-solve-every=10,--floater-lr-scale=10", "t5")] == [
        "floater (warm start, solve every 10, step 0.1)", "floater (warm start, solve every 10, lr scale 10, step 0.1)",
        "t5"]
    # the spec's flags come last in the training command, after the demo's own
    flags = demo.train_flags(rows[2], 1, argparse.Namespace(max_update=10, size="tiny", lr=1e-3, max_tokens=100,
                                                            position_bias_scale=1.0))
    assert flags[-4:] == ["--position-bias-scale", "1.0", "--position-bias-scale", "10"]
    scaled = argparse.Namespace(size="tiny", position_bias_scale=10.0, warm_start=0)
    assert demo.preflight_label(rows[0], scaled) == "alibi"
    assert demo.preflight_label(demo.parse_row("t5"), scaled) == "t5 (bias scale 10)"


def test_a_bped_corpus_is_binned_in_the_unit_asked_and_scored_on_detokenized_words(tmp_path):
    import argparse

    demo = _demo_module()
    raw = demo.pipeline.Generation(["das ist ein Ha@@ us &quot;", "gu@@ t"], ["das ist ein Haus &quot;", "gut"],
                                   ["this is a hou@@ se", "go@@ od"], [0, 1])
    words = demo.postprocess(raw, argparse.Namespace(data_bin="d", bpe="subword_nmt", unit="words"), "de")
    assert words.hypotheses == ['das ist ein Haus "', "gut"] and words.references[0] == 'das ist ein Haus "'
    assert [len(s.split()) for s in words.sources] == [4, 1]
    subwords = demo.postprocess(raw, argparse.Namespace(data_bin="d", bpe="subword_nmt", unit="subwords"), "de")
    assert [len(s.split()) for s in subwords.sources] == [5, 2] and subwords.hypotheses == words.hypotheses
    spm = demo.pipeline.Generation(["\u2581das \u2581Ha us"], ["\u2581das \u2581Haus"], ["\u2581this \u2581hou se"], [0])
    scored = demo.postprocess(spm, argparse.Namespace(data_bin="d", bpe="sentencepiece", unit="words"), "de")
    assert scored.hypotheses == ["das Haus"] and scored.sources == ["this house"]
    for name in ("dict.en.txt", "dict.de.txt", "test.en-de.en.bin", "test.en-de.de.bin"):
        (tmp_path / name).write_text("")
    assert demo.data_languages(str(tmp_path)) == ("en", "de")
