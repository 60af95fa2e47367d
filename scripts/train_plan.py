#!/usr/bin/env python
"""The plan of a recipe's training, worked out before the GPU-days: devices, batch, updates,
checkpoints, averaging, disk; and, after training, whether a run reached its target.

    # print the plan (and write the settings the recipe uses to --env-out, as shell assignments)
    python scripts/train_plan.py plan --data-bin data/wmt14_en_fr/data-bin --src en --tgt fr \\
        --arch big --stage train 300000 - --average 20 [--gpus auto] [--device auto] \\
        [--precision "--fp16"] [--max-tokens 4096] [--update-freq auto] [--env-out plan.env]
    # exit 0 if the checkpoint reached the stage's end, 3 (one line saying where it stopped) if not
    python scripts/train_plan.py check-finished --checkpoint runs/x/checkpoint_last.pt \\
        --max-update 100000 [--max-epoch 30]

Tokens per update: fairseq splits every batch of --max-tokens over the visible GPUs and sums
--update-freq of them per update, so one update holds about max_tokens x GPUs x update_freq
tokens. --update-freq auto keeps that near --tokens-per-update (8 x 4096 = 32768 padded tokens,
the ~25k source + 25k target tokens of Vaswani et al.): 8 on one GPU, 1 on eight.

Updates per epoch: the batches fairseq-train makes of the binarized training set (the .idx
sizes, sorted and cut by fairseq's own batch_by_size at --max-tokens), shared by the GPUs,
grouped by update_freq.

Checkpoints: every --save-interval-updates updates (auto: 1250 for base, 600 for big: about
10 minutes of Vaswani et al.'s 8-P100 steps, 0.43 s base / 1.0 s big, rounded to divide 100k
and 300k updates), the last --average kept and averaged. A checkpoint due exactly at an epoch's end is written as an epoch checkpoint
instead, and a stage ending between two intervals leaves its last updates out of the average:
both are counted. A plan whose last stage writes fewer interval checkpoints than --average is
refused (exit 2).
"""
import argparse
import logging
import math
import os
import shlex
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional

logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)

ARCHS = {  # d_model, ffn, layers per side (Vaswani et al.'s base and big)
    "base": (512, 2048, 6),
    "big": (1024, 4096, 6),
}
# about 10 minutes of training at Vaswani et al.'s step times on 8 P100s: base 100k steps in
# 12 h (0.43 s a step: 1400 in 10 min, 1250 divides 100k), big 300k in 3.5 days (1.0 s: 600)
SAVE_INTERVAL = {"base": 1250, "big": 600}
TOKENS_PER_UPDATE = 8 * 4096
# a checkpoint holds the weights (4 bytes each in fp32, 2 under --fp16) and Adam's two fp32
# moments: 12 bytes a parameter is the upper bound
BYTES_PER_PARAM = 12
PRECISION_FLAGS = {"--fp16": "--fp16", "--bf16": "--bf16", "--memory-efficient-fp16": "--fp16",
                   "--memory-efficient-bf16": "--bf16", "--amp": ""}


class PlanError(Exception):
    """A plan that cannot work: the message is the one line the user sees."""


@dataclass
class Stage:
    name: str
    max_update: Optional[int]
    max_epoch: Optional[int]


# ------------------------------------------------------------------------------------------------
def visible_gpus(gpus: str) -> int:
    """``auto``: the GPUs torch sees (CUDA_VISIBLE_DEVICES respected), else the number given."""
    if gpus != "auto":
        if not gpus.isdigit():
            raise PlanError(f"--gpus must be a number or auto, got {gpus!r}")
        return int(gpus)
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_settings(device: str, gpus: int, precision: str) -> Dict[str, str]:
    """Training and decoding flags for the device, and a line saying which it is."""
    flags = precision.split()
    if device == "cpu":
        # bf16 trains on the CPU with compat.bf16_without_tpu; fairseq's fp16 and amp need CUDA
        if any(f in PRECISION_FLAGS and "bf16" not in f for f in flags):
            raise PlanError(f"DEVICE=cpu with {precision}: fairseq-train runs fp16 and amp on a GPU only "
                            "(--bf16 runs on the CPU)")
        bf16 = " --bf16" if any("bf16" in f for f in flags) else ""
        return {"TRAIN_DEVICE_FLAGS": f"--cpu {' '.join(flags)}".strip(), "GEN_DEVICE_FLAGS": f"--cpu{bf16}",
                "DEVICE_DESC": f"CPU (DEVICE=cpu asked for it; {'bf16' if bf16 else 'fp32'})"}
    if device not in ("auto", "gpu"):
        raise PlanError(f"DEVICE must be auto, gpu or cpu, got {device!r}")
    if gpus == 0:
        raise PlanError("no GPU visible (torch.cuda.device_count() is 0): a WMT-size stage would take weeks "
                        "on CPU; set DEVICE=cpu to run it there anyway")
    if "--cpu" in flags:
        raise PlanError(f"DEVICE_FLAGS={precision} asks for the CPU while {gpus} GPU(s) are visible: "
                        "set DEVICE=cpu instead")
    gen = [PRECISION_FLAGS.get(f, f) for f in flags if PRECISION_FLAGS.get(f, f)]
    # fairseq-generate decodes on one GPU; --amp (autocast) is a training option: decode in fp32
    gen = list(dict.fromkeys(gen))
    name = "bf16" if "--bf16" in gen else "fp16" if "--fp16" in gen else "fp32"
    train_name = " ".join(flags) or "fp32"
    return {"TRAIN_DEVICE_FLAGS": " ".join(flags), "GEN_DEVICE_FLAGS": " ".join(gen),
            "DEVICE_DESC": f"{gpus} GPU(s) ({train_name}); decoding on 1 GPU ({name})"}


