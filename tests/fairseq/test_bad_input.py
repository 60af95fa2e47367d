"""Bad input stops fairseq's CLI with one line that says what is wrong, a non-zero exit, and
nothing written (compat.PosencError / compat.short_user_errors, compat.clear_checkpoint_errors)."""
import os
import subprocess

import pytest
import torch

from posenc_workflow import pipeline, toy_data
from fairseq_posenc.compat import PosencError
from fairseq_posenc.positions import POSITION_ENCODINGS
from helpers.fairseq_runs import preprocess_here
from helpers.toy import TINY, build_model, toy_batch

# the encodings whose tables end at --max-*-positions, from the registry
TABLE_BOUND = [name for name, scheme in POSITION_ENCODINGS.items() if not scheme.extrapolates]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_input")
    # test1: sentences of 20 to 24 words, longer than the 12 positions of the short models below
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (40, 3, 10), "valid": (10, 3, 10),
                                                              "test": (10, 3, 10), "test1": (3, 20, 24)})
    return preprocess_here(prefixes, str(root / "bin"))


def _run(tool, *args):
    proc = subprocess.run([pipeline.executable(tool), *args], capture_output=True, text=True)
    return proc.returncode, proc.stderr.strip().splitlines()


def _train(data_bin, save_dir, *flags):
    return _run("fairseq-train", data_bin, "--user-dir", pipeline.USER_DIR, "--save-dir", str(save_dir),
                "--arch", "transformer_posenc", "--cpu", *TINY, "--optimizer", "adam", "--lr", "1e-3",
                "--max-tokens", "300", "--max-update", "1", "--no-progress-bar", "--num-workers", "0", *flags)


def _generate(data_bin, checkpoint, *flags):
    return _run("fairseq-generate", data_bin, "--user-dir", pipeline.USER_DIR, "--path", str(checkpoint), "--cpu",
                *flags)


def test_unknown_encoding_lists_the_choices(data_bin, tmp_path):
    code, stderr = _train(data_bin, tmp_path / "run", "--position-encoding", "rotary")
    assert code == 2
    choices = ", ".join(repr(name) for name in POSITION_ENCODINGS)  # argparse's order: the registry's
    assert stderr[-1] == (f"fairseq-train: error: argument --position-encoding: invalid choice: 'rotary' "
                          f"(choose from {choices})")
    assert not any(line.startswith("usage:") for line in stderr)  # not fairseq-train's whole usage before it
    assert not (tmp_path / "run").exists()


def test_rope_with_an_odd_head_size_stops_at_build_with_one_line(data_bin, tmp_path):
    code, stderr = _train(data_bin, tmp_path / "run", "--position-encoding", "rope", "--attention-head-dim", "7")
    assert code == 1
    assert stderr[-1] == "fairseq-train: error: rope needs an even head size, got 7; set --attention-head-dim"
    assert not any("Traceback" in line for line in stderr)
    assert not os.path.exists(tmp_path / "run") or os.listdir(tmp_path / "run") == []


def test_the_table_bound_encodings_are_known():
    assert {"learned", "diet_abs"} <= set(TABLE_BOUND)


@pytest.mark.parametrize("encoding", TABLE_BOUND)
def test_past_its_maximum_length_a_table_bound_encoding_names_the_limit_and_the_flag(encoding):
    model = build_model("transformer_posenc", "--position-encoding", encoding, max_positions=16).eval()
    scheme = type(model.encoder.position_encoding).__name__
    src, lengths, prev = toy_batch(model.encoder.dictionary, [20, 5], tgt_len=4)
    with pytest.raises(PosencError) as error:
        model(src, lengths, prev)
    assert str(error.value) == (f"encoder input of length 20 exceeds the 16 positions this {scheme} was built "
                                "with (--max-source-positions); it cannot extrapolate past them")
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5], tgt_len=17)
    with pytest.raises(PosencError) as error:
        model(src, lengths, prev)
    assert str(error.value) == (f"decoder input of length 17 exceeds the 16 positions this {scheme} was built "
                                "with (--max-target-positions); it cannot extrapolate past them")


@pytest.mark.parametrize("encoding", TABLE_BOUND)
def test_generate_on_sentences_longer_than_the_checkpoint_takes_gets_one_line(data_bin, tmp_path, encoding):
    # fairseq-generate checks every sentence against the model's positions before decoding; the
    # encoding's own check (above) is for inputs given in Python
    code, stderr = _train(data_bin, tmp_path / "run", "--position-encoding", encoding,
                          "--max-source-positions", "12", "--max-target-positions", "12")
    assert code == 0, stderr[-5:]
    checkpoint = tmp_path / "run" / "checkpoint_last.pt"
    code, stderr = _generate(data_bin, checkpoint, "--gen-subset", "test1")
    assert code == 1
    # sentence 2 of test1, the first fairseq checks (it orders them by length): 21 words and </s>
    assert stderr[-1] == ("fairseq-generate: error: sentence 2 has 22 source and 22 target tokens, more than the "
                          "12 source and 12 target positions the model takes (--max-source-positions, "
                          "--max-target-positions); skip such sentences with --skip-invalid-size-inputs-valid-test")
    assert not any("Traceback" in line for line in stderr)
    # raising the positions when loading, as the extrapolating encodings allow, cannot grow the table
    code, stderr = _generate(data_bin, checkpoint, "--gen-subset", "test1", "--model-overrides",
                             "{'max_source_positions': 64, 'max_target_positions': 64}")
    assert code == 1 and not any("Traceback" in line for line in stderr)
    scheme = POSITION_ENCODINGS[encoding].__name__
    assert stderr[-1].startswith("fairseq-generate: error: encoder.")
    assert stderr[-1].endswith(f"{scheme} cannot extrapolate, its table ends at the --max-source-positions it "
                               "was trained with; do not raise that with --model-overrides")


def test_truncated_checkpoint_gets_one_line(data_bin, tmp_path):
    whole = tmp_path / "whole.pt"
    torch.save({"model": {"w": torch.randn(1000)}, "cfg": None}, whole)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(whole.read_bytes()[:2000])
    code, stderr = _generate(data_bin, truncated)
    assert code == 1
    assert stderr[-1].startswith(f"fairseq-generate: error: {truncated} is not a readable checkpoint "
                                 "(truncated or corrupted?): PytorchStreamReader failed reading zip archive")
    assert not any("Traceback" in line for line in stderr)


def test_foreign_torch_file_is_not_taken_for_a_checkpoint(data_bin, tmp_path):
    foreign = tmp_path / "weights.pt"
    torch.save({"weights": torch.ones(3), "step": 7}, foreign)
    code, stderr = _generate(data_bin, foreign)
    assert code == 1
    assert stderr[-1] == f"fairseq-generate: error: {foreign} is not a fairseq checkpoint: its entries are 'weights', 'step'"
    assert not any("Traceback" in line for line in stderr)
