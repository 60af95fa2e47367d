"""recipes/posenc_workflow/rerank.py: GNMT's length penalty by reranking fairseq's n-best list.

The method: fairseq's beam search finalizes the same hypotheses whatever --lenpen is (the penalty
only divides the score stored with a finished hypothesis, which orders the final list), so the
n-best list with raw scores (--nbest BEAM --unnormalized) holds every hypothesis a penalized
search could pick. Checked here through fairseq-generate itself on a tiny model: reranking with
|Y|^0.6 reproduces --lenpen 0.6, and reranking with ((5+|Y|)/6)^0.6 reproduces fairseq's own
generator with that divisor put in place of (step + 1) ** lenpen."""
import os
import re
import subprocess
import sys

import pytest

from posenc_workflow import pipeline, toy_data
from helpers.tolerances import float32_tolerance
from helpers.toy import TINY
from helpers.fairseq_runs import preprocess_here

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RERANK = os.path.join(REPO, "recipes", "posenc_workflow", "rerank.py")
from posenc_workflow import rerank as rerank_lenpen  # noqa: E402
from posenc_workflow.rerank import length_penalty  # noqa: E402
from posenc_workflow.scoring import load_generation  # noqa: E402

BEAM = 5
ALPHA = 0.6


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("length, alpha, form, value", [
    (1, 0.6, "fairseq", 1.0), (1, 0.6, "gnmt", 1.0),  # |Y| = 1 (EOS alone): no penalty in either form
    (32, 0.6, "fairseq", 8.0),                        # 32^0.6 = 2^3
    (9, 0.5, "fairseq", 3.0),
    (7, 1.0, "gnmt", 2.0),                            # (5 + 7) / 6
    (19, 0.5, "gnmt", 2.0),                           # sqrt(24 / 6)
    (43, 0.25, "gnmt", 2 ** 0.75),                    # (48 / 6)^0.25 = 8^0.25
    (10, 0.0, "fairseq", 1.0), (10, 0.0, "gnmt", 1.0),
])
def test_length_penalty_by_hand(length, alpha, form, value):
    assert length_penalty(length, alpha, form) == pytest.approx(value, rel=1e-15)


def test_length_penalty_refuses_what_it_cannot_be():
    with pytest.raises(ValueError, match="at least one token"):
        length_penalty(0, 0.6, "gnmt")
    with pytest.raises(ValueError, match="unknown length penalty form"):
        length_penalty(3, 0.6, "t2t")


# two hypotheses the forms order differently, by hand (base-2 scores, as fairseq prints them):
# A: 1 token + EOS, raw -2;  B: 9 tokens + EOS, raw -4
#   fairseq: A -2 / 2^0.6 = -1.320,  B -4 / 10^0.6 = -1.005  -> B
#   gnmt:    A -2 / (7/6)^0.6 = -1.823,  B -4 / (15/6)^0.6 = -2.308  -> A
NBEST = ("S-0\tsource\nT-0\treference\n"
         "H-0\t-2.0\ta\nD-0\t-2.0\ta\nP-0\t-1.0000 -1.0000\nA-0\t0-0\n"
         "H-0\t-4.0\tb b b b b b b b b\nD-0\t-4.0\tb b b b b b b b b\n"
         "P-0\t" + " ".join(["-0.4000"] * 10) + "\nA-0\t0-1\n"
         "Generate test with beam=2: BLEU4 = 0.00\n")


def _rerank(tmp_path, text, *args):
    gen = tmp_path / "nbest.txt"
    gen.write_text(text, encoding="utf-8")
    out = tmp_path / "out.txt"
    proc = subprocess.run([sys.executable, RERANK, "--generation", str(gen), "--out", str(out), *args],
                          capture_output=True, text=True)
    return proc, (out.read_text(encoding="utf-8").splitlines() if proc.returncode == 0 else None)


@pytest.mark.parametrize("form, chosen, length", [("fairseq", "b b b b b b b b b", 10), ("gnmt", "a", 2)])
def test_rerank_by_hand(tmp_path, form, chosen, length):
    proc, lines = _rerank(tmp_path, NBEST, "--form", form, "--alpha", "0.6", "--beam", "2")
    assert proc.returncode == 0, proc.stderr
    raw = -2.0 if chosen == "a" else -4.0
    score = raw / length_penalty(length, 0.6, form)
    # one hypothesis, fairseq's lines for it, the penalized score on H- and D-; no BLEU line
    assert lines[:2] == ["S-0\tsource", "T-0\treference"]
    assert lines[2:4] == [f"H-0\t{score!r}\t{chosen}", f"D-0\t{score!r}\t{chosen}"]
    assert lines[4].startswith("P-0\t") and len(lines[4].split("\t")[1].split()) == length
    assert lines[5] == ("A-0\t0-0" if chosen == "a" else "A-0\t0-1") and len(lines) == 6
    other = "gnmt" if form == "fairseq" else "fairseq"
    assert f"{form} length penalty, alpha 0.6: the best by raw score replaced in {int(chosen != 'a')}, " \
           f"{other}'s form would pick another in 1" in proc.stderr


