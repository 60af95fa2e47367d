#!/usr/bin/env python
"""Split a parallel corpus by source length for the short-to-long extrapolation study.

    python scripts/length_split.py --src corpus.en --tgt corpus.de --src-lang en --tgt-lang de \\
        --out-dir split/ [--train-below 80] [--bins 80 100 120 140] [--unit subwords]

Writes split/train.{en,de} (source shorter than --train-below tokens), one pair of files per
bin of longer sources (split/long.80-100.{en,de}, ..., the last bin open-ended) and
split/split.json. A token is whatever stands between spaces in the files: name it with --unit.
With --valid-src/--valid-tgt it also writes split/valid.{en,de}: the validation pairs whose source
is shorter than --train-below, counted in the same unit (--valid-segmentation undoes the subword
segmentation of an already segmented validation set), so that neither training nor checkpoint
selection sees a test length.

    python scripts/length_split.py --src corpus.en --lengths-only [--train-below 80] [--bins 80 100 120 140]

prints the length distribution of --src and how many pairs the split would train on and test,
and writes nothing: pick --train-below and --bins from it first.
"""
import argparse
import logging
import os

# before fairseq's import configures the root logger at INFO (fairseq/tasks/text_to_speech.py)
logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
from posenc_workflow.length_bins import DEFAULT_EDGES, DEFAULT_TRAIN_BELOW, keep_short, split_by_length  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", required=True, help="source side, one sentence per line, tokens separated by spaces")
    parser.add_argument("--tgt", help="target side, line-aligned with --src")
    parser.add_argument("--src-lang")
    parser.add_argument("--tgt-lang")
    parser.add_argument("--out-dir")
    parser.add_argument("--lengths-only", action="store_true",
                        help="print the length distribution of --src and what the split would keep; write nothing")
    parser.add_argument("--train-below", type=int, default=DEFAULT_TRAIN_BELOW,
                        help="training part: sources shorter than this (default: FLOATER's 80)")
    parser.add_argument("--bins", type=int, nargs="+", default=list(DEFAULT_EDGES),
                        help="left edges of the test bins; the last bin is open-ended")
    parser.add_argument("--unit", default="words", help="what the space-separated tokens are (words, subwords)")
    parser.add_argument("--valid-src", help="validation source to keep short pairs of (the same unit, or segmented)")
    parser.add_argument("--valid-tgt", help="validation target, line-aligned with --valid-src")
    parser.add_argument("--valid-segmentation", choices=["none", "subword_nmt", "sentencepiece"], default="none",
                        help="the validation files' subword segmentation, undone to count --unit tokens")
    args = parser.parse_args(argv)
    if args.lengths_only:
        from posenc_workflow.length_bins import length_distribution

        try:
            for line in length_distribution(args.src, args.train_below, args.bins):
                print("| " + line)
        except (OSError, ValueError) as e:
            parser.exit(2, f"length_split.py: error: {e}\n")
        return
    missing = [f"--{name.replace('_', '-')}" for name in ("tgt", "src_lang", "tgt_lang", "out_dir")
               if not getattr(args, name)]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    if bool(args.valid_src) != bool(args.valid_tgt):
        parser.error("--valid-src and --valid-tgt go together")
    try:
        manifest = split_by_length(args.src, args.tgt, args.out_dir, args.src_lang, args.tgt_lang,
                                   args.train_below, args.bins, args.unit)
        if args.valid_src:
            kept, read = keep_short(args.valid_src, args.valid_tgt, os.path.join(args.out_dir, "valid"),
                                    args.src_lang, args.tgt_lang, args.train_below, args.valid_segmentation)
            if not kept:
                raise ValueError(f"no validation pair of {args.valid_src} is shorter than {args.train_below} {args.unit}")
    except (OSError, ValueError) as e:
        parser.exit(2, f"length_split.py: error: {e}\n")
    for part in manifest["parts"]:
        print(f"| {part['name']:>12s}: {part['sentences']:7d} sentence pairs -> {part['prefix']}.*")
    if args.valid_src:
        print(f"| {'valid':>12s}: {kept:7d} of {read} validation pairs (sources < {args.train_below}) -> "
              f"{os.path.join(args.out_dir, 'valid')}.*")
    print(f"| source lengths counted in {args.unit}")


if __name__ == "__main__":
    main()
