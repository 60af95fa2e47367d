#!/usr/bin/env python
"""Average the parameters of fairseq checkpoints (fairseq's own script is not installed).

Examples:
    # the last 5 epoch checkpoints of a run
    python scripts/average_checkpoints.py --inputs checkpoints/ --num-epoch-checkpoints 5 \\
        --output checkpoints/averaged.pt
    # the last 20 update checkpoints (--save-interval-updates), or an explicit list
    python scripts/average_checkpoints.py --inputs checkpoints/ --num-update-checkpoints 20 --output avg.pt
    python scripts/average_checkpoints.py --inputs a.pt b.pt c.pt --output avg.pt

The result keeps the newest input's metadata (config, dictionaries) and is written atomically:
an interrupted run never leaves a truncated file at ``--output``.
"""
import argparse
import logging
import os
import sys
import tempfile
from typing import Dict, List, Optional

import torch

# before fairseq's import configures the root logger at INFO (fairseq/tasks/text_to_speech.py)
logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
from fairseq.checkpoint_utils import checkpoint_paths  # noqa: E402

from fairseq_posenc import compat  # noqa: E402  (lets torch's safe loader read fairseq checkpoints)

compat.apply()

EPOCH_PATTERN = r"checkpoint(\d+)\.pt"
UPDATE_PATTERN = r"checkpoint_\d+_(\d+)\.pt"
LONGEST = ".longest_trained"  # fairseq_posenc/models/transformer_stacks.py
# FLOATER's (and the RNN's) kept solution, the fingerprint of the parameters it was solved for, and
# a --floater-solve-every cycle's pending gradient: the average has other parameters, so none of
# them holds for it (and their lengths differ between checkpoints: validation grows the solution).
# Saved empty, they are solved again on load (fairseq_posenc/positions/floater/ode.py)
SOLVED = (".ode.solution", ".ode.fingerprint", ".ode.pending_gradient")


def last_checkpoints(directory: str, n: int, update_based: bool, upper_bound: Optional[int] = None) -> List[str]:
    """The ``n`` newest epoch (or update) checkpoints in ``directory``, newest first."""
    pattern = UPDATE_PATTERN if update_based else EPOCH_PATTERN
    found = checkpoint_paths(directory, pattern=pattern, keep_match=True)  # newest first
    if upper_bound is not None:
        found = [(path, number) for path, number in found if number <= upper_bound]
    if len(found) < n:
        kind = "update" if update_based else "epoch"
        raise ValueError(f"asked for the last {n} {kind} checkpoints, found {len(found)} in {directory}")
    return [path for path, _ in found[:n]]


def average(paths: List[str]) -> Dict:
    """The newest checkpoint's state with ``model`` replaced by the element-wise mean."""
    newest = torch.load(paths[0], map_location="cpu")
    print(f"| read {paths[0]}", file=sys.stderr)
    # Sum in float64 so that averaging many checkpoints loses nothing; integer buffers
    # (counters, versions) are taken from the newest checkpoint, but the stacks' longest training
    # input is the longest of all: every input checkpoint was trained on it
    for key in [k for k in newest["model"] if k.endswith(SOLVED)]:
        newest["model"][key] = newest["model"][key].new_zeros(0, *newest["model"][key].shape[1:]) \
            if not key.endswith(".fingerprint") else torch.zeros_like(newest["model"][key])
    total = {k: v.double() for k, v in newest["model"].items() if v.is_floating_point() and not k.endswith(SOLVED)}
    longest = [k for k in newest["model"] if k.endswith(LONGEST)]
    for path in paths[1:]:
        model = torch.load(path, map_location="cpu")["model"]
        if model.keys() != newest["model"].keys():
            raise ValueError(f"{path} has different parameters from {paths[0]}")
        for key in total:
            total[key] += model[key].double()
        for key in longest:
            newest["model"][key] = torch.maximum(newest["model"][key], model[key])
        print(f"| read {path}", file=sys.stderr)
    for key, summed in total.items():
        newest["model"][key] = (summed / len(paths)).to(newest["model"][key].dtype)
    return newest


def save_atomically(state: Dict, output: str):
    directory = os.path.dirname(os.path.abspath(output))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".pt")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, output)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", nargs="+", required=True,
                        help="checkpoint files, or one directory with --num-*-checkpoints")
    parser.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--num-epoch-checkpoints", type=int,
                       help="average the last N checkpointEPOCH.pt files of the directory")
    group.add_argument("--num-update-checkpoints", type=int,
                       help="average the last N checkpoint_EPOCH_UPDATE.pt files of the directory")
    parser.add_argument("--checkpoint-upper-bound", type=int,
                        help="ignore checkpoints past this epoch (or update) number")
    args = parser.parse_args(argv)

    n = args.num_epoch_checkpoints or args.num_update_checkpoints
    if n is not None:
        if len(args.inputs) != 1 or not os.path.isdir(args.inputs[0]):
            parser.error("--num-*-checkpoints needs exactly one directory in --inputs")
        try:
            paths = last_checkpoints(args.inputs[0], n, args.num_update_checkpoints is not None,
                                     args.checkpoint_upper_bound)
        except ValueError as e:
            parser.error(str(e))
    else:
        paths = args.inputs
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            parser.error(f"no such checkpoint: {', '.join(missing)}")
    save_atomically(average(paths), args.output)
    print(f"| averaged {len(paths)} checkpoints into {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
