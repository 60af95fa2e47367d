"""recipes/posenc_workflow/scoring.py score: tokenized BLEU splits compounds for German targets only
(the En-De convention), and the results line says which was done."""
import json
import os

import pytest
from sacrebleu.metrics import BLEU

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from posenc_workflow import scoring as score_translation  # noqa: E402

# one Moses-tokenized (aggressive: "@-@") pair with two compounds, one of them half wrong
HYP = "le chat @-@ noir de la grande @-@ maison voit un arbre vert ."
REF = "le chat @-@ noir de la petite @-@ maison voit un arbre vert ."
# the same, split by hand as fairseq's compound_split_bleu.sh does (s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g)
HYP_SPLIT = "le chat @ ##AT##-##AT## @ noir de la grande @ ##AT##-##AT## @ maison voit un arbre vert ."
REF_SPLIT = "le chat @ ##AT##-##AT## @ noir de la petite @ ##AT##-##AT## @ maison voit un arbre vert ."


def _generation(path):
    path.write_text(f"S-0\tsource words .\nT-0\t{REF}\nH-0\t-1.25\t{HYP}\nD-0\t-1.25\t{HYP}\nP-0\t-0.5000 -0.7500\n",
                    encoding="utf-8")
    return str(path)


def _score(tmp_path, lang):
    gen = _generation(tmp_path / f"gen.{lang}.txt")
    results, scores = tmp_path / "results.txt", tmp_path / f"bleu.{lang}.json"
    score_translation.main(["score", "--generation", gen, "--lang", lang, "--label", f"toy {lang}",
                            "--results", str(results), "--json", str(scores)])
    tokenized = [line for line in results.read_text().splitlines() if f"| toy {lang} |" in line][1]
    return tokenized, json.loads(scores.read_text())


def test_compound_split_is_fairseqs_regex():
    assert score_translation.compound_split(HYP) == HYP_SPLIT
    assert score_translation.compound_split("ein well-known Haus") == "ein well ##AT##-##AT## known Haus"


@pytest.mark.parametrize("lang, split", [("de", True), ("fr", False), ("en", False), ("cs", False), ("DE", True)])
def test_target_language_decides(lang, split):
    # WMT18: en-de is split; de-en (target en), en-cs and cs-en are not
    assert score_translation.splits_compounds(lang) is split


def test_french_target_gets_plain_tokenized_bleu(tmp_path):
    line, scores = _score(tmp_path, "fr")
    plain = BLEU(tokenize="none").corpus_score([HYP], [[REF]]).score
    split = BLEU(tokenize="none").corpus_score([HYP_SPLIT], [[REF_SPLIT]]).score
    assert f"{plain:.2f}" != f"{split:.2f}"  # the pair tells the two apart
    assert f"| tokenized BLEU {plain:.2f} (no compound split, tokenize none) | " in line, line
    assert scores["tokenized_bleu"] == round(plain, 2) and scores["compound_split"] is False


def test_german_target_gets_compound_split_bleu(tmp_path):
    line, scores = _score(tmp_path, "de")
    split = BLEU(tokenize="none").corpus_score([HYP_SPLIT], [[REF_SPLIT]]).score
    assert f"| tokenized BLEU {split:.2f} (compound split, tokenize none) | " in line, line
    assert scores["tokenized_bleu"] == round(split, 2) and scores["compound_split"] is True


def test_without_references_the_t_lines_score_with_their_subwords_removed(tmp_path):
    """The short-to-long split decodes training pairs in subwords: no raw reference, no
    --remove-bpe. --bpe removes the segmentation from H- and T- lines, the T- lines are the
    references, and both BLEUs are the ones of the words."""
    gen = tmp_path / "gen.txt"
    gen.write_text("S-0\tthe gre@@ en house\nT-0\tdas gr@@ üne haus sieht den alten baum .\n"
                   "H-0\t-1.0\tdas gr@@ üne haus sieht den neuen baum .\n", encoding="utf-8")
    results, scores = tmp_path / "results.txt", tmp_path / "bleu.json"
    score_translation.main(["score", "--generation", str(gen), "--lang", "de", "--bpe", "subword_nmt",
                            "--label", "split", "--results", str(results), "--json", str(scores)])
    hyp, ref = "das grüne haus sieht den neuen baum .", "das grüne haus sieht den alten baum ."
    got = json.loads(scores.read_text())
    assert got["sacrebleu"] == round(BLEU().corpus_score([hyp], [[ref]]).score, 2) == 59.46
    assert got["tokenized_bleu"] == round(BLEU(tokenize="none").corpus_score([hyp], [[ref]]).score, 2)
