"""The short-to-long split (scripts/length_split.py); the per-bin report is tests/unit/test_study_report.py."""
import json
import os
import subprocess
import sys

import pytest

from posenc_workflow.length_bins import make_bins, split_by_length

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts")


def _corpus(tmp_path, lengths):
    src = [" ".join(f"s{(i + j) % 7}" for j in range(n)) for i, n in enumerate(lengths)]
    tgt = [" ".join(f"t{(i + j) % 7}" for j in range(n)) for i, n in enumerate(lengths)]
    (tmp_path / "c.en").write_text("\n".join(src) + "\n")
    (tmp_path / "c.de").write_text("\n".join(tgt) + "\n")
    return str(tmp_path / "c.en"), str(tmp_path / "c.de")


def test_bins_follow_floaters_protocol():
    assert [b.name for b in make_bins([80, 100, 120, 140])] == ["[80,100)", "[100,120)", "[120,140)", "[140,inf)"]
    with pytest.raises(ValueError, match="bin edges must be increasing"):
        make_bins([100, 80])


def test_split_by_source_length(tmp_path):
    lengths = [5, 79, 80, 99, 100, 119, 120, 139, 140, 400, 12]
    src, tgt = _corpus(tmp_path, lengths)
    manifest = split_by_length(src, tgt, str(tmp_path / "split"), "en", "de", unit="subwords")
    counts = {p["name"]: p["sentences"] for p in manifest["parts"]}
    assert counts == {"train": 3, "[80,100)": 2, "[100,120)": 2, "[120,140)": 2, "[140,inf)": 2}
    assert manifest["unit"] == "subwords"
    long_src = (tmp_path / "split" / "long.140-inf.en").read_text().splitlines()
    long_tgt = (tmp_path / "split" / "long.140-inf.de").read_text().splitlines()
    assert [len(s.split()) for s in long_src] == [140, 400] and [len(t.split()) for t in long_tgt] == [140, 400]
    assert json.loads((tmp_path / "split" / "split.json").read_text())["train_below"] == 80


@pytest.mark.parametrize("problem, message", [
    ("unequal", "has 3 lines but"), ("empty", "is empty"), ("latin1", "is not UTF-8"), ("missing", "no such file"),
])
def test_bad_corpora_get_one_clear_line_and_exit_2(tmp_path, problem, message):
    src, tgt = tmp_path / "a.en", tmp_path / "a.de"
    src.write_text("a b\nc d\ne f\n")
    tgt.write_text({"unequal": "x\ny\n", "empty": "", "latin1": "", "missing": ""}[problem])
    if problem == "empty":
        src.write_text("")
    if problem == "latin1":
        tgt.write_bytes("caf\xe9\nb\nc\n".encode("latin-1"))
    if problem == "missing":
        tgt.unlink()
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "length_split.py"), "--src", str(src), "--tgt",
                           str(tgt), "--src-lang", "en", "--tgt-lang", "de", "--out-dir", str(tmp_path / "out")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "train.en").exists()


def test_lengths_only_says_what_a_short_to_long_split_trains_on_and_tests_and_writes_nothing(tmp_path):
    """Lengths 1..100 once each: 49 shorter than 50; [50,60) 10, [60,80) 20, [80,inf) 21."""
    text = tmp_path / "train.de"
    text.write_text("".join(" ".join(["w"] * n) + "\n" for n in range(1, 101)))
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "length_split.py"), "--src", str(text),
                           "--lengths-only", "--train-below", "50", "--bins", "50", "60", "80"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"| {text}: 100 sentences, mean 50.5 tokens, longest 100; 50th percentile 50, 90th percentile 90" in proc.stdout
    assert "| shorter than 50 (trained on): 49 (49.00%)" in proc.stdout
    assert ("| [50,60): 10 sentences (tested)\n| [60,80): 20 sentences (tested)\n| [80,inf): 21 sentences (tested)"
            in proc.stdout)
    assert os.listdir(tmp_path) == ["train.de"]
    # a split needs its other arguments
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "length_split.py"), "--src", str(text)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "the following arguments are required: --tgt, --src-lang, --tgt-lang, --out-dir" \
        in proc.stderr


def test_a_line_ends_at_newline_only_so_pairs_stay_aligned(tmp_path):
    # U+2028 and U+0085 split a line for str.splitlines, not for fairseq-preprocess
    (tmp_path / "c.en").write_text("a\u2028b c\nd\u0085e\n", encoding="utf-8")
    (tmp_path / "c.de").write_text("x y z\nw v\n", encoding="utf-8")
    manifest = split_by_length(str(tmp_path / "c.en"), str(tmp_path / "c.de"), str(tmp_path / "split"), "en", "de")
    assert {p["name"]: p["sentences"] for p in manifest["parts"]}["train"] == 2
    assert (tmp_path / "split" / "train.en").read_text(encoding="utf-8") == "a\u2028b c\nd\u0085e\n"