def update_freq_for(max_tokens: int, gpus: int, target: int = TOKENS_PER_UPDATE) -> int:
    """Batches summed per update so that max_tokens x GPUs x update_freq is nearest ``target``."""
    return max(1, round(target / (max_tokens * max(gpus, 1))))


BATCH_TOLERANCE = 0.05  # tokens per update within 5% of the target, or the plan says why not
MAX_TOKENS_PER_GPU = 4096  # the papers' batch per GPU (fits fp16 base and big on 16 GB)


def batch_for(max_tokens: Optional[int], gpus: int, update_freq: Optional[int] = None,
              target: int = TOKENS_PER_UPDATE):
    """(max_tokens, update_freq, relative deviation of max_tokens x GPUs x update_freq from
    ``target``). Whatever is not given is chosen: with both free, the fewest batches per update
    of at most 4096 tokens, and max_tokens = target / (GPUs x update_freq), so that 3, 5, 6 or
    16 GPUs hold the same ~32k tokens an update as 1, 2, 4 and 8 (4096 x GPUs x round(8 / GPUs)
    is 12.5% to 2x off there)."""
    gpus = max(gpus, 1)
    if max_tokens is None:
        if update_freq is None:
            update_freq = max(1, math.ceil(target / (MAX_TOKENS_PER_GPU * gpus)))
        max_tokens = max(1, round(target / (gpus * update_freq)))
    elif update_freq is None:
        update_freq = update_freq_for(max_tokens, gpus, target)
    return max_tokens, update_freq, max_tokens * gpus * update_freq / target - 1


# ------------------------------------------------------------------------------------------------
def training_pair(data_bin: str):
    """(src, tgt) of the binarized training set in ``data_bin`` (train.SRC-TGT.SRC.idx)."""
    import glob

    for path in sorted(glob.glob(os.path.join(data_bin, "train.*-*.*.idx"))):
        pair, lang = os.path.basename(path).split(".")[1:3]
        src, _, tgt = pair.partition("-")
        if lang == src:
            return src, tgt
    raise PlanError(f"no binarized training set in {data_bin} (train.SRC-TGT.SRC.idx): run prepare.sh first")


def dataset_sizes(data_bin: str, src: str, tgt: str):
    """The token counts (with </s>) of every training pair, from the binarized .idx files."""
    import numpy as np
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    if not (src and tgt):
        src, tgt = training_pair(data_bin)
    sizes = []
    for lang in (src, tgt):
        prefix = os.path.join(data_bin, f"train.{src}-{tgt}.{lang}")
        if not os.path.isfile(prefix + ".idx"):
            raise PlanError(f"no binarized training set {prefix}.idx: run the recipe's prepare.sh first")
        dataset = MMapIndexedDataset(prefix)  # held while its memory-mapped sizes are copied
        sizes.append(np.array(dataset.sizes, dtype=np.int64))
        del dataset
    return sizes[0], sizes[1]


