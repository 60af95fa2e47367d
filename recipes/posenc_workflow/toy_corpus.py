#!/usr/bin/env python
"""The demo's generated language pair (corpus.name toy, recipes/rules/prepare.smk's toy_corpus rule):
training, validation and test text (recipes/posenc_workflow/toy_data.py) binarized by fairseq-preprocess.

    python recipes/posenc_workflow/toy_corpus.py --settings JSON --out DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys


def toy(out: str, s: dict):
    from posenc_workflow import toy_data

    top = max(s["long_max_len"], s["train_max_len"] + 1)
    splits = {"train": (s["train_size"], 3, s["train_max_len"]), "valid": (200, 3, s["train_max_len"]),
              "test": (s["test_size"], 3, top)}
    print(f"| writing the {s['pair']} toy corpus to {out}/raw: train {s['train_size']} pairs of 3-{s['train_max_len']} "
          f"words, test {s['test_size']} pairs of 3-{top} words", flush=True)
    prefixes = toy_data.write_toy_corpus(os.path.join(out, "raw"), splits, seed=s["seed"], pair=s["pair"])
    tmp = os.path.join(out, "data-bin.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    preprocess = os.path.join(os.path.dirname(sys.executable), "fairseq-preprocess")
    with open(os.path.join(out, "preprocess.log"), "w") as log:
        code = subprocess.call([preprocess if os.path.exists(preprocess) else "fairseq-preprocess", "--source-lang",
                                "src", "--target-lang", "tgt", *[f"--{k}pref={prefixes[k]}" for k in splits],
                                "--destdir", tmp, "--joined-dictionary", "--workers", "1"], stdout=log, stderr=log)
    if code:
        sys.exit(f"toy_corpus.py: fairseq-preprocess failed (exit {code}): {out}/preprocess.log")
    shutil.rmtree(os.path.join(out, "data-bin"), ignore_errors=True)
    os.replace(tmp, os.path.join(out, "data-bin"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the corpus's directory (DIR/raw, DIR/data-bin)")
    parser.add_argument("--settings", required=True, help="corpus.toy (JSON)")
    args = parser.parse_args(argv)
    toy(args.out, json.loads(args.settings))


if __name__ == "__main__":
    main()
