#!/usr/bin/env python
"""The main job: train small models on a generated toy language pair through fairseq's CLI and
report BLEU on sentences as long as the training ones and on longer ones.

    make demo                                   # defaults below
    python scripts/demo.py --encodings sinusoidal learned --max-update 500 --out demo_output
"""
import argparse
import logging
import json
import os
import shutil
import sys
import time

# before fairseq's import configures the root logger at INFO (fairseq/tasks/text_to_speech.py)
logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fairseq_posenc import pipeline, toy_data  # noqa: E402
from fairseq_posenc.positions import POSITION_ENCODINGS  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="demo_output", help="working and output directory")
    parser.add_argument("--encodings", nargs="+", default=["sinusoidal"], choices=list(POSITION_ENCODINGS),
                        help="position encodings to train and compare")
    parser.add_argument("--max-update", type=int, default=300, help="training updates per model")
    parser.add_argument("--train-size", type=int, default=4000, help="training sentence pairs")
    parser.add_argument("--train-max-len", type=int, default=12, help="longest training source, in words")
    parser.add_argument("--long-max-len", type=int, default=20, help="longest source of the long test set")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    out = os.path.abspath(args.out)
    for stale in ("bin", "checkpoints"):  # a re-run starts over rather than resuming old runs
        shutil.rmtree(os.path.join(out, stale), ignore_errors=True)
    splits = {
        "train": (args.train_size, 3, args.train_max_len),
        "valid": (200, 3, args.train_max_len),
        "test": (200, 3, args.train_max_len),
        "test1": (200, args.train_max_len + 1, args.long_max_len),
    }
    print(f"| writing the toy corpus to {out}/raw (source lengths in words)", flush=True)
    prefixes = toy_data.write_toy_corpus(os.path.join(out, "raw"), splits, seed=args.seed)
    data_bin = pipeline.preprocess(prefixes, os.path.join(out, "bin"))

    results = []
    for encoding in args.encodings:
        save_dir = os.path.join(out, "checkpoints", encoding)
        print(f"| training {encoding} for {args.max_update} updates (log: {save_dir}/train.log)", flush=True)
        start = time.time()
        pipeline.train(data_bin, save_dir, pipeline.toy_train_flags(encoding, args.max_update, args.seed))
        train_time = time.time() - start
        averaged = pipeline.average_checkpoints(save_dir, 3, os.path.join(save_dir, "averaged.pt"))
        row = {"encoding": encoding, "train_seconds": round(train_time, 1)}
        for subset, name in (("test", f"in-range (3-{args.train_max_len})"),
                             ("test1", f"longer ({args.train_max_len + 1}-{args.long_max_len})")):
            generation = pipeline.generate(data_bin, averaged, subset=subset, beam=4, lenpen=0.6)
            bleu, signature = pipeline.sacrebleu_score(generation.hypotheses, generation.references)
            row[name] = round(bleu.score, 2)
            print(f"| {encoding:12s} {name:22s} BLEU {bleu.score:6.2f}", flush=True)
        results.append(row)

    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"sacrebleu": signature, "results": results}, f, indent=2)
    print(f"| results in {out}/results.json ({signature})")


if __name__ == "__main__":
    main()
