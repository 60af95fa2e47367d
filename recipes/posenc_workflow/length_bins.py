"""Length generalisation: split a corpus by source length into a training part and test bins
(the report that scores translations per bin is length_report.py).

FLOATER's protocol (Liu et al., 2020, Sec. 4.3) is the default: train on pairs whose source is
shorter than 80 tokens, test on the rest binned as [80,100), [100,120), [120,140), [140,inf).
A "token" is whatever the files hold between spaces (words, or subwords after BPE): the caller
names it, and every output says which.
"""
import json
import math
import os
from dataclasses import dataclass
from typing import Dict, Iterator, List, Sequence, Tuple

DEFAULT_TRAIN_BELOW = 80
DEFAULT_EDGES = (80, 100, 120, 140)


@dataclass(frozen=True)
class Bin:
    low: int
    high: float  # math.inf for the last, open bin

    @property
    def name(self) -> str:
        return f"[{self.low},{'inf' if math.isinf(self.high) else int(self.high)})"

    @property
    def file_tag(self) -> str:
        return f"{self.low}-{'inf' if math.isinf(self.high) else int(self.high)}"

    def __contains__(self, length: int) -> bool:
        return self.low <= length < self.high


def make_bins(edges: Sequence[int]) -> List[Bin]:
    """Consecutive bins from increasing ``edges``; the last one is open-ended."""
    edges = list(edges)
    if not edges or any(b <= a for a, b in zip(edges, edges[1:])) or edges[0] < 0:
        raise ValueError(f"bin edges must be increasing non-negative integers, got {edges}")
    return [Bin(lo, hi) for lo, hi in zip(edges, edges[1:] + [math.inf])]


def bin_of(length: int, bins: Sequence[Bin]):
    return next((b for b in bins if length in b), None)


def read_lines(path: str) -> List[str]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such file: {path}")
    try:
        # lines end at "\n" only, as for fairseq-preprocess: str.splitlines would also split at
        # U+2028 or U+0085, which web-crawled corpora contain, and misalign source and target
        with open(path, encoding="utf-8", errors="strict", newline="\n") as f:
            return [line[:-1] if line.endswith("\n") else line for line in f]
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 ({e.reason} at byte {e.start})") from None


def read_parallel(src_path: str, tgt_path: str) -> Iterator[Tuple[str, str]]:
    """Line pairs of two files, with clear errors for what a corpus must not be."""
    src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise ValueError(f"{src_path} has {len(src_lines)} lines but {tgt_path} has {len(tgt_lines)}")
    if not src_lines:
        raise ValueError(f"{src_path} is empty")
    return zip(src_lines, tgt_lines)


def split_by_length(src_path: str, tgt_path: str, out_dir: str, src_lang: str, tgt_lang: str,
                    train_below: int = DEFAULT_TRAIN_BELOW, edges: Sequence[int] = DEFAULT_EDGES,
                    unit: str = "words") -> Dict:
    """Write ``train.{src,tgt}`` (source shorter than ``train_below``) and one test pair of files
    per bin (``long.LOW-HIGH.{src,tgt}``), and ``split.json`` describing them."""
    bins = make_bins(edges)
    if train_below > bins[0].low:
        raise ValueError(f"the training part (< {train_below}) overlaps the first bin {bins[0].name}")
    os.makedirs(out_dir, exist_ok=True)
    outputs = {"train": [], **{b.file_tag: [] for b in bins}}
    for src, tgt in read_parallel(src_path, tgt_path):
        length = len(src.split())
        if length < train_below:
            outputs["train"].append((src, tgt))
        else:
            b = bin_of(length, bins)
            if b is not None:
                outputs[b.file_tag].append((src, tgt))
    manifest = {"unit": unit, "train_below": train_below, "source": src_path, "parts": []}
    for tag, pairs in outputs.items():
        prefix = os.path.join(out_dir, "train" if tag == "train" else f"long.{tag}")
        for lang, column in ((src_lang, 0), (tgt_lang, 1)):
            _write_lines(f"{prefix}.{lang}", [p[column] for p in pairs])
        manifest["parts"].append({"name": "train" if tag == "train" else next(b.name for b in bins if b.file_tag == tag),
                                  "prefix": prefix, "sentences": len(pairs)})
    write_text_atomically(os.path.join(out_dir, "split.json"), json.dumps(manifest, indent=2) + "\n")
    return manifest


def words_in(line: str, segmentation: str) -> int:
    """Tokens of a line before its subword segmentation: subword-nmt marks a piece continued by the
    next with a trailing ``@@``, sentencepiece a piece that starts a token with ``\u2581``."""
    pieces = line.split()
    if segmentation == "subword_nmt":
        return sum(not p.endswith("@@") for p in pieces)
    if segmentation == "sentencepiece":
        return sum(p.startswith("\u2581") for p in pieces)
    if segmentation == "none":
        return len(pieces)
    raise ValueError(f"segmentation must be none, subword_nmt or sentencepiece, got {segmentation!r}")


def keep_short(src_path: str, tgt_path: str, out_prefix: str, src_lang: str, tgt_lang: str, train_below: int,
               segmentation: str = "none") -> Tuple[int, int]:
    """Write the pairs whose source is shorter than ``train_below`` (counted before
    ``segmentation``) to ``out_prefix.{src,tgt}``: a validation set that, like the training part,
    holds no test length. Returns (kept, read)."""
    pairs = list(read_parallel(src_path, tgt_path))
    kept = [p for p in pairs if words_in(p[0], segmentation) < train_below]
    for lang, column in ((src_lang, 0), (tgt_lang, 1)):
        _write_lines(f"{out_prefix}.{lang}", [p[column] for p in kept])
    return len(kept), len(pairs)


def _write_lines(path: str, lines: Sequence[str]):
    write_text_atomically(path, "".join(line + "\n" for line in lines))


def write_text_atomically(path: str, text: str):
    """Write atomically: a crash never leaves a truncated file where a good one was."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def length_distribution(path: str, train_below: int, bins: List[int]) -> List[str]:
    """Lines on the token counts of ``path`` (one sentence a line, tokens separated by spaces):
    percentiles, and how many pairs a short-to-long split at ``train_below`` with these ``bins``
    (the extrapolation recipe's TRAIN_BELOW and BINS, the last bin open) trains on and tests."""
    import numpy as np

    with open(path, encoding="utf-8") as f:
        lengths = np.array([len(line.split()) for line in f], dtype=np.int64)
    if not len(lengths):
        raise ValueError(f"{path} is empty")
    qs = (50, 90, 95, 99, 99.9)
    out = [f"{path}: {len(lengths)} sentences, mean {lengths.mean():.1f} tokens, longest {lengths.max()}; "
           + ", ".join(f"{q:g}th percentile {int(np.percentile(lengths, q, method='lower'))}" for q in qs)]
    short = int((lengths < train_below).sum())
    out.append(f"shorter than {train_below} (trained on): {short} ({short / len(lengths):.2%})")
    edges = list(bins) + [None]
    for lo, hi in zip(edges, edges[1:]):
        n = int(((lengths >= lo) & ((lengths < hi) if hi else True)).sum())
        out.append(f"[{lo},{hi if hi else 'inf'}): {n} sentences (tested)")
    if bins and bins[0] != train_below:
        out.append(f"note: the first bin starts at {bins[0]}, not at {train_below}: the pairs between are in neither")
    return out
