"""--randomized-positions through fairseq's CLI: a RoPE model trained with it decodes the same hypotheses
whatever the batch (the encoder's evaluation draw is each sentence's own), and a decode that drops the
option is refused in one line naming both (models/checkpoint_settings.py). Two processes: the
training, then the decodes (fairseq_runs)."""
import pytest

from posenc_workflow import toy_data
from helpers.fairseq_runs import generate_command, outcome, preprocess_here, run_all, train_command
from helpers.toy import TINY

TRAIN = ["--arch", "transformer_posenc", "--cpu", *TINY, "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500",
         "--seed", "1", "--no-epoch-checkpoints", "--no-progress-bar", "--disable-validation", "--max-update", "2",
         "--position-encoding", "rope", "--randomized-positions"]
GENERATE = ["--gen-subset", "valid", "--beam", "2", "--max-len-b", "10"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("randomized")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (40, 3, 8), "valid": (8, 3, 8)})
    data = preprocess_here(prefixes, str(root / "bin"))
    trained = run_all([("train", "fairseq-train", train_command(data, str(root / "rope"), TRAIN))], str(root / "train"))
    path = str(root / "rope" / "checkpoint_last.pt")
    decodes = run_all([
        ("batch8", "fairseq-generate", generate_command(data, path, [*GENERATE, "--batch-size", "8"])),
        ("batch1", "fairseq-generate", generate_command(data, path, [*GENERATE, "--batch-size", "1"])),
        ("dropped", "fairseq-generate", generate_command(data, path, [
            *GENERATE, "--batch-size", "8", "--model-overrides", repr({"randomized_positions": False})])),
    ], str(root / "decodes"))
    return trained, decodes, path


def _hypotheses(run):
    """{sentence: (score, tokens)} of a decode's H- lines."""
    found = {}
    for line in run["stdout"].splitlines():
        if line.startswith("H-"):
            name, score, tokens = line.split("\t")
            found[name] = (float(score), tokens)
    return found


def test_a_decode_is_the_same_on_any_batching(runs):
    """The same tokens, the same scores but for the rounding of other batch shapes (1e-5 of a score
    of about 3; another draw of the encoder's positions moves them by tenths)."""
    trained, decodes, _ = runs
    outcome(trained, "train")
    eight, one = _hypotheses(outcome(decodes, "batch8")), _hypotheses(outcome(decodes, "batch1"))
    assert len(eight) == 8 and eight.keys() == one.keys()
    for name, (score, tokens) in eight.items():
        assert one[name][1] == tokens and one[name][0] == pytest.approx(score, abs=1e-5), name


def test_a_decode_without_the_option_is_refused_in_one_line(runs):
    _, decodes, path = runs
    run = decodes["dropped"]
    assert not run["ok"] and "Traceback" not in run["stderr"]
    assert run["stderr"].strip().splitlines()[-1] == (
        f"fairseq-generate: error: {path} was trained with --position-encoding rope --randomized-positions; this "
        "decode gives --position-encoding rope no --randomized-positions: a decode runs the model as trained: drop "
        "the position settings from --model-overrides (those a decode may change: docs/encodings.md)")
