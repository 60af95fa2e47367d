#!/usr/bin/env python
"""The short-to-long split of a prepared corpus (FLOATER Sec. 4.3), the length_split rule of
recipes/rules/prepare.smk: its own file, so that an edit of scripts/length_split.py (what it runs)
redoes the split and what follows it, not the corpus's preparation (recipes/posenc_workflow/sources.py).

    python recipes/posenc_workflow/short_to_long.py --data DATA --out DIR --settings JSON --corpus JSON
"""
import argparse
import glob
import json
import os
import shutil
import sys
from typing import Dict

from posenc_workflow.prepare import ROOT, PrepareError, _apply, _bin, _run


def length_split(data: str, out: str, s: Dict, c: Dict, workers: int):
    """The extrapolation study's split (FLOATER Sec. 4.3): train and validate on the pairs whose
    source is shorter than train_below (counted in subwords, or in words before BPE), test on the
    longer ones, binarized with the corpus's own dictionaries."""
    src, tgt = c["src"], c["tgt"]
    subwords = s["unit"] == "subwords"
    counted = os.path.join(data, "train" if subwords else "train.tok")
    split = os.path.join(out, "text")
    shutil.rmtree(split, ignore_errors=True)  # no bin file of earlier bins may stay behind
    seg = "none" if subwords else ("sentencepiece" if c["bpe"] == "sentencepiece" else "subword_nmt")
    _run([sys.executable, os.path.join(ROOT, "scripts", "length_split.py"), "--src", f"{counted}.{src}",
          "--tgt", f"{counted}.{tgt}", "--src-lang", src, "--tgt-lang", tgt, "--out-dir", split,
          "--train-below", str(s["train_below"]), "--bins", *map(str, s["bins"]), "--unit", s["unit"],
          "--valid-src", os.path.join(data, f"valid.{src}"), "--valid-tgt", os.path.join(data, f"valid.{tgt}"),
          "--valid-segmentation", seg])
    for lang in (src, tgt):  # one test set of every long pair (the report bins by length)
        with open(os.path.join(split, f"long.{lang}"), "wb") as f:
            for part in sorted(glob.glob(os.path.join(split, f"long.*.{lang}"))):
                with open(part, "rb") as g:
                    shutil.copyfileobj(g, f)
    segmented = split
    if not subwords:
        segmented = os.path.join(split, "bpe")
        os.makedirs(segmented, exist_ok=True)
        for part in ("train", "long"):
            for lang in (src, tgt):
                _apply(data, c, os.path.join(split, f"{part}.{lang}"), os.path.join(segmented, f"{part}.{lang}"))
    if not os.path.getsize(os.path.join(segmented, f"long.{src}")):
        raise PrepareError(f"no training pair of {data} has a source of {s['train_below']} {s['unit']} or more")
    dicts = [os.path.join(data, "data-bin", f"dict.{lang}.txt") for lang in (src, tgt)]
    same = open(dicts[0], "rb").read() == open(dicts[1], "rb").read()
    flags = ["--srcdict", dicts[0], "--joined-dictionary"] if same else ["--srcdict", dicts[0], "--tgtdict", dicts[1]]
    dest = os.path.join(out, "data-bin")
    shutil.rmtree(dest, ignore_errors=True)
    _run([_bin("fairseq-preprocess"), "--source-lang", src, "--target-lang", tgt, "--trainpref",
          os.path.join(segmented, "train"), "--validpref", os.path.join(split, "valid"), "--testpref",
          os.path.join(segmented, "long"), "--destdir", dest + ".tmp", *flags, "--workers", str(workers)],
         log=os.path.join(out, "preprocess.log"))
    os.replace(dest + ".tmp", dest)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="the prepared corpus's directory")
    parser.add_argument("--out", required=True, help="where the split goes")
    parser.add_argument("--settings", required=True, help="the split's settings (JSON: train_below, bins, unit)")
    parser.add_argument("--corpus", required=True, help="the corpus's settings (JSON)")
    parser.add_argument("--workers", type=int, default=1, help="fairseq-preprocess's workers")
    args = parser.parse_args(argv)
    try:
        length_split(args.data, args.out, json.loads(args.settings), json.loads(args.corpus), args.workers)
    except (PrepareError, OSError, ValueError) as e:
        parser.exit(2, f"short_to_long.py: error: {e}\n")


if __name__ == "__main__":
    main()
