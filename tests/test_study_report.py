"""The length-generalisation report (fairseq_posenc/study_report.py, scripts/bleu_by_length.py) on
hand-made generations whose scores are known."""
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from fairseq_posenc.pipeline import Generation
from fairseq_posenc.study_report import (build_report, decoding_limit_note, decoding_limit_ok, markdown,
                                         paired_bootstrap, read_decoding_limit, write_report)

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
VOCAB = [f"w{i}" for i in range(200)]


def _corpus(n=500, seed=0):
    """n references of 4-20 words (even lengths, so half of each is exact); source = reference."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(VOCAB) for _ in range(2 * rng.randint(2, 10))) for _ in range(n)]


def _corrupt(refs, p, seed):
    """Each word replaced by a random one with probability p (one generator for the whole set)."""
    rng = random.Random(seed)
    return [" ".join(w if rng.random() >= p else rng.choice(VOCAB) for w in r.split()) for r in refs]


def _gen(hyps, refs):
    return Generation(list(hyps), list(refs), list(refs), list(range(len(refs))))


def _row(report, model, name):
    return next(r for r in report["models"][model] if r["bin"] == name)


def test_identical_hypotheses_score_100_with_a_zero_width_interval_against_themselves():
    refs = _corpus(60)
    report = build_report({"copy": [_gen(refs, refs)], "copy2": [_gen(refs, refs)]}, [0, 10], "words",
                          baseline="copy")
    for name in ("[0,10)", "[10,inf)"):
        row = _row(report, "copy2", name)
        assert row["bleu"] == pytest.approx(100.0) and row["chrf"] == pytest.approx(100.0)
        assert row["ratio"] == 1.0 and row["bleu_std"] == 0.0
        test = row["vs_baseline"]
        assert test["difference"] == 0.0 and test["low"] == 0.0 and test["high"] == 0.0
        assert test["significant"] is False
    assert "vs_baseline" not in _row(report, "copy", "[0,10)")  # the baseline is not compared with itself
    counts = {b["bin"]: b["sentences"] for b in report["bins"]}
    assert counts == {"[0,10)": sum(len(r.split()) < 10 for r in refs), "[10,inf)": sum(len(r.split()) >= 10 for r in refs)}


def test_hypotheses_cut_to_half_their_words_have_a_length_ratio_of_one_half():
    refs = _corpus(200)
    half = [" ".join(r.split()[: len(r.split()) // 2]) for r in refs]
    report = build_report({"sinusoidal": [_gen(refs, refs)], "short": [_gen(half, refs)]}, [0], "words")
    row = _row(report, "short", "[0,inf)")
    assert row["ratio"] == pytest.approx(0.5, abs=1e-9)  # every length is even
    assert row["seeds"][0]["sys_len"] * 2 == row["seeds"][0]["ref_len"] == sum(len(r.split()) for r in refs)
    assert row["vs_baseline"]["significant"] and row["vs_baseline"]["high"] < -40  # BP = exp(1 - 2) alone: -63


def test_a_real_difference_on_500_sentences_is_marked_and_a_random_one_is_not():
    refs = _corpus(500)
    base = _corrupt(refs, 0.3, seed=1)
    runs = {"sinusoidal": [_gen(base, refs)], "better": [_gen(_corrupt(refs, 0.2, seed=2), refs)],
            "same": [_gen(_corrupt(refs, 0.3, seed=3), refs)]}
    report = build_report(runs, [0], "words")
    better, same = _row(report, "better", "[0,inf)")["vs_baseline"], _row(report, "same", "[0,inf)")["vs_baseline"]
    # measured: better +16.1 [+13.2, +18.8] (p 0.001), same -1.3 [-4.4, +1.5] (p 0.14)
    assert better["significant"] and better["low"] > 10 and better["p_value"] < 0.01
    assert not same["significant"] and same["low"] < 0 < same["high"] and same["p_value"] > 0.05
    table = markdown(report)
    assert "| better | " in table and "]*) |" in table.split("| better |")[1].split("\n")[0]
    assert "]*" not in table.split("| same |")[1].split("\n")[0]


def test_one_seed_is_sacrebleus_own_paired_bootstrap():
    from sacrebleu.significance import PairedTest

    refs = _corpus(300)
    base, system = _corrupt(refs, 0.3, seed=1), _corrupt(refs, 0.25, seed=2)
    _, scores = PairedTest([("base", base), ("system", system)], {"BLEU": BLEU()}, [refs], test_type="bs")()
    theirs = scores["BLEU"][1]
    metric = BLEU()
    ours = paired_bootstrap(np.array(metric._extract_corpus_statistics(base, [refs])),
                            np.array(metric._extract_corpus_statistics(system, [refs])), metric)
    assert ours["p_value"] == theirs.p_value
    assert ours["score"] == pytest.approx(theirs.score, abs=1e-4)
    # sacrebleu reports the half-width of the same 95% interval around its resample mean
    assert (ours["score_high"] - ours["score_low"]) / 2 == pytest.approx(theirs.ci, abs=1e-4)


def test_seeds_give_mean_and_std_and_the_bootstrap_pools_them_per_sentence():
    refs = _corpus(120)
    seeds = [_corrupt(refs, p, seed=s) for s, p in ((4, 0.1), (5, 0.2), (6, 0.3))]
    report = build_report({"sinusoidal": [_gen(refs, refs)] * 3, "t5": [_gen(h, refs) for h in seeds]}, [0],
                          "words", seeds=[1, 2, 3])
    row = _row(report, "t5", "[0,inf)")
    per_seed = [BLEU().corpus_score(h, [refs]).score for h in seeds]
    assert [s["bleu"] for s in row["seeds"]] == pytest.approx(per_seed)
    assert row["bleu"] == pytest.approx(np.mean(per_seed)) and row["bleu_std"] == pytest.approx(np.std(per_seed, ddof=1))
    # the compared score is the BLEU of the three seeds' outputs concatenated
    pooled = BLEU().corpus_score(seeds[0] + seeds[1] + seeds[2], [refs * 3]).score
    assert row["pooled_bleu"] == pytest.approx(pooled, abs=1e-3)
    assert row["vs_baseline"]["difference"] == pytest.approx(pooled - 100.0, abs=1e-3)
    assert "± " in markdown(report) and report["seeds"] == [1, 2, 3]


def test_generations_of_other_sentences_are_refused():
    refs = _corpus(20)
    other = Generation(refs[:19], refs[:19], refs[:19], list(range(19)))
    with pytest.raises(ValueError, match=r"^t5 \(generation 1\) decoded 19 sentences, not the 20 sentences of "
                                         r"sinusoidal \(generation 1\)"):
        build_report({"sinusoidal": [_gen(refs, refs)], "t5": [other]}, [0], "words")
    with pytest.raises(ValueError, match="baseline 'rope' is not among the models: sinusoidal"):
        build_report({"sinusoidal": [_gen(refs, refs)]}, [0], "words", baseline="rope")


def test_decoding_limit_check():
    # the WMT recipes' x + 50 covers 1.5x + 10 up to 81 source tokens (80 words and the end of
    # sentence; 81 by rounding: 131 >= int(131.5)), not past
    assert decoding_limit_ok(1, 50, 81) and not decoding_limit_ok(1, 50, 82)
    assert decoding_limit_ok(1.5, 10, 500) and not decoding_limit_ok(0, 200, 200)  # fairseq's default
    assert not decoding_limit_ok(1.5, 50, 700, max_positions=1024)  # 1060 tokens needed, 1023 positions
    assert decoding_limit_note(1, 50, 120).endswith(
        "allow 170 target tokens for the longest source (120 tokens), 1.5x + 10 = 190 needed: "
        "LONG OUTPUTS MAY HAVE BEEN CUT BY IT.")
    # fairseq rounds a * L + b down: 1.5x + 10 itself passes at odd lengths, 1.5x + 9 does not
    assert decoding_limit_ok(1.5, 10, 51) and not decoding_limit_ok(1.5, 9, 51) and not decoding_limit_ok(2, 9, 51)
    log = "INFO | fairseq_cli.generate | {'generation': {'beam': 4, 'max_len_a': 1.5, 'max_len_b': 50, 'min_len': 1}"
    assert read_decoding_limit(log) == (1.5, 50) and read_decoding_limit("no config") is None


def test_report_files(tmp_path):
    refs = _corpus(80)
    report = build_report({"sinusoidal": [_gen(refs, refs)] * 2,
                           "alibi": [_gen(_corrupt(refs, 0.2, s), refs) for s in (1, 2)]}, [0, 10], "subwords",
                          footer="Decoding limit: checked.")
    paths = write_report(report, str(tmp_path / "length"), title="t")
    table = open(paths["markdown"]).read()
    counts = {b["bin"]: b["sentences"] for b in report["bins"]}
    assert table.startswith(f"| encoding | [0,10) n={counts['[0,10)']} | [10,inf) n={counts['[10,inf)']} |")
    assert "| sinusoidal | 100.0 ± 0.0 | 100.0 ± 0.0 |" in table
    assert "| sinusoidal | 1.00 / 100.0 | 1.00 / 100.0 |" in table
    assert "source length in subwords (mean ± std over 2 seeds" in table and table.endswith("Decoding limit: checked.\n")
    saved = json.load(open(paths["json"]))
    assert saved["baseline"] == "sinusoidal" and saved["bootstrap"] == {
        "samples": 1000, "seed": 12345, "unit": "sentence, all seeds' translations"}
    assert set(saved["models"]["alibi"][0]) >= {"bleu", "bleu_std", "chrf", "chrf_std", "ratio", "ratio_std",
                                                 "sentences", "seeds", "vs_baseline"}
    png = open(paths["plot"], "rb").read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 30_000  # two panels


def _generate_output(path, refs, hyps, limit=None):
    lines = [] if limit is None else [
        f"INFO | fairseq_cli.generate | {{'generation': {{'max_len_a': {limit[0]}, 'max_len_b': {limit[1]}}}}}"]
    for i, (r, h) in enumerate(zip(refs, hyps)):
        lines += [f"S-{i}\t{r}", f"T-{i}\t{r}", f"H-{i}\t-0.5\t{h}"]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_bleu_by_length_takes_one_generation_per_seed_and_a_baseline(tmp_path):
    refs = _corpus(100)
    files = {f"{m}{s}": _generate_output(tmp_path / f"{m}{s}.txt", refs, _corrupt(refs, p, s), limit=(1, 50))
             for m, p in (("good", 0.1), ("bad", 0.5)) for s in (1, 2)}
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "bleu_by_length.py"), "--generation",
                           f"good={files['good1']},{files['good2']}", f"bad={files['bad1']},{files['bad2']}",
                           "--baseline", "bad", "--seeds", "4", "5", "--bins", "0", "10", "--out", str(tmp_path / "len")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    saved = json.load(open(tmp_path / "len.json"))
    assert saved["baseline"] == "bad" and saved["seeds"] == [4, 5]
    assert all(r["vs_baseline"]["significant"] and r["vs_baseline"]["low"] > 20 for r in saved["models"]["good"])
    # sources of 4-20 words + end of sentence: 21 tokens, x + 50 = 71 >= 1.5 * 21 + 10
    assert saved["footer"].endswith("allow 71 target tokens for the longest source (21 tokens), 1.5x + 10 "
                                    "= 41 needed: outputs that long are not cut.")
    assert (tmp_path / "len.png").exists() and "| wrote " in proc.stdout


@pytest.mark.parametrize("generation, message", [
    (["a={good1}", "b={good1},{good2}"], "every model needs one generation per seed, the same number: got a 1, b 2"),
    (["a={missing}"], "no such file: "),
    (["a={empty}"], "has no H- lines: is it fairseq-generate output?"),
    (["a={good1},{good2}", "--seeds", "7"], "--seeds names 1 seeds but each model has 2 generation files"),
])
def test_bleu_by_length_bad_input_gets_one_line_and_exit_2(tmp_path, generation, message, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bleu_by_length", os.path.join(SCRIPTS, "bleu_by_length.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    refs = _corpus(10)
    paths = {"good1": _generate_output(tmp_path / "g1.txt", refs, refs),
             "good2": _generate_output(tmp_path / "g2.txt", refs, refs),
             "missing": str(tmp_path / "none.txt"), "empty": str(tmp_path / "e.txt")}
    (tmp_path / "e.txt").write_text("S-0\tx\n")
    with pytest.raises(SystemExit) as exit_:
        script.main(["--generation", *[g.format(**paths) for g in generation], "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o.md").exists()
