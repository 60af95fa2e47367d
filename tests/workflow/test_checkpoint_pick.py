"""recipes/posenc_workflow/train_job.py with the stub fairseq-train: a checkpoint_last.pt truncated by
a kill while fairseq copied it (recipes/posenc_workflow/checkpoint_pick.py) is set aside and the
training goes on from the newest intact checkpoint, said in one line; the next try does not fail
the same way."""
import json
import os
import subprocess
import sys

from helpers import snakemake_runs as runs

TRAIN_JOB = os.path.join(runs.REPO, "recipes", "posenc_workflow", "train_job.py")


def _train(tmp_path, **env):
    data = tmp_path / "data-bin"
    data.mkdir(exist_ok=True)
    for name in ("dict.de.txt", "train.de-en.de.bin", "valid.de-en.de.bin"):
        (data / name).write_text("x\n")
    return subprocess.run([sys.executable, TRAIN_JOB, "--record", str(tmp_path / "trained.json"),
                           "--checkpoints", str(tmp_path / "checkpoints"), "--config-id", "c", "--code", "k",
                           "--data", str(data), "--max-update", "6", "--",
                           "fairseq-train", str(data), "--max-update", "6", "--save-interval-updates", "2",
                           "--keep-interval-updates", "5", "--log-interval", "100"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": f"{runs.STUBS}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
                               "STUB_LOG": str(tmp_path / "calls.jsonl"), "STUB_UPDATES_PER_EPOCH": "1000", **env})


def test_a_truncated_checkpoint_last_resumes_from_the_newest_intact_checkpoint(tmp_path):
    # killed after the save of update 4: checkpoint_1_4.pt written whole, its copy checkpoint_last.pt cut
    first = _train(tmp_path, STUB_FAIL_AFTER="4")
    assert first.returncode == 1, first.stderr
    (save_dir,) = (tmp_path / "checkpoints").iterdir()
    last = save_dir / "checkpoint_last.pt"
    whole = last.read_bytes()
    last.write_bytes(whole[: len(whole) // 2])
    (save_dir / "checkpoint_best.pt").write_bytes(b"")  # its copy had not begun
    second = _train(tmp_path)
    assert second.returncode == 0, second.stderr
    notes = [line for line in second.stdout.splitlines() if "cannot be read" in line]
    assert len(notes) == 1
    assert notes[0].startswith(f"| {last} cannot be read (") and notes[0].endswith(
        "): kept as checkpoint_last.pt.truncated, going on from checkpoint_1_4.pt (update 4), the newest intact "
        "checkpoint")
    with open(tmp_path / "calls.jsonl") as f:
        trains = [(c["from"], c["to"]) for c in map(json.loads, f) if c["command"] == "train"]
    assert trains == [(0, 4), (4, 6)]
    assert runs.updates(str(last)) == 6 and (save_dir / "checkpoint_last.pt.truncated").stat().st_size == len(whole) // 2
