"""recipes/floater/train.sh end to end on generated data: vanilla, warm start, averaging."""
import os
import re
import subprocess

import torch

from fairseq_posenc import pipeline, toy_data
from tolerances import assert_within, float32_tolerance, magnitude

RECIPE = os.path.join(os.path.dirname(pipeline.USER_DIR), "recipes", "floater", "train.sh")
TINY = ("--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
        "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 "
        "--decoder-attention-heads 2")


def test_floater_protocol_recipe(tmp_path):
    prefixes = toy_data.write_toy_corpus(str(tmp_path / "raw"), {"train": (300, 3, 8), "valid": (30, 3, 8)})
    data_bin = pipeline.preprocess(prefixes, str(tmp_path / "bin"))
    out = tmp_path / "run"
    # stage 1 stops at MAX_UPDATE 8; stage 2 at FLOATER_MAX_UPDATE 5 (its one epoch, as En-Fr, is
    # longer); a checkpoint every update; AVERAGE left at FLOATER's 5
    env = {**os.environ, "DATA_BIN": data_bin, "OUT": str(out), "DEVICE": "cpu", "MAX_UPDATE": "8",
           "FLOATER_EPOCHS": "1", "FLOATER_MAX_UPDATE": "5", "SAVE_INTERVAL_UPDATES": "1", "WARMUP": "3",
           "DROPOUT": "0.2", "LR": "2e-3", "MAX_TOKENS": "200", "UPDATE_FREQ": "1", "MODEL_FLAGS": TINY,
           "EXTRA_FLAGS": "--num-workers 0 --seed 1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", RECIPE], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    stdout = proc.stdout
    assert "== 2/3 FLOATER warm-started" in stdout and "lr 0.001," in stdout
    per_epoch = int(re.search(r"\| updates per epoch: (\d+)", stdout).group(1))
    assert per_epoch > 5, stdout  # the FLOATER stage stops at its update 5, inside its first epoch
    assert "| averaged: updates 1, 2, 3, 4, 5" in stdout

    # stage 1: MAX_UPDATE honoured, only best, last and one interval checkpoint kept
    vanilla_last = torch.load(out / "vanilla" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert vanilla_last["optimizer_history"][-1]["num_updates"] == 8
    assert sorted(os.listdir(out / "vanilla")) == ["checkpoint_1_8.pt", "checkpoint_best.pt", "checkpoint_last.pt",
                                                   "stage.json", "train.log"]
    # each stage logs (appended to on a re-run): fairseq's own lines, its last update included
    for stage, updates in (("vanilla", 8), ("floater", 5)):
        log = (out / stage / "train.log").read_text()
        assert f"num_updates {updates}" in log and "done training" in log

    vanilla = torch.load(out / "vanilla" / "checkpoint_best.pt", map_location="cpu", weights_only=False)
    first = torch.load(out / "floater" / "checkpoint_1_1.pt", map_location="cpu", weights_only=False)
    last = torch.load(out / "floater" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    averaged = torch.load(out / "floater" / "averaged_last5.pt", map_location="cpu", weights_only=False)
    args = averaged["cfg"]["model"]
    assert args.arch == "transformer_floater_wmt_en_de" and args.position_encoding == "floater"
    assert args.floater_init_from is None  # reloading the checkpoint does not warm-start again
    # stage 2 ran with the recipe's settings: half the lr, WARMUP, DROPOUT, its own end, on the CPU
    cfg = last["cfg"]
    assert cfg["optimization"]["lr"] == [0.001] and cfg["lr_scheduler"]["warmup_updates"] == 3
    assert args.dropout == 0.2 and cfg["optimization"]["max_update"] == 5 and cfg["optimization"]["max_epoch"] == 1
    assert cfg["common"]["cpu"] and last["optimizer_history"][-1]["num_updates"] == 5
    assert sorted(f for f in os.listdir(out / "floater") if f.startswith("checkpoint_1_")) == [
        f"checkpoint_1_{u}.pt" for u in range(1, 6)]
    # the average is the mean of the 5 interval checkpoints
    key = "encoder.layers.0.fc1.weight"
    kept = [torch.load(out / "floater" / f"checkpoint_1_{u}.pt", map_location="cpu", weights_only=False)["model"][key]
            for u in range(1, 6)]
    # the mean, exact in float64, rounded once to float32 (average_checkpoints.py sums in float64)
    mean = torch.stack(kept).double().mean(0)
    assert_within(averaged["model"][key].double(), mean, float32_tolerance(1, magnitude(mean), sides=1))

    # the warm start carried the vanilla weights over; one update early in the warmup (lr about
    # 3e-4) moved them by far less than the ~0.1 that separates two random initialisations
    moved = (first["model"][key] - vanilla["model"][key]).abs().max()
    assert 0 < moved < 1e-2
    # every parameter of h and the initial states learned between the stage's first and last
    # checkpoints (a warm start that zeroed all of h left fc1, fc2, time1, time2 at 0 for good)
    prefix = "encoder.position_encoding.ode."
    # (the dynamics' extra state is the --floater-lr-scale its weights were saved with, not a parameter)
    ode = [k for k in last["model"] if (k.startswith(prefix + "dynamics.") or k == prefix + "initial")
           and not k.endswith("_extra_state")]
    assert set(ode) == {prefix + n for n in ("dynamics.fc1.weight", "dynamics.fc1.bias", "dynamics.fc2.weight",
                                             "dynamics.fc2.bias", "dynamics.time1", "dynamics.time2", "initial")}
    for k in ode:
        assert not torch.equal(first["model"][k], last["model"][k]), f"{k} did not change"
    assert last["model"]["encoder.position_encoding.ode.dynamics.fc2.weight"].abs().max() > 0


def test_floater_dry_run_plans_both_stages_and_keeps_the_gpu_precision(tmp_path):
    prefixes = toy_data.write_toy_corpus(str(tmp_path / "raw"), {"train": (300, 3, 8), "valid": (30, 3, 8)})
    data_bin = pipeline.preprocess(prefixes, str(tmp_path / "bin"))
    env = {**os.environ, "DATA_BIN": data_bin, "OUT": str(tmp_path / "run"), "NUM_GPUS": "1", "ARCH": "big",
           "MAX_UPDATE": "300", "FLOATER_EPOCHS": "10", "SAVE_INTERVAL_UPDATES": "7", "MAX_TOKENS": "200",
           "UPDATE_FREQ": "1"}
    proc = subprocess.run(["bash", RECIPE, "--dry-run"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "| device: 1 GPU(s) (--fp16); decoding on 1 GPU (fp16)" in out
    assert "== FLOATER protocol (big): vanilla at lr 5e-4, FLOATER at lr 0.00025, dropout 0.3" in out
    assert "| stage vanilla: ends at its update 300 (" in out and "--max-update)" in out
    per_epoch = int(re.search(r"\| updates per epoch: (\d+)", out).group(1))
    assert f"| stage floater: ends at its update {10 * per_epoch} (10.00 epochs, --max-epoch)" in out
    # the whole budget, next to the sinusoidal baseline's (MAX_UPDATE)
    total = 300 + 10 * per_epoch
    assert (f"| budget: {total} updates in all ({total / per_epoch:.2f} epochs); the baseline trains 300 "
            f"({300 / per_epoch:.2f} epochs): {total / 300:.2f}x its updates") in out
    # big: FLOATER still averages 5 (the paper), not Vaswani's 20
    assert "the last 5 kept (--keep-interval-updates)" in out
    assert "== --dry-run: nothing trained" in out and not (tmp_path / "run").exists()


def test_recipe_without_data_says_what_is_missing(tmp_path):
    env = {**os.environ, "DATA_BIN": str(tmp_path)}
    proc = subprocess.run(["bash", RECIPE], env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert f"no fairseq dictionary in DATA_BIN={tmp_path}: run fairseq-preprocess first" in proc.stderr
