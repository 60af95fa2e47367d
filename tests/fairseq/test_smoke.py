"""scripts/smoke.py as a contributor runs it: one encoding trained by fairseq-train on the toy pair
and decoded by fairseq-generate, the loss and BLEU printed; an unknown encoding refused in one line."""
import os
import re
import subprocess
import sys

from fairseq_posenc.positions import POSITION_ENCODINGS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = os.path.join(REPO, "scripts", "smoke.py")


def _smoke(*args):
    return subprocess.run([sys.executable, SMOKE, *args], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_a_smoke_run_trains_and_decodes_every_test_sentence(tmp_path):
    done = _smoke("--position-encoding", "alibi", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    out = str(tmp_path / "alibi")
    trained, decoded = done.stdout.splitlines()
    numbers = re.fullmatch(rf"\| smoke alibi: fairseq-train, (\d+) updates: training loss ([\d.]+) at update "
                           rf"(\d+), ([\d.]+) at update (\d+); validation loss ([\d.]+) "
                           rf"\({out}/checkpoints/train.log\)", trained)
    assert numbers, trained
    updates, first, first_update, last, last_update, valid = (float(g) for g in numbers.groups())
    assert updates == last_update == 300 and first_update < 50
    # the loss falls by a bit at least (measured: 7.39 to 2.27 bits, validation 2.16; BLEU 39.6)
    assert last < first - 1 and valid < first - 1
    score = re.fullmatch(rf"\| smoke alibi: fairseq-generate, 100 hypotheses of 100 test sentences: BLEU ([\d.]+) "
                         rf"\({out}/generate.log; \d+ s in all\)", decoded)
    assert score and 0 <= float(score.group(1)) <= 100, decoded
    assert os.path.exists(os.path.join(out, "checkpoints", "checkpoint_last.pt"))


def test_an_unknown_encoding_is_refused_in_one_line(tmp_path):
    done = _smoke("--position-encoding", "nope", "--out", str(tmp_path))
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        f"smoke.py: unknown --position-encoding 'nope'; choose one of: {', '.join(POSITION_ENCODINGS)}"]
    assert not os.listdir(tmp_path)