def test_rerank_refuses_normalized_scores_and_short_lists(tmp_path):
    normalized = NBEST.replace("-4.0\t", "-1.0047545726\t")  # B's score after fairseq's --lenpen 0.6
    proc, _ = _rerank(tmp_path, normalized, "--form", "gnmt")
    assert proc.returncode == 2 and "the scores are normalized; decode with --unnormalized" in proc.stderr
    proc, _ = _rerank(tmp_path, NBEST, "--form", "gnmt", "--beam", "4")
    assert proc.returncode == 2 and "1 sentence(s) do not have 4 hypotheses (sentence 0 has 2)" in proc.stderr
    one_best = "".join(line + "\n" for line in NBEST.splitlines()[:6])
    proc, _ = _rerank(tmp_path, one_best, "--form", "gnmt")
    assert proc.returncode == 2 and "nothing to rerank" in proc.stderr


# ------------------------------------------------------------------------------------------------
# fairseq's generator with ((5 + |Y|) / 6)^alpha in place of |Y|^alpha: finalize_hypos divides by
# ``(step + 1) ** self.len_penalty``; an exponent object whose __rpow__ returns GNMT's divisor
# changes that one expression and nothing else of fairseq-generate
GNMT_GENERATE = '''
import sys
import fairseq.sequence_generator as sg


class GnmtExponent:
    def __init__(self, alpha):
        self.alpha = alpha

    def __rpow__(self, length):  # (step + 1) ** exponent
        return ((5.0 + length) / 6.0) ** self.alpha


init = sg.SequenceGenerator.__init__


def patched(self, *args, **kwargs):
    init(self, *args, **kwargs)
    self.len_penalty = GnmtExponent(self.len_penalty)


sg.SequenceGenerator.__init__ = patched
from fairseq_cli.generate import cli_main  # noqa: E402

sys.argv[0] = "fairseq-generate"
cli_main()
'''


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    """A tiny model trained 150 updates (half-learned: length penalties change some choices),
    decoded four ways with the same batches."""
    root = tmp_path_factory.mktemp("rerank")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (600, 3, 10), "valid": (20, 3, 10),
                                                              "test": (60, 3, 14)})
    data_bin = preprocess_here(prefixes, str(root / "bin"))
    save_dir = str(root / "model")
    pipeline.train(data_bin, save_dir, [
        "--arch", "transformer_posenc", "--position-encoding", "sinusoidal", "--cpu", *TINY,
        "--optimizer", "adam", "--lr", "3e-3", "--max-tokens", "1000", "--max-update", "150",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--disable-validation",
        "--no-epoch-checkpoints", "--no-progress-bar", "--seed", "3", "--num-workers", "0"])
    common = [data_bin, "--user-dir", pipeline.USER_DIR, "--path", os.path.join(save_dir, "checkpoint_last.pt"),
              "--gen-subset", "test", "--beam", str(BEAM), "--nbest", str(BEAM), "--batch-size", "64", "--cpu",
              "--max-len-a", "1.5", "--max-len-b", "10"]
    (root / "gnmt_generate.py").write_text(GNMT_GENERATE)
    runs = {"lenpen": [pipeline.executable("fairseq-generate"), *common, "--lenpen", str(ALPHA)],
            "unnormalized": [pipeline.executable("fairseq-generate"), *common, "--unnormalized"],
            "lenpen0": [pipeline.executable("fairseq-generate"), *common, "--lenpen", "0"],
            "gnmt": [sys.executable, str(root / "gnmt_generate.py"), *common, "--lenpen", str(ALPHA)]}
    out = {}
    for name, cmd in runs.items():
        out[name] = root / f"{name}.txt"
        out[name].write_text(pipeline.run(cmd, str(root / f"{name}.log"), capture_stdout=True), encoding="utf-8")
    for form in ("fairseq", "gnmt"):
        out[f"rerank_{form}"] = root / f"rerank_{form}.txt"
        proc = subprocess.run([sys.executable, RERANK, "--generation", str(out["unnormalized"]), "--out",
                               str(out[f"rerank_{form}"]), "--form", form, "--alpha", str(ALPHA), "--beam", str(BEAM)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        out[f"summary_{form}"] = proc.stderr
    return out


def _sentences(path):
    return {s.id: s for s in rerank_lenpen.parse_nbest(path.read_text(encoding="utf-8").split("\n"), str(path))}


def _penalized(hypothesis, form):
    return hypothesis.score / length_penalty(hypothesis.length, ALPHA, form)


def _acceptable(sentence, form):
    """The hypotheses fairseq may rank first: the best by raw / lp, and any other within float32
    rounding of it (fairseq divides in float32, rounding the divisor, the quotient and the base-2
    conversion: 3 roundings on each side)."""
    scores = [_penalized(h, form) for h in sentence.hypotheses]
    best = max(scores)
    tolerance = float32_tolerance(3, abs(best))
    return {h.text for h, s in zip(sentence.hypotheses, scores) if best - s <= tolerance}


def _top1(path):
    return {sid: s.hypotheses[0].text for sid, s in _sentences(path).items()}


def test_raw_scores_and_the_finalized_set_do_not_depend_on_lenpen(decoded):
    # --unnormalized and --lenpen 0 print the same hypotheses with the same raw scores
    kept = re.compile(r"^[STHDP]-\d+\t")
    unnormalized, lenpen0 = ([line for line in decoded[k].read_text(encoding="utf-8").split("\n") if kept.match(line)]
                             for k in ("unnormalized", "lenpen0"))
    assert unnormalized == lenpen0 and len(unnormalized) == 60 * (2 + 3 * BEAM)
    raw = _sentences(decoded["unnormalized"])
    rerank_lenpen.check_unnormalized(list(raw.values()))  # each H- score is the sum of its P- line
    # every run holds the same BEAM hypotheses per sentence, with the same per-token scores
    for name in ("lenpen", "gnmt"):
        other = _sentences(decoded[name])
        assert set(other) == set(raw) and len(raw) == 60
        for sid, sentence in raw.items():
            assert len(sentence.hypotheses) == BEAM
            assert sorted((h.text, h.positional) for h in other[sid].hypotheses) == \
                sorted((h.text, h.positional) for h in sentence.hypotheses), (name, sid)


def test_fairseq_form_reproduces_lenpen(decoded):
    raw = _sentences(decoded["unnormalized"])
    fairseq_top, reranked = _top1(decoded["lenpen"]), _top1(decoded["rerank_fairseq"])
    assert list(reranked) == list(fairseq_top)  # every sentence, in fairseq's order
    for sid, text in fairseq_top.items():
        if reranked[sid] != text:  # only where fairseq's float32 scores cannot tell them apart
            assert {text, reranked[sid]} <= _acceptable(raw[sid], "fairseq"), sid
    exact = sum(reranked[sid] == text for sid, text in fairseq_top.items())
    assert exact >= 59, f"{exact} of 60"  # near-ties are rare: none measured
    # the penalized scores are fairseq's (its float32 against float64 from its float32 raw score)
    theirs = {s.id: s.hypotheses[0] for s in _sentences(decoded["lenpen"]).values()}
    for sid, ours in _sentences(decoded["rerank_fairseq"]).items():
        if ours.hypotheses[0].text == theirs[sid].text:
            assert abs(ours.hypotheses[0].score - theirs[sid].score) <= float32_tolerance(3, abs(theirs[sid].score))
    # and scoring.py reads the reranked file as it reads fairseq's
    a, b = load_generation(str(decoded["rerank_fairseq"])), load_generation(str(decoded["lenpen"]))
    assert (a.ids, a.sources, a.references) == (b.ids, b.sources, b.references) and len(a.hypotheses) == 60
    assert sum(x == y for x, y in zip(a.hypotheses, b.hypotheses)) == exact


def test_gnmt_form_is_fairseqs_generator_with_gnmts_penalty(decoded):
    raw = _sentences(decoded["unnormalized"])
    gnmt_top, reranked, fairseq_top = _top1(decoded["gnmt"]), _top1(decoded["rerank_gnmt"]), _top1(decoded["lenpen"])
    assert list(reranked) == list(gnmt_top)
    for sid, text in gnmt_top.items():
        if reranked[sid] != text:
            assert {text, reranked[sid]} <= _acceptable(raw[sid], "gnmt"), sid
    assert sum(reranked[sid] == text for sid, text in gnmt_top.items()) >= 59
    # the two forms choose differently somewhere (11 of the 60 sentences measured): GNMT's divisor
    # grows more slowly with length, so where they differ GNMT picks the shorter hypothesis
    differ = [sid for sid in raw if reranked[sid] != fairseq_top[sid]
              and len(_acceptable(raw[sid], "gnmt") | _acceptable(raw[sid], "fairseq")) > 1]
    assert differ, decoded["summary_gnmt"]
    for sid in differ:
        by_text = {h.text: h for h in raw[sid].hypotheses}
        g, f = by_text[reranked[sid]], by_text[fairseq_top[sid]]
        assert _penalized(g, "gnmt") > _penalized(f, "gnmt") and _penalized(f, "fairseq") > _penalized(g, "fairseq")
        assert g.length < f.length
    assert f"fairseq's form would pick another in {len(differ)}" in decoded["summary_gnmt"]
