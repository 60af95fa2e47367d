"""Seeded toy language pairs in which word order matters.

``reverse``: every source word maps to its own target word and the order is reversed, so a target
word's source sits at the mirrored position: the model must know where each word is, counted
from both ends of the sentence.

``reorder``: sentences are sequences of nouns (``n<i>``), some preceded by an adjective
(``a<i>``); the target maps each word to its own word and puts the adjective after its noun, as
English to French does. The reordering is local, so a model that knows which words are
neighbours can translate a sentence of any length.
"""
import os
import random
from typing import Callable, Dict, Iterable, List, Tuple


def reverse(words: Iterable[str]) -> List[str]:
    """The reference translation of the reversal pair: s<i> -> t<i>, in reverse order."""
    return ["t" + w[1:] for w in reversed(list(words))]


def reorder(words: Iterable[str]) -> List[str]:
    """The reference translation of the reordering pair: a<i> n<j> -> N<j> A<i>, n<j> -> N<j>."""
    out: List[str] = []
    pending = None
    for word in words:
        if word.startswith("a"):
            pending = word.upper()
        else:
            out.append(word.upper())
            if pending:
                out.append(pending)
                pending = None
    assert pending is None, "a reordering-pair sentence ends with a noun"
    return out


def sample_reverse(rng: random.Random, vocab_size: int, length: int) -> List[str]:
    return [f"s{rng.randrange(vocab_size)}" for _ in range(length)]


def sample_reorder(rng: random.Random, vocab_size: int, length: int) -> List[str]:
    """Nouns and adjectives each from half the vocabulary; an adjective never ends the sentence."""
    words: List[str] = []
    while len(words) < length:
        if len(words) < length - 1 and rng.random() < 0.5:
            words.append(f"a{rng.randrange(vocab_size // 2)}")
        words.append(f"n{rng.randrange(vocab_size - vocab_size // 2)}")
    return words


PAIRS: Dict[str, Tuple[Callable, Callable]] = {
    "reverse": (sample_reverse, reverse),
    "reorder": (sample_reorder, reorder),
}
translate = reverse  # the pair the tests train on


def write_toy_corpus(
    out_dir: str,
    splits: Dict[str, Tuple[int, int, int]],
    vocab_size: int = 24,
    seed: int = 1,
    src: str = "src",
    tgt: str = "tgt",
    pair: str = "reverse",
) -> Dict[str, str]:
    """Write ``{split}.{src}`` / ``{split}.{tgt}`` for ``splits[split] = (sentences, min_len,
    max_len)``; returns the file prefix of each split."""
    if pair not in PAIRS:
        raise ValueError(f"unknown toy pair {pair!r}; choose from {', '.join(PAIRS)}")
    sample, translation = PAIRS[pair]
    rng = random.Random(seed)
    os.makedirs(out_dir, exist_ok=True)
    prefixes = {}
    for split, (count, min_len, max_len) in splits.items():
        prefix = os.path.join(out_dir, split)
        with open(f"{prefix}.{src}", "w") as fs, open(f"{prefix}.{tgt}", "w") as ft:
            for _ in range(count):
                words = sample(rng, vocab_size, rng.randint(min_len, max_len))
                fs.write(" ".join(words) + "\n")
                ft.write(" ".join(translation(words)) + "\n")
        prefixes[split] = prefix
    return prefixes
