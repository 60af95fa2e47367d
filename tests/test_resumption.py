"""A training run killed with SIGKILL mid-epoch and restarted with the same command continues
from its last checkpoint and logs the same losses as a run that was never interrupted.

The 40 updates stay within the first epoch: fairseq freezes an epoch's batches with a seed that
depends on the epoch the batch iterator was built in, so a run resumed from an end-of-epoch
checkpoint batches its next epochs differently from one that was never stopped."""
import os
import re
import signal
import subprocess
import time

import pytest

from fairseq_posenc import pipeline, toy_data
from toy import TINY


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (3000, 3, 10), "valid": (40, 3, 10)})
    return pipeline.preprocess(prefixes, str(root / "bin"))


def _command(data_bin, save_dir, encoding):
    return [pipeline.executable("fairseq-train"), data_bin, "--user-dir", pipeline.USER_DIR, "--save-dir", save_dir,
            "--arch", "transformer_posenc", "--position-encoding", encoding, "--cpu", *TINY, "--dropout", "0.1",
            "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500", "--max-update", "40",
            "--save-interval-updates", "10", "--log-interval", "1", "--log-format", "simple", "--no-progress-bar",
            "--seed", "1", "--num-workers", "0"]


def _losses(text):
    """{update: loss} from fairseq's train_inner lines."""
    return {int(m.group(2)): m.group(1) for m in re.finditer(r"train_inner .*? loss=([0-9.]+),.*?num_updates=(\d+),", text)}


@pytest.mark.parametrize("encoding", ["sinusoidal", "floater"])
def test_killed_run_resumes_with_the_same_losses(data_bin, tmp_path, encoding):
    reference = subprocess.run(_command(data_bin, str(tmp_path / "whole"), encoding), capture_output=True, text=True)
    assert reference.returncode == 0, reference.stderr[-2000:]
    expected = _losses(reference.stdout)
    assert sorted(expected) == list(range(1, 41))

    save_dir = str(tmp_path / "killed")
    log = tmp_path / "first.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(_command(data_bin, save_dir, encoding), stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.time() + 300
        while 25 not in _losses(log.read_text()) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    first = _losses(log.read_text())
    assert proc.returncode == -signal.SIGKILL and 25 in first and 40 not in first  # killed mid-run
    saved = [int(n) for n in re.findall(r"Saved checkpoint .*?\(epoch 1 @ (\d+) updates", log.read_text())]
    assert saved and saved[-1] >= 20  # checkpoints every 10 updates; the kill came after one

    resumed = subprocess.run(_command(data_bin, save_dir, encoding), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    second = _losses(resumed.stdout)
    restart = min(second)  # right after the last checkpoint the killed run saved
    assert restart == saved[-1] + 1 and re.search(rf"\(epoch 1 @ {saved[-1]} updates\)", resumed.stdout)
    assert {u: second[u] for u in range(restart, 41)} == {u: expected[u] for u in range(restart, 41)}
