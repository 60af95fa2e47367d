#!/usr/bin/env python
"""One encoding trained and decoded in about a minute on 2 cores: a tiny model through fairseq-train
on the toy pair, fairseq-generate on its test set, the training loss and the test BLEU printed.

    python scripts/smoke.py --position-encoding NAME [--out DIR] [--max-update 300]

A smoke run, not a measurement: it shows that a new encoding registers, trains (the loss falls)
and decodes every test sentence. The pair is the tests' reversal pair (recipes/posenc_workflow/
toy_data.py): 1,000 training sentences of 3-12 words, 100 test sentences as long.
"""
import argparse
import json
import logging
import math
import os
import re
import sys
import time

# before fairseq's import configures the root logger at INFO (fairseq/tasks/text_to_speech.py)
logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
import fairseq_posenc  # noqa: E402
from fairseq_posenc.positions import POSITION_ENCODINGS  # noqa: E402
from posenc_workflow import pipeline, toy_data  # noqa: E402

SPLITS = {"train": (1000, 3, 12), "valid": (100, 3, 12), "test": (100, 3, 12)}
# fairseq's log lines in --log-format json: "... | train_inner | {...}", "... | valid | {...}"
_RECORD = re.compile(r"\| (train_inner|train|valid) \| (\{.*\})\s*$", re.M)


def losses(log: str):
    """[(update, training loss)] as fairseq-train logged them, and the last validation loss (bits)."""
    train, valid = [], None
    for kind, record in _RECORD.findall(log):
        record = json.loads(record)
        if kind == "valid":
            valid = float(record["valid_loss"])
        else:
            prefix = "train_" if kind == "train" else ""
            train.append((int(record[prefix + "num_updates"]), float(record[prefix + "loss"])))
    return sorted(set(train)), valid


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--position-encoding", required=True, help="a registered encoding: "
                        + ", ".join(POSITION_ENCODINGS))
    parser.add_argument("--out", default="smoke_output", help="working directory (default smoke_output)")
    parser.add_argument("--max-update", type=int, default=300, help="training updates (default 300)")
    args = parser.parse_args(argv)
    name = args.position_encoding
    if name not in POSITION_ENCODINGS:
        sys.exit(f"smoke.py: unknown --position-encoding {name!r}; choose one of: {', '.join(POSITION_ENCODINGS)}")
    for what, path in (("fairseq_posenc", os.path.dirname(fairseq_posenc.__file__)), ("--user-dir", pipeline.USER_DIR)):
        if os.path.realpath(path) != os.path.realpath(os.path.join(ROOT, "fairseq_posenc")):
            sys.exit(f"smoke.py: {what} is {path}, not this checkout's ({ROOT}): run it with "
                     f"PYTHONPATH={ROOT}:{ROOT}/recipes, or `pip install -e .` in {ROOT}")
    out = os.path.abspath(os.path.join(args.out, name))
    started = time.time()
    prefixes = toy_data.write_toy_corpus(os.path.join(out, "raw"), SPLITS)
    import fairseq_cli.preprocess
    from fairseq import options

    data_bin = os.path.join(out, "data-bin")
    fairseq_cli.preprocess.main(options.get_preprocessing_parser().parse_args([
        "--source-lang", "src", "--target-lang", "tgt", *[f"--{k}pref={v}" for k, v in prefixes.items()],
        "--destdir", data_bin, "--joined-dictionary", "--workers", "1"]))
    flags = pipeline.toy_train_flags(name, max_update=args.max_update, size="tiny", max_tokens=1000)
    log = pipeline.train(data_bin, os.path.join(out, "checkpoints"), flags + [
        "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", "25"])
    train, valid = losses(log)
    print(f"| smoke {name}: fairseq-train, {train[-1][0]} updates: training loss {train[0][1]:.2f} at update "
          f"{train[0][0]}, {train[-1][1]:.2f} at update {train[-1][0]}; validation loss {valid:.2f} "
          f"({out}/checkpoints/train.log)", flush=True)
    generation = pipeline.generate(data_bin, os.path.join(out, "checkpoints", "checkpoint_last.pt"),
                                   log=os.path.join(out, "generate.log"))
    bleu, _ = pipeline.sacrebleu_score(generation.hypotheses, generation.references)
    print(f"| smoke {name}: fairseq-generate, {len(generation.hypotheses)} hypotheses of {SPLITS['test'][0]} test "
          f"sentences: BLEU {bleu.score:.2f} ({out}/generate.log; {time.time() - started:.0f} s in all)", flush=True)
    if not (math.isfinite(train[-1][1]) and train[-1][1] < train[0][1]):
        sys.exit(f"smoke.py: {name}'s training loss did not fall: {train[0][1]:.2f} -> {train[-1][1]:.2f}")


if __name__ == "__main__":
    main()
