"""A training run killed with SIGKILL mid-epoch and restarted with the same command continues
from its last checkpoint and logs the same losses as a run that was never interrupted.

The run kills itself right after update 25 (``KILL`` below wraps fairseq-train, for this test
only), with checkpoints saved at updates 10 and 20: the kill point is the same on any machine,
however loaded, where polling the log from outside raced with training.

The 40 updates stay within the first epoch: fairseq freezes an epoch's batches with a seed that
depends on the epoch the batch iterator was built in, so a run resumed from an end-of-epoch
checkpoint batches its next epochs differently from one that was never stopped."""
import os
import re
import signal
import subprocess
import sys

import pytest

from posenc_workflow import pipeline, toy_data
from helpers.toy import TINY
from helpers.fairseq_runs import preprocess_here


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (3000, 3, 10), "valid": (40, 3, 10)})
    return preprocess_here(prefixes, str(root / "bin"))


def _command(data_bin, save_dir, encoding):
    return [pipeline.executable("fairseq-train"), data_bin, "--user-dir", pipeline.USER_DIR, "--save-dir", save_dir,
            "--arch", "transformer_posenc", "--position-encoding", encoding, "--cpu", *TINY, "--dropout", "0.1",
            "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500", "--max-update", "40",
            "--save-interval-updates", "10", "--log-interval", "1", "--log-format", "simple", "--no-progress-bar",
            "--seed", "1", "--num-workers", "0"]


KILL_AT = 25

# fairseq-train, killed by SIGKILL from inside once its trainer has finished update $KILL_AT_UPDATE
KILL = """
import os, signal, sys
from fairseq_cli.train import cli_main  # first: it sets up fairseq's logging to stdout
from fairseq.trainer import Trainer

kill_at, train_step = int(os.environ["KILL_AT_UPDATE"]), Trainer.train_step

def train_step_then_kill(self, *args, **kwargs):
    out = train_step(self, *args, **kwargs)
    if self.get_num_updates() == kill_at:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return out

Trainer.train_step = train_step_then_kill
sys.argv[0] = "fairseq-train"
cli_main()
"""


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
    command = _command(data_bin, save_dir, encoding)
    killed = subprocess.run([sys.executable, "-c", KILL, *command[1:]], capture_output=True, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "KILL_AT_UPDATE": str(KILL_AT)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    first = _losses(killed.stdout)
    # killed inside update 25's step, before it was logged: updates 21-25 are lost
    assert sorted(first) == list(range(1, KILL_AT))
    assert {u: first[u] for u in first} == {u: expected[u] for u in first}
    saved = [int(n) for n in re.findall(r"Saved checkpoint .*?\(epoch 1 @ (\d+) updates", killed.stdout)]
    assert saved == [10, 20]

    resumed = subprocess.run(command, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    second = _losses(resumed.stdout)
    # from the last checkpoint the killed run saved (update 20), to the end
    loaded = r"Loaded checkpoint .*checkpoint_last\.pt \(epoch 1 @ 20 updates\)"
    assert re.search(loaded, resumed.stdout + resumed.stderr)
    assert sorted(second) == list(range(21, 41))
    assert second == {u: expected[u] for u in range(21, 41)}
