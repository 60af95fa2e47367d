"""fairseq_posenc.compat: each fix fails without it."""
import argparse

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from fairseq_posenc import compat


@pytest.fixture
def without_allow_list():
    saved = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    yield
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(saved)


def _fairseq_like_checkpoint(path):
    # What fairseq pickles: a Namespace config (legacy models), omegaconf containers (older
    # checkpoints) and numpy metric values, next to the tensors.
    state = {
        "args": argparse.Namespace(arch="transformer_posenc", lr=[0.0005]),
        "cfg": OmegaConf.create({"model": {"arch": "transformer"}, "optimization": {"lr": [0.1]}}),
        "model": {"w": torch.arange(6.0).view(2, 3)},
        "extra_state": {"best": np.float64(1.25), "epoch": np.int64(3)},
    }
    torch.save(state, path)


def test_safe_loading_refuses_fairseq_checkpoints_without_compat(tmp_path, without_allow_list):
    _fairseq_like_checkpoint(tmp_path / "c.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(tmp_path / "c.pt", map_location="cpu")


def test_compat_loads_fairseq_checkpoints_with_safe_loading_on(tmp_path, without_allow_list):
    _fairseq_like_checkpoint(tmp_path / "c.pt")
    compat.allow_fairseq_checkpoints()
    state = torch.load(tmp_path / "c.pt", map_location="cpu")
    assert state["args"].arch == "transformer_posenc"
    assert state["cfg"].optimization.lr == [0.1]
    assert state["extra_state"]["best"] == 1.25
    assert torch.equal(state["model"]["w"], torch.arange(6.0).view(2, 3))


class _Untrusted:
    pass


def test_compat_keeps_refusing_other_classes(tmp_path, without_allow_list):
    compat.allow_fairseq_checkpoints()
    torch.save({"payload": _Untrusted()}, tmp_path / "evil.pt")
    with pytest.raises(Exception, match="Unsupported global"):
        torch.load(tmp_path / "evil.pt", map_location="cpu")
