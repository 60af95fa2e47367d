"""The generated toy language pairs: translations checked against hand-written ones."""
import random

import pytest

from posenc_workflow import toy_data


def test_reorder_moves_each_adjective_after_its_noun():
    assert toy_data.reorder("a1 n4 n1".split()) == "N4 A1 N1".split()
    assert toy_data.reorder("n2 a0 n3 a5 n5".split()) == "N2 N3 A0 N5 A5".split()
    assert toy_data.reorder("n7".split()) == ["N7"]


def test_reverse_maps_words_and_reverses():
    assert toy_data.reverse("s1 s4 s2".split()) == "t2 t4 t1".split()


def test_reorder_sentences_have_the_asked_length_and_end_with_a_noun():
    rng = random.Random(0)
    for length in range(1, 31):
        words = toy_data.sample_reorder(rng, 24, length)
        assert len(words) == length and words[-1].startswith("n")
        assert all(not (a.startswith("a") and b.startswith("a")) for a, b in zip(words, words[1:]))
        assert {int(w[1:]) for w in words} <= set(range(12))
        assert len(toy_data.reorder(words)) == length


def test_write_toy_corpus_reorder(tmp_path):
    prefixes = toy_data.write_toy_corpus(str(tmp_path), {"train": (50, 3, 12), "test": (20, 13, 30)}, pair="reorder")
    for split, (count, low, high) in {"train": (50, 3, 12), "test": (20, 13, 30)}.items():
        src = open(prefixes[split] + ".src").read().splitlines()
        tgt = open(prefixes[split] + ".tgt").read().splitlines()
        assert len(src) == len(tgt) == count
        for s, t in zip(src, tgt):
            assert low <= len(s.split()) <= high
            assert t.split() == toy_data.reorder(s.split())


def test_unknown_pair_is_named(tmp_path):
    with pytest.raises(ValueError, match="unknown toy pair 'swap'; choose from reverse, reorder"):
        toy_data.write_toy_corpus(str(tmp_path), {"train": (5, 3, 4)}, pair="swap")