def batches_per_epoch(src_sizes, tgt_sizes, max_tokens: int) -> int:
    """The batches fairseq-train makes: pairs sorted by target then source length (as
    LanguagePairDataset.ordered_indices) and cut by fairseq's batch_by_size, batch sizes a
    multiple of 8 where they exceed 8 (fairseq's --required-batch-size-multiple default), with
    the plugin's fix that keeps the remainder fairseq would drop (what --user-dir loads)."""
    import numpy as np
    from fairseq.data import data_utils

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from fairseq_posenc import compat

    compat.keep_last_batch()

    if len(src_sizes) == 0:
        raise PlanError("the binarized training set is empty")
    longest = int(max(src_sizes.max(), tgt_sizes.max()))
    if longest > max_tokens:
        raise PlanError(f"a training pair of {longest} tokens does not fit --max-tokens {max_tokens}")
    indices = np.arange(len(src_sizes), dtype=np.int64)
    indices = indices[np.argsort(tgt_sizes[indices], kind="mergesort")]
    indices = indices[np.argsort(src_sizes[indices], kind="mergesort")]
    num_tokens = np.maximum(src_sizes, tgt_sizes)
    batches = data_utils.batch_by_size(indices, lambda i: num_tokens[i], num_tokens_vec=num_tokens[indices],
                                       max_tokens=max_tokens, required_batch_size_multiple=8)
    return len(batches)


def updates_per_epoch(batches: int, gpus: int, update_freq: int) -> int:
    """Each GPU takes every GPUs-th batch (the last ones padded with empty batches), and
    update_freq of them make an update."""
    return math.ceil(math.ceil(batches / max(gpus, 1)) / update_freq)


def stage_end(stage: Stage, per_epoch: int) -> int:
    """The update at which a stage stops: --max-update, or the end of epoch --max-epoch."""
    ends = [u for u in (stage.max_update, stage.max_epoch and stage.max_epoch * per_epoch) if u]
    if not ends:
        raise PlanError(f"stage {stage.name} has neither a maximum update nor a maximum epoch: it would never end")
    return min(ends)


def interval_checkpoints(end: int, interval: int, per_epoch: int) -> List[int]:
    """The updates of the interval checkpoints (checkpoint_E_U.pt) a stage writes: multiples of
    ``interval`` up to ``end``, less those due at an epoch's end (fairseq writes checkpointE.pt then)."""
    return [u for u in range(interval, end + 1, interval) if u % per_epoch]


def parameters(arch: str, vocab: int, model_flags: str = "") -> int:
    """Parameters of a post-LN Transformer with all embeddings shared (the position encodings'
    own few parameters left out): an estimate for the disk figures."""
    d, ffn, layers = ARCHS[arch]
    sizes = {"--encoder-embed-dim": d, "--encoder-ffn-embed-dim": ffn, "--encoder-layers": layers,
             "--decoder-layers": layers}
    words = model_flags.split()
    for flag, value in zip(words, words[1:]):
        if flag in sizes and value.isdigit():
            sizes[flag] = int(value)
    d, ffn = sizes["--encoder-embed-dim"], sizes["--encoder-ffn-embed-dim"]
    attention = 4 * d * d + 4 * d
    feed_forward = 2 * d * ffn + ffn + d
    encoder_layer = attention + feed_forward + 2 * 2 * d
    decoder_layer = 2 * attention + feed_forward + 3 * 2 * d
    return vocab * d + sizes["--encoder-layers"] * encoder_layer + sizes["--decoder-layers"] * decoder_layer


def dictionary_size(data_bin: str, src: str) -> int:
    path = os.path.join(data_bin, f"dict.{src}.txt")
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f) + 4  # <s>, <pad>, </s>, <unk>


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return ""


