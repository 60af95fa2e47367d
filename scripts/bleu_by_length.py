#!/usr/bin/env python
"""SacreBLEU per source-length bin for one or more models, as a table (Markdown, JSON) and a plot.

    python scripts/bleu_by_length.py --generation sinusoidal=gen.sin.txt floater=gen.floater.txt \\
        --out results/length [--bins 80 100 120 140] [--unit subwords]

Each generation file is the output of ``fairseq-generate`` (its S-, T- and H- lines); the bins are
over the source as it prints it (pass --remove-bpe to fairseq-generate to count words).
"""
import argparse
import logging
import os
import sys

# before fairseq's import configures the root logger at INFO (fairseq/tasks/text_to_speech.py)
logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fairseq_posenc.length_bins import DEFAULT_EDGES, bleu_by_bin, read_lines, write_report  # noqa: E402
from fairseq_posenc.pipeline import parse_generate_output  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--generation", nargs="+", required=True, metavar="MODEL=FILE",
                        help="fairseq-generate output of each model, named")
    parser.add_argument("--out", required=True, help="output prefix: writes PREFIX.md, PREFIX.json, PREFIX.png")
    parser.add_argument("--bins", type=int, nargs="+", default=list(DEFAULT_EDGES),
                        help="left edges of the bins; the last is open-ended")
    parser.add_argument("--unit", default="words", help="what the source's space-separated tokens are")
    parser.add_argument("--title", default="", help="plot title")
    args = parser.parse_args(argv)
    results = {}
    for item in args.generation:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            parser.error(f"--generation takes MODEL=FILE, got {item!r}")
        try:
            generation = parse_generate_output("\n".join(read_lines(path)))
        except (OSError, ValueError) as e:
            parser.exit(2, f"bleu_by_length.py: error: {e}\n")
        if not generation.hypotheses:
            parser.exit(2, f"bleu_by_length.py: error: {path} has no H- lines: is it fairseq-generate output?\n")
        results[name] = bleu_by_bin(generation.sources, generation.hypotheses, generation.references, args.bins)
    paths = write_report(results, args.out, args.unit, args.title)
    print(open(paths["markdown"]).read())
    print("| wrote " + ", ".join(paths.values()))


if __name__ == "__main__":
    main()
