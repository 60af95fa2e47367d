"""recipes/floater/train.sh end to end on generated data: vanilla, warm start, averaging."""
import os
import subprocess

import torch

from fairseq_posenc import pipeline, toy_data

RECIPE = os.path.join(os.path.dirname(pipeline.USER_DIR), "recipes", "floater", "train.sh")
TINY = ("--cpu --encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
        "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 "
        "--decoder-attention-heads 2 --num-workers 0 --seed 1")


def test_floater_protocol_recipe(tmp_path):
    prefixes = toy_data.write_toy_corpus(str(tmp_path / "raw"), {"train": (300, 3, 8), "valid": (30, 3, 8)})
    data_bin = pipeline.preprocess(prefixes, str(tmp_path / "bin"))
    out = tmp_path / "run"
    env = {**os.environ, "DATA_BIN": data_bin, "OUT": str(out), "VANILLA_EPOCHS": "2", "FLOATER_EPOCHS": "2",
           "AVERAGE": "2", "MAX_TOKENS": "500", "UPDATE_FREQ": "1", "EXTRA_FLAGS": TINY}
    proc = subprocess.run(["bash", RECIPE], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "== 2/3 FLOATER warm-started" in proc.stdout and "lr 0.00035" in proc.stdout

    vanilla = torch.load(out / "vanilla" / "checkpoint_best.pt", map_location="cpu")
    first = torch.load(out / "floater" / "checkpoint1.pt", map_location="cpu")
    averaged = torch.load(out / "floater" / "averaged.pt", map_location="cpu")
    args = averaged["cfg"]["model"]
    assert args.arch == "transformer_floater_wmt_en_de" and args.position_encoding == "floater"
    assert args.floater_init_from is None  # reloading the checkpoint does not warm-start again
    assert "encoder.position_encoding.ode.initial" in averaged["model"]
    # the warm start carried the vanilla weights over; one epoch early in the warmup (lr about
    # 1e-6) moved them by far less than the ~0.1 that separates two random initialisations
    key = "encoder.layers.0.fc1.weight"
    moved = (first["model"][key] - vanilla["model"][key]).abs().max()
    assert 0 < moved < 1e-3


def test_recipe_without_data_says_what_is_missing(tmp_path):
    env = {**os.environ, "DATA_BIN": str(tmp_path)}
    proc = subprocess.run(["bash", RECIPE], env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert f"no fairseq dictionary in DATA_BIN={tmp_path}: run fairseq-preprocess first" in proc.stderr