# ------------------------------------------------------------------------------------------------
def make_plan(args) -> Dict[str, str]:
    stages = [Stage(name, None if u == "-" else int(u), None if e == "-" else int(e)) for name, u, e in args.stage]
    gpus = visible_gpus(args.gpus)
    device = device_settings(args.device, gpus, args.precision)
    workers = 1 if args.device == "cpu" else gpus
    chosen = args.max_tokens == "auto" or args.update_freq == "auto"
    max_tokens, update_freq, deviation = batch_for(None if args.max_tokens == "auto" else int(args.max_tokens), workers,
                                                   None if args.update_freq == "auto" else int(args.update_freq))
    args.max_tokens = max_tokens
    interval = SAVE_INTERVAL[args.arch] if args.save_interval_updates == "auto" else int(args.save_interval_updates)
    src_sizes, tgt_sizes = dataset_sizes(args.data_bin, args.src, args.tgt)
    batches = batches_per_epoch(src_sizes, tgt_sizes, args.max_tokens)
    per_epoch = updates_per_epoch(batches, workers, update_freq)
    tokens = args.max_tokens * workers * update_freq
    real_tokens = int(src_sizes.sum() + tgt_sizes.sum())
    print(f"| device: {device['DEVICE_DESC']}")
    print(f"| tokens per update: {args.max_tokens} x {workers} {'GPU' if gpus and args.device != 'cpu' else 'CPU'}"
          f" x update-freq {update_freq} = {tokens} padded tokens at most ({deviation:+.1%} from the papers' "
          f"{TOKENS_PER_UPDATE})")
    if chosen and abs(deviation) > BATCH_TOLERANCE:
        if not args.allow_batch:
            raise PlanError(f"{tokens} tokens per update is {deviation:+.1%} from the papers' {TOKENS_PER_UPDATE} at "
                            f"{workers} GPU(s) with MAX_TOKENS={args.max_tokens}: set MAX_TOKENS=auto, or "
                            "ALLOW_BATCH=1 to train with it (the lr and the update count stay the papers')")
        print(f"| note: tokens per update {deviation:+.1%} from the papers' (ALLOW_BATCH=1)")
    print(f"| training set: {len(src_sizes)} pairs, {real_tokens} tokens (source + target, with </s>), "
          f"{batches} batches of --max-tokens {args.max_tokens}")
    print(f"| updates per epoch: {per_epoch}")
    vocab = dictionary_size(args.data_bin, args.src or training_pair(args.data_bin)[0])
    checkpoint = parameters(args.arch, vocab, args.model_flags) * BYTES_PER_PARAM
    disk = total = 0
    values = {**device, "UPDATE_FREQ": str(update_freq), "MAX_TOKENS": str(args.max_tokens),
              "SAVE_INTERVAL_UPDATES": str(interval),
              "UPDATES_PER_EPOCH": str(per_epoch), "TOKENS_PER_UPDATE": str(tokens)}
    for number, stage in enumerate(stages, 1):
        end = stage_end(stage, per_epoch)
        last = number == len(stages)
        reason = ("--max-update" if end == stage.max_update else "--max-epoch")
        print(f"| stage {stage.name}: ends at its update {end} ({end / per_epoch:.2f} epochs, {reason})")
        values[f"STAGE{number}_END"] = str(end)
        total += end
        if not last:
            # a stage another starts from keeps best, last and its last interval checkpoint
            # (--keep-interval-updates 1)
            disk += 3 * checkpoint
            continue
        saved = interval_checkpoints(end, interval, per_epoch)
        averaged = saved[-args.average:]
        print(f"| checkpoints: every {interval} updates -> {len(saved)} interval checkpoints in stage "
              f"{stage.name}, the last {args.average} kept (--keep-interval-updates)")
        if len(saved) < args.average:
            at_epoch_end = end // interval - len(saved)
            raise PlanError(f"stage {stage.name} ends at update {end} and writes {len(saved)} checkpoints every "
                            f"{interval} updates" + (f" ({at_epoch_end} more fall at an epoch's end)" if at_epoch_end else "")
                            + f": too few to average the last {args.average}; lower SAVE_INTERVAL_UPDATES (at most "
                            f"{max(1, end // args.average)}) or AVERAGE, or train longer")
        print(f"| averaged: updates {', '.join(map(str, averaged))} (the last {averaged[-1] - averaged[0] + interval} "
              f"updates of training)")
        if averaged[-1] != end:
            print(f"| note: updates {averaged[-1] + 1}-{end} come after the last interval checkpoint and are not "
                  f"in the average (make the interval divide {end})")
        disk += (args.average + 3) * checkpoint  # + checkpoint_last, checkpoint_best, the average
    if len(stages) > 1 or args.baseline_updates:
        line = f"| budget: {total} updates in all ({total / per_epoch:.2f} epochs)"
        if args.baseline_updates:
            line += (f"; the baseline trains {args.baseline_updates} ({args.baseline_updates / per_epoch:.2f} epochs): "
                     f"{total / args.baseline_updates:.2f}x its updates")
        print(line)
    print(f"| disk for checkpoints: about {human_bytes(disk)} ({human_bytes(checkpoint)} each, estimated for "
          f"{parameters(args.arch, vocab, args.model_flags) / 1e6:.1f}M parameters with Adam's state)")
    values["CHECKPOINT_DISK"] = str(disk)
    return values


def read_progress(path: str):
    """(updates, finished epochs) of a fairseq checkpoint."""
    import torch

    if not os.path.isfile(path):
        raise PlanError(f"no checkpoint {path}: has training run?")
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except Exception:  # an older (non-zip) checkpoint cannot be memory-mapped
        state = torch.load(path, map_location="cpu", weights_only=False)
    updates = state["optimizer_history"][-1]["num_updates"]
    iterator = state.get("extra_state", {}).get("train_iterator", {})
    # fairseq stores the next epoch once an epoch is over, the current one during it
    return updates, iterator.get("epoch", 1) - 1


