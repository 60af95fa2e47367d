"""A seeded toy language pair in which word order matters.

The "translation" of a sentence maps every source word to its own target word and reverses the
order, so a model cannot get a word right without knowing where it is: position encodings are
what the task is about, and a model that learned it scores near 100 BLEU.
"""
import os
import random
from typing import Dict, Iterable, List, Tuple


def translate(words: Iterable[str]) -> List[str]:
    """The reference translation: s<i> -> t<i>, in reverse order."""
    return ["t" + w[1:] for w in reversed(list(words))]


def sample_sentence(rng: random.Random, vocab_size: int, min_len: int, max_len: int) -> List[str]:
    return [f"s{rng.randrange(vocab_size)}" for _ in range(rng.randint(min_len, max_len))]


def write_toy_corpus(
    out_dir: str,
    splits: Dict[str, Tuple[int, int, int]],
    vocab_size: int = 24,
    seed: int = 1,
    src: str = "src",
    tgt: str = "tgt",
) -> Dict[str, str]:
    """Write ``{split}.{src}`` / ``{split}.{tgt}`` for ``splits[split] = (sentences, min_len,
    max_len)``; returns the file prefix of each split."""
    rng = random.Random(seed)
    os.makedirs(out_dir, exist_ok=True)
    prefixes = {}
    for split, (count, min_len, max_len) in splits.items():
        prefix = os.path.join(out_dir, split)
        with open(f"{prefix}.{src}", "w") as fs, open(f"{prefix}.{tgt}", "w") as ft:
            for _ in range(count):
                words = sample_sentence(rng, vocab_size, min_len, max_len)
                fs.write(" ".join(words) + "\n")
                ft.write(" ".join(translate(words)) + "\n")
        prefixes[split] = prefix
    return prefixes
