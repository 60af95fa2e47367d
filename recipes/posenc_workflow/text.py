#!/usr/bin/env python
"""Text steps of the WMT recipes, with sacremoses and sentencepiece instead of Moses' Perl scripts.

    # normalise punctuation, drop non-printing characters, tokenize (Moses' -a: split dashes as @-@)
    python recipes/posenc_workflow/text.py tokenize --lang en < raw.en > tok.en
    # Moses' clean-corpus-n: keep pairs of 1..250 tokens per side and a length ratio of at most 1.5
    # (--max-len none, --ratio none: any);
    # --also filters other line-aligned files the same way (e.g. the tokenized text behind a BPE'd one)
    python recipes/posenc_workflow/text.py clean --src bpe.en --tgt bpe.de --out-src train.en --out-tgt train.de
    # detokenize: undo @-@ and Moses' escaping
    python recipes/posenc_workflow/text.py detokenize --lang de < hyp.tok.de > hyp.de
    # sentencepiece instead of subword-nmt (BPE=sentencepiece in the recipes)
    python recipes/posenc_workflow/text.py spm-train --input tok.en tok.de --model-prefix spm --vocab-size 40000
    python recipes/posenc_workflow/text.py spm-encode --model spm.model < tok.en > bpe.en
"""
import argparse
import contextlib
import itertools
import logging
import os
import sys
import unicodedata
from multiprocessing import Pool
from typing import Iterator, List, Optional

logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)

_TOOLS = {}


def _tools(lang: str):
    if lang not in _TOOLS:
        from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

        # normalize-punctuation.perl only: fairseq's scripts do not run replace-unicode-punctuation.perl
        _TOOLS[lang] = (MosesPunctNormalizer(lang), MosesTokenizer(lang), MosesDetokenizer(lang))
    return _TOOLS[lang]


def remove_non_printing(line: str) -> str:
    """Moses' remove-non-printing-char.perl: every \\p{C} character (controls, format, unassigned,
    private use) becomes a space."""
    return "".join(" " if unicodedata.category(c)[0] == "C" else c for c in line)


def tokenize_line(args) -> str:
    """A training or validation line as fairseq's prepare-wmt14en2*.sh makes it: Moses'
    normalize-punctuation, remove-non-printing-char, tokenizer -a (escaping on)."""
    lang, line = args
    normalizer, tokenizer, _ = _tools(lang)
    return tokenizer.tokenize(remove_non_printing(normalizer.normalize(line)), aggressive_dash_splits=True,
                              return_str=True, escape=True)


def tokenize_test_line(args) -> str:
    """A test line as fairseq's scripts make it: ’ -> ' (their sed), then tokenizer -a only."""
    lang, line = args
    _, tokenizer, _ = _tools(lang)
    return tokenizer.tokenize(line.replace("\u2019", "'"), aggressive_dash_splits=True, return_str=True, escape=True)


def tokenize_plain_line(args) -> str:
    """A line as fairseq's prepare-iwslt14.sh makes it: Moses' tokenizer without -a and without
    punctuation normalisation (escaping on, as tokenizer.perl's default)."""
    lang, line = args
    _, tokenizer, _ = _tools(lang)
    return tokenizer.tokenize(line, aggressive_dash_splits=False, return_str=True, escape=True)


def tokenize_plain_test_line(args) -> str:
    """An IWSLT test line: ’ -> ' (prepare-iwslt14.sh's sed), then the tokenizer without -a."""
    lang, line = args
    return tokenize_plain_line((lang, line.replace("\u2019", "'")))


def detokenize_line(lang: str, line: str) -> str:
    _, _, detokenizer = _tools(lang)
    return detokenizer.detokenize(line.replace(" @-@ ", "-").replace("@-@", "-").split(), unescape=True)