def check_finished(checkpoint: str, max_update: Optional[int], max_epoch: Optional[int]) -> str:
    updates, epochs = read_progress(checkpoint)
    targets = []
    if max_update:
        targets.append(f"update {max_update}")
        if updates >= max_update:
            return f"{checkpoint}: finished (update {updates} of {max_update})"
    if max_epoch:
        targets.append(f"epoch {max_epoch}")
        if epochs >= max_epoch:
            return f"{checkpoint}: finished (epoch {epochs} of {max_epoch}, update {updates})"
    raise PlanError(f"{checkpoint} stopped at update {updates} (epoch {epochs} finished) before "
                    f"{' or '.join(targets) or 'any target'}: training is unfinished")


def main(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="print the training plan; write the recipe's settings to --env-out")
    p.add_argument("--data-bin", required=True, help="fairseq-preprocess output (train.SRC-TGT.*.idx)")
    p.add_argument("--src", default="", help="source language (default: from the train.SRC-TGT.* files)")
    p.add_argument("--tgt", default="", help="target language")
    p.add_argument("--arch", choices=sorted(ARCHS), default="base", help="Transformer size")
    p.add_argument("--model-flags", default="", help="size flags that replace the arch's (for the disk estimate)")
    p.add_argument("--stage", nargs=3, action="append", required=True, metavar=("NAME", "MAX_UPDATE", "MAX_EPOCH"),
                   help="a training stage and where it stops ('-' for none); repeat for each, in order; "
                        "the last stage's checkpoints are averaged")
    p.add_argument("--average", type=int, default=5, help="interval checkpoints to average (5 base, 20 big)")
    p.add_argument("--save-interval-updates", default="auto", help="updates between checkpoints (auto: 1250 base, 600 big)")
    p.add_argument("--max-tokens", default="auto",
                   help="tokens per batch per GPU (auto: at most 4096, chosen with --update-freq so that an update "
                        "holds ~32768 tokens on any GPU count)")
    p.add_argument("--baseline-updates", type=int, default=0,
                   help="the updates of the baseline this plan is compared with (FLOATER: the sinusoidal model's)")
    p.add_argument("--allow-batch", action="store_true",
                   help="train even when the chosen batch is more than 5%% from the papers' tokens per update")
    p.add_argument("--update-freq", default="auto", help="batches per update per GPU (auto: ~32768 tokens an update)")
    p.add_argument("--gpus", default="auto", help="GPUs fairseq will use (auto: those torch sees)")
    p.add_argument("--device", default="auto", help="auto | gpu | cpu (cpu only when asked for)")
    p.add_argument("--precision", default="--fp16", help="fairseq's precision flags on a GPU (--fp16, --bf16, --amp, ...)")
    p.add_argument("--env-out", help="write the settings as shell assignments here")
    p = sub.add_parser("device", help="print the device line; write the training/decoding flags to --env-out")
    p.add_argument("--gpus", default="auto", help="GPUs fairseq will use (auto: those torch sees)")
    p.add_argument("--device", default="auto", help="auto | gpu | cpu (cpu only when asked for)")
    p.add_argument("--precision", default="--fp16", help="fairseq's precision flags on a GPU")
    p.add_argument("--env-out", help="write the settings as shell assignments here")
    p = sub.add_parser("check-finished", help="exit 3 unless the checkpoint reached --max-update or --max-epoch")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--max-update", type=int, help="the stage's --max-update")
    p.add_argument("--max-epoch", type=int, help="the stage's --max-epoch")
    args = parser.parse_args(argv)
    try:
        if args.command == "plan":
            if args.average < 1:
                raise PlanError("--average must be at least 1")
            values = make_plan(args)
        elif args.command == "device":
            values = device_settings(args.device, visible_gpus(args.gpus), args.precision)
            print(f"| device: {values['DEVICE_DESC']}")
        if args.command in ("plan", "device"):
            if args.env_out:
                with open(args.env_out, "w", encoding="utf-8") as f:
                    f.writelines(f"{k}={shlex.quote(v)}\n" for k, v in values.items())
        else:
            print("| " + check_finished(args.checkpoint, args.max_update, args.max_epoch))
    except PlanError as e:
        parser.exit(3 if args.command == "check-finished" else 2, f"train_plan.py: error: {e}\n")


if __name__ == "__main__":
    main()
