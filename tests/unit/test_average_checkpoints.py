"""scripts/average_checkpoints.py: element-wise mean, selection of the last N, atomic writes."""
import os
import subprocess
import sys

import pytest
import torch

from helpers.scripts import SCRIPTS, script
from helpers.tolerances import assert_within, float32_tolerance, magnitude

SCRIPT = os.path.join(SCRIPTS, "average_checkpoints.py")
average_checkpoints = script("average_checkpoints")


def _write(path, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    model = {
        "enc.w": torch.randn(3, 4, generator=g).to(dtype),
        "enc.b": torch.randn(4, generator=g).to(dtype),
        "version": torch.tensor([seed]),
    }
    torch.save({"model": model, "cfg": {"seed": seed}}, path)
    return model


@pytest.mark.numerics
def test_averaged_parameters_are_the_elementwise_mean(tmp_path):
    models = [_write(tmp_path / f"checkpoint{e}.pt", seed=e) for e in (1, 2, 3, 4)]
    average_checkpoints.main(["--inputs", str(tmp_path), "--num-epoch-checkpoints", "3",
                              "--output", str(tmp_path / "avg.pt")])
    avg = torch.load(tmp_path / "avg.pt", map_location="cpu")
    for key in ("enc.w", "enc.b"):
        expected = (models[1][key].double() + models[2][key].double() + models[3][key].double()) / 3  # epochs 2-4
        # the mean, exact in float64, rounded once to float32
        assert avg["model"][key].dtype == torch.float32
        assert_within(avg["model"][key].double(), expected, float32_tolerance(1, magnitude(expected), sides=1), key)
    assert torch.equal(avg["model"]["version"], torch.tensor([4]))  # from the newest
    assert avg["cfg"] == {"seed": 4}


@pytest.mark.numerics
def test_half_precision_is_averaged_in_float64_and_kept_half(tmp_path):
    models = [_write(tmp_path / f"c{i}.pt", seed=i, dtype=torch.float16) for i in range(2)]
    average_checkpoints.main(["--inputs", str(tmp_path / "c0.pt"), str(tmp_path / "c1.pt"),
                              "--output", str(tmp_path / "avg.pt")])
    avg = torch.load(tmp_path / "avg.pt", map_location="cpu")["model"]["enc.w"]
    assert avg.dtype == torch.float16
    expected = ((models[0]["enc.w"].double() + models[1]["enc.w"].double()) / 2).half()
    # exactly: two float16 values add exactly in float64 and halve exactly, so both sides are the
    # one rounding of the exact mean to float16
    assert torch.equal(avg, expected)


def test_update_checkpoints_and_upper_bound(tmp_path):
    for update in (100, 200, 300, 400):
        _write(tmp_path / f"checkpoint_1_{update}.pt", seed=update)
    paths = average_checkpoints.last_checkpoints(str(tmp_path), 2, update_based=True, upper_bound=300)
    assert [os.path.basename(p) for p in paths] == ["checkpoint_1_300.pt", "checkpoint_1_200.pt"]


@pytest.mark.slow  # a Python process
def test_too_few_checkpoints_is_a_clear_error(tmp_path):
    _write(tmp_path / "checkpoint1.pt", seed=1)
    proc = subprocess.run([sys.executable, SCRIPT, "--inputs", str(tmp_path), "--num-epoch-checkpoints", "5",
                           "--output", str(tmp_path / "avg.pt")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "asked for the last 5 epoch checkpoints, found 1" in proc.stderr
    assert not (tmp_path / "avg.pt").exists()


def test_a_failed_write_leaves_the_previous_output_intact(tmp_path, monkeypatch):
    _write(tmp_path / "c0.pt", seed=0)
    (tmp_path / "avg.pt").write_bytes(b"previous good file")

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(average_checkpoints.torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        average_checkpoints.main(["--inputs", str(tmp_path / "c0.pt"), "--output", str(tmp_path / "avg.pt")])
    assert (tmp_path / "avg.pt").read_bytes() == b"previous good file"
    assert sorted(os.listdir(tmp_path)) == ["avg.pt", "c0.pt"]  # no temporary file left behind


@pytest.mark.parametrize("encoding", ["floater", "rnn"])
def test_floaters_kept_solutions_of_other_lengths_are_solved_again_for_the_average(tmp_path, encoding):
    """Validation grows the kept solution, so checkpoints of one run hold solutions of different
    lengths, each solved for its own parameters: the average drops them and solves its own."""
    from helpers.toy import build_model

    paths = []
    for seed, length in ((1, 64), (2, 128)):
        model = build_model("transformer_posenc", "--position-encoding", encoding, seed=seed)
        with torch.no_grad():
            model.encoder.position_encoding.ode.positions(length)
        assert model.state_dict()["encoder.position_encoding.ode.solution"].size(0) == length
        torch.save({"model": model.state_dict(), "cfg": {}}, tmp_path / f"checkpoint{seed}.pt")
        paths.append(str(tmp_path / f"checkpoint{seed}.pt"))
    average_checkpoints.main(["--inputs", *paths, "--output", str(tmp_path / "avg.pt")])
    averaged = build_model("transformer_posenc", "--position-encoding", encoding, seed=3)
    averaged.load_state_dict(torch.load(tmp_path / "avg.pt", map_location="cpu")["model"], strict=True)
    ode = averaged.encoder.position_encoding.ode
    with torch.no_grad():
        kept = ode.positions(100)[:100].clone()
        fresh = ode._solve(ode.initial, 0, 100)
    # solved for the averaged parameters, by the same code: equal, not close
    assert torch.equal(kept, fresh)
