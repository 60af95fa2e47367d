"""--bf16 on a machine with no TPU (fairseq issue #4696): compat.bf16_without_tpu. fairseq's
options.py turns --bf16 into --tpu, and the trainer then asks torch_xla for a device; with the fix
fairseq-train trains in bf16 on the CPU (--cpu) as it would on CUDA (not run here: no GPU)."""
import math
import os
import subprocess

import torch

from fairseq_posenc import pipeline, toy_data

TINY = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2"]


def _data(tmp_path):
    prefixes = toy_data.write_toy_corpus(str(tmp_path / "raw"), {"train": (200, 3, 8), "valid": (20, 3, 8)})
    return pipeline.preprocess(prefixes, str(tmp_path / "bin"))


def _train(data_bin, save_dir, precision, user_dir=True):
    flags = [a for a in pipeline.toy_train_flags(max_update=3) if a != "--keep-last-epochs" and a != "5"]
    cmd = [pipeline.executable("fairseq-train"), data_bin, *(["--user-dir", pipeline.USER_DIR] if user_dir else []),
           *flags, *TINY, precision, "--save-dir", str(save_dir), "--no-epoch-checkpoints"]
    if not user_dir:
        cmd[cmd.index("transformer_posenc")] = "transformer"
        i = cmd.index("--position-encoding")
        del cmd[i:i + 2]
    return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_stock_fairseq_cannot_train_bf16_without_a_tpu(tmp_path):
    """What the fix is for: without the plugin, --cpu --bf16 takes the TPU path and fails."""
    proc = _train(_data(tmp_path), tmp_path / "run", "--bf16", user_dir=False)
    assert proc.returncode != 0
    assert "xla" in proc.stderr.lower(), proc.stderr[-2000:]


def test_cpu_bf16_trains_through_fairseq_train(tmp_path):
    data_bin = _data(tmp_path)
    for precision in ("--bf16", "--memory-efficient-bf16"):
        save_dir = tmp_path / precision.strip("-")
        proc = _train(data_bin, save_dir, precision)
        assert proc.returncode == 0, proc.stderr[-3000:]
        state = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=False)
        common = state["cfg"]["common"]
        assert state["optimizer_history"][-1]["num_updates"] == 3
        assert common["bf16"] and not common["tpu"] and common["cpu"]
        # the model ran in bf16: every weight it saved is a bf16 number (an fp32 run's random
        # initialisation and Adam steps are not)
        weights = [v for v in state["model"].values() if v.is_floating_point() and v.numel() >= 64]
        assert weights and all(torch.equal(v, v.to(torch.bfloat16).to(v.dtype)) for v in weights)
        losses = [float(line.split("loss ")[1].split(" ")[0]) for line in (proc.stdout + proc.stderr).splitlines()
                  if "| train | epoch" in line and "loss " in line]
        assert losses and all(math.isfinite(x) for x in losses)


def test_tpu_is_cleared_only_for_bf16_without_torch_xla():
    from types import SimpleNamespace

    from fairseq.distributed import utils as distributed_utils

    from fairseq_posenc import compat

    compat.apply()
    assert distributed_utils.call_main.bf16_without_tpu
    for bf16, xla, expected in ((True, False, False), (True, True, True), (False, False, True)):
        common = SimpleNamespace(bf16=bf16, tpu=True)
        compat.clear_tpu_for_bf16(common, xla)
        assert common.tpu is expected


def test_generate_with_bf16_decodes_in_bf16(tmp_path):
    """fairseq-generate casts a model only for --fp16; the plugin's models cast themselves for
    --bf16 (prepare_for_inference_). The scores move by bf16 rounding: more than 0, and far less
    than a different model's (bf16's epsilon 2**-8 is 0.4% relative; the bound allows 5% for the
    errors a 2-layer model accumulates)."""
    data_bin = _data(tmp_path)
    assert _train(data_bin, tmp_path / "run", "--bf16").returncode == 0
    scores = {}
    for precision in ([], ["--bf16"]):
        cmd = [pipeline.executable("fairseq-generate"), data_bin, "--user-dir", pipeline.USER_DIR, "--path",
               str(tmp_path / "run" / "checkpoint_last.pt"), "--gen-subset", "valid", "--cpu", "--beam", "2",
               "--max-tokens", "2000", "--max-len-b", "20", *precision]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        scores[bool(precision)] = {line.split("\t")[0]: float(line.split("\t")[1])
                                   for line in proc.stdout.splitlines() if line.startswith("H-")}
    assert scores[True].keys() == scores[False].keys() and len(scores[True]) == 20
    relative = [abs(scores[True][k] - scores[False][k]) / abs(scores[False][k]) for k in scores[False]]
    assert 0 < max(relative) < 0.05