def utf8_lines(stream, name: str) -> Iterator[str]:
    """The lines of a binary stream, one at a time, without their "\n". A line ends at "\n"
    only, as for every other tool of the pipeline (subword-nmt, fairseq-preprocess, wc -l):
    ``str.splitlines`` would also split at U+2028, U+0085 or \x1c, which web-crawled corpora
    contain, and misalign the two sides."""
    for number, raw in enumerate(stream, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{name} is not UTF-8 (line {number}: {e.reason} at byte {e.start})") from None
        yield line[:-1] if line.endswith("\n") else line


def stdin_lines() -> Iterator[str]:
    return utf8_lines(sys.stdin.buffer, "input")


def read_file(path: str) -> List[str]:
    if not os.path.isfile(path):
        raise ValueError(f"no such file: {path}")
    with open(path, "rb") as f:
        return list(utf8_lines(f, path))


def keep_pair(n_src: int, n_tgt: int, min_len: int, max_len: Optional[int], ratio: Optional[float]) -> bool:
    """Moses' clean-corpus-n.perl rule for one pair of token counts (None: no longest, no ratio)."""
    longest = max_len if max_len is not None else max(n_src, n_tgt)
    if not (min_len <= n_src <= longest and min_len <= n_tgt <= longest):
        return False
    return ratio is None or (n_src / n_tgt <= ratio and n_tgt / n_src <= ratio)


def cmd_tokenize(args):
    # streamed: a training corpus (giga-fren's 22M lines) is never held in memory
    jobs = ((args.lang, line) for line in stdin_lines())
    if args.plain:
        fn = tokenize_plain_test_line if args.test_set else tokenize_plain_line
    else:
        fn = tokenize_test_line if args.test_set else tokenize_line
    with Pool(args.workers) if args.workers > 1 else _Serial() as pool:
        for line in pool.imap(fn, jobs, chunksize=1000):
            sys.stdout.write(line + "\n")


def cmd_lowercase(args):
    # Moses' lowercase.perl is Perl's lc on UTF-8 text: Python's str.lower() agrees on the
    # letters of German and English text
    for line in stdin_lines():
        sys.stdout.write(line.lower() + "\n")


def cmd_detokenize(args):
    for line in stdin_lines():
        sys.stdout.write(detokenize_line(args.lang, line) + "\n")


def cmd_clean(args):
    """Streamed, as Moses' clean-corpus-n.perl: one line of each file at a time (En-Fr's 36M
    pairs in four files would be tens of GB as Python lists); the outputs appear only whole."""
    inputs = [args.src, args.tgt] + list(args.also)
    outputs = [args.out_src, args.out_tgt] + list(args.also_out)
    for path in inputs:
        if not os.path.isfile(path):
            raise ValueError(f"no such file: {path}")
    tmps = [f"{path}.tmp.{os.getpid()}" for path in outputs]
    kept = total = 0
    with contextlib.ExitStack() as stack:
        ins = [utf8_lines(stack.enter_context(open(p, "rb")), p) for p in inputs]
        outs = [stack.enter_context(open(t, "w", encoding="utf-8")) for t in tmps]
        try:
            for lines in itertools.zip_longest(*ins):
                if None in lines:
                    counts = [_count_lines(p) for p in inputs]
                    short = next(i for i, line in enumerate(lines) if line is None)
                    raise ValueError(f"{args.src} has {counts[0]} lines but {inputs[short]} has {counts[short]}")
                total += 1
                if keep_pair(len(lines[0].split()), len(lines[1].split()), args.min_len, args.max_len, args.ratio):
                    kept += 1
                    for out, line in zip(outs, lines):
                        out.write(line + "\n")
            if total == 0:
                raise ValueError(f"{args.src} is empty")
        except BaseException:
            stack.close()
            for t in tmps:
                os.remove(t)
            raise
    for tmp, path in zip(tmps, outputs):
        os.replace(tmp, path)
    lengths = f"{args.min_len}-{args.max_len}" if args.max_len is not None else f"{args.min_len} or more"
    ratio = f"ratio <= {args.ratio}" if args.ratio is not None else "any ratio"
    print(f"| clean: kept {kept} of {total} pairs ({lengths} tokens, {ratio})", file=sys.stderr)


def _count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def cmd_spm_train(args):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(input=",".join(args.input), model_prefix=args.model_prefix,
                                   vocab_size=args.vocab_size, character_coverage=1.0, model_type="bpe",
                                   input_sentence_size=args.input_sentence_size, shuffle_input_sentence=True,
                                   minloglevel=2)


def cmd_spm_encode(args):
    import sentencepiece as spm

    model = spm.SentencePieceProcessor(model_file=args.model)
    for line in stdin_lines():
        sys.stdout.write(" ".join(model.encode(line, out_type=str)) + "\n")


def _or_none(kind):
    def parse(text: str):
        return None if text == "none" else kind(text)

    parse.__name__ = kind.__name__  # argparse's "invalid int value"
    return parse


class _Serial:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def imap(self, fn, items, chunksize=None):
        return map(fn, items)


def main(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("tokenize", help="stdin -> stdout")
    p.add_argument("--lang", required=True)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--test-set", action="store_true",
                   help="as fairseq's scripts treat the test set: straighten ’ and tokenize, nothing else")
    p.add_argument("--plain", action="store_true",
                   help="as fairseq's prepare-iwslt14.sh: no punctuation normalisation, dashes not split (no -a)")
    p.set_defaults(fn=cmd_tokenize)
    p = sub.add_parser("lowercase", help="stdin -> stdout, as Moses' lowercase.perl")
    p.set_defaults(fn=cmd_lowercase)
    p = sub.add_parser("detokenize", help="stdin -> stdout")
    p.add_argument("--lang", required=True)
    p.set_defaults(fn=cmd_detokenize)
    p = sub.add_parser("clean")
    for name in ("--src", "--tgt", "--out-src", "--out-tgt"):
        p.add_argument(name, required=True)
    p.add_argument("--also", nargs="*", default=[], help="more files to filter with the same pairs")
    p.add_argument("--also-out", nargs="*", default=[], help="where the filtered --also files go")
    p.add_argument("--min-len", type=int, default=1)
    p.add_argument("--max-len", type=_or_none(int), default=250, help="longest side kept (none: any)")
    p.add_argument("--ratio", type=_or_none(float), default=1.5, help="largest ratio of the sides' lengths (none: any)")
    p.set_defaults(fn=cmd_clean)
    p = sub.add_parser("spm-train")
    p.add_argument("--input", nargs="+", required=True)
    p.add_argument("--model-prefix", required=True)
    p.add_argument("--vocab-size", type=int, default=40000)
    p.add_argument("--input-sentence-size", type=int, default=10_000_000)
    p.set_defaults(fn=cmd_spm_train)
    p = sub.add_parser("spm-encode", help="stdin -> stdout")
    p.add_argument("--model", required=True)
    p.set_defaults(fn=cmd_spm_encode)
    args = parser.parse_args(argv)
    if args.command == "clean" and len(args.also) != len(args.also_out):
        parser.error("--also and --also-out take the same number of files")
    try:
        args.fn(args)
    except (ValueError, OSError) as e:
        parser.exit(2, f"text.py {args.command}: error: {e}\n")


if __name__ == "__main__":
    main()
