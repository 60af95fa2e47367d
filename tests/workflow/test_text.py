"""recipes/posenc_workflow/text.py: lines end at "\\n" only, input is streamed, bad input gets one line."""
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "recipes", "posenc_workflow", "text.py")


def _run(*args, stdin: bytes = b""):
    return subprocess.run([sys.executable, SCRIPT, *args], input=stdin, capture_output=True)


def test_tokenize_keeps_one_output_line_per_input_line_whatever_the_unicode_separators():
    # U+2028 and U+0085 are line boundaries to str.splitlines, not to subword-nmt or fairseq
    text = "A well-known \u2028 fact.\nNext\u0085line, \"quoted\".\nlast line without newline"
    proc = _run("tokenize", "--lang", "en", "--workers", "2", stdin=text.encode("utf-8"))
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode("utf-8").split("\n")
    assert len(out) == 4 and out[3] == ""  # three lines, each ended by "\n"
    assert out[0].startswith("A well @-@ known") and out[0].endswith("fact .")
    # remove-non-printing-char.perl turns the C1 control U+0085 into a space; Moses' normaliser,
    # for English, moves the period inside the quotes
    assert out[1] == "Next line , &quot; quoted . &quot;"
    assert out[2] == "last line without newline"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_tokenize_refuses_input_that_is_not_utf8_with_one_line(workers):
    proc = _run("tokenize", "--lang", "de", "--workers", workers, stdin="Weg\nStra\xdfe\n".encode("latin-1"))
    assert proc.returncode == 2
    assert proc.stderr.decode().strip() == ("text.py tokenize: error: input is not UTF-8 "
                                           "(line 2: invalid continuation byte at byte 4)")


def test_clean_keeps_pairs_aligned_across_unicode_separators(tmp_path):
    src, tgt = tmp_path / "c.en", tmp_path / "c.de"
    src.write_text("one\u2028two three\nfour\nfive six seven eight nine\n", encoding="utf-8")
    tgt.write_text("eins zwei drei\nvier\nfuenf\n", encoding="utf-8")
    out_src, out_tgt = tmp_path / "o.en", tmp_path / "o.de"
    proc = _run("clean", "--src", str(src), "--tgt", str(tgt), "--out-src", str(out_src), "--out-tgt", str(out_tgt))
    assert proc.returncode == 0, proc.stderr.decode()
    # the first pair is 2 tokens against 3 (ratio 1.5, kept), the last 5 against 1 (dropped)
    assert out_src.read_text(encoding="utf-8") == "one\u2028two three\nfour\n"
    assert out_tgt.read_text(encoding="utf-8") == "eins zwei drei\nvier\n"
    assert "kept 2 of 3 pairs" in proc.stderr.decode()


def test_generate_output_keeps_a_hypothesis_that_holds_a_unicode_line_separator():
    from posenc_workflow.generation import parse_generate_output

    text = "S-1\tsrc b\nT-1\tref b\nH-1\t-0.2\thyp \u2028 b\nS-0\tsrc a\nT-0\tref a\nH-0\t-0.1\thyp a\n"
    generation = parse_generate_output(text)
    assert generation.hypotheses == ["hyp a", "hyp \u2028 b"]
    assert generation.references == ["ref a", "ref b"] and generation.sources == ["src a", "src b"]


def test_test_set_is_tokenized_as_fairseqs_scripts_do_and_training_text_as_moses_pipeline():
    # fairseq's prepare-wmt14en2*.sh: the test set only gets ’ -> ' before tokenizer.perl -a, so
    # „quotes“ and the full-width comma stay as they are; training text goes through
    # normalize-punctuation.perl (quotes -> &quot;) and remove-non-printing-char.perl (\p{C} -> space)
    text = "Das ist’s: „gut“，sagt\u200ber.\n"
    test = _run("tokenize", "--lang", "de", "--workers", "1", "--test-set", stdin=text.encode("utf-8"))
    train = _run("tokenize", "--lang", "de", "--workers", "1", stdin=text.encode("utf-8"))
    assert test.returncode == 0 and train.returncode == 0, test.stderr.decode() + train.stderr.decode()
    assert test.stdout.decode("utf-8") == "Das ist &apos; s : „ gut “ ， sagt \u200b er .\n"
    assert train.stdout.decode("utf-8") == "Das ist &apos; s : &quot; gut &quot; ， sagt er .\n"


def test_clean_streams_its_input_and_refuses_unequal_files_leaving_no_output(tmp_path):
    # 200k pairs: a list-based clean holds every line of the four files (~60 MB of Python
    # strings here); streamed, the peak stays near the interpreter's own
    src, tgt = tmp_path / "c.en", tmp_path / "c.de"
    src.write_text("a b c d e f g h\n" * 200_000)
    tgt.write_text("a b c d e f g\n" * 199_999 + "a\n")
    out = [tmp_path / n for n in ("o.en", "o.de", "t.en", "t.de")]
    code = ("import resource, sys\nimport text\nrc = 0\n"
            "try:\n    text.main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\nsys.exit(rc)")
    args = ["clean", "--src", str(src), "--tgt", str(tgt), "--out-src", str(out[0]), "--out-tgt", str(out[1]),
            "--also", str(src), str(tgt), "--also-out", str(out[2]), str(out[3])]
    env = {**os.environ, "PYTHONPATH": os.path.dirname(SCRIPT)}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "kept 199999 of 200000 pairs" in proc.stderr.decode()  # the last pair's ratio is 8
    baseline = subprocess.run([sys.executable, "-c", "import resource, text; "
                               "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"], capture_output=True, env=env)
    grown_kb = int(proc.stdout.split()[-1]) - int(baseline.stdout.split()[-1])
    assert grown_kb < 15_000, grown_kb  # measured: 1.1 MB streamed; 67 MB when the files were read into lists
    assert out[0].read_text().count("\n") == 199_999 and out[3].read_text() == "a b c d e f g\n" * 199_999
    # one line short on one side: one line of error and no output at any name
    tgt.write_text("a b c d e f g\n" * 199_999)
    for path in out:
        path.unlink()
    proc = _run(*args)
    assert proc.returncode == 2
    assert proc.stderr.decode().strip() == (f"text.py clean: error: {src} has 200000 lines but {tgt} "
                                            "has 199999")
    assert not any(p.exists() for p in out) and sorted(os.listdir(tmp_path)) == ["c.de", "c.en"]
