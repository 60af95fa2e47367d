#!/usr/bin/env python
"""The plan of a recipe's training, worked out before the GPU-days: devices, batch, updates,
checkpoints, averaging, disk; and, after training, whether a run reached its target.

    # print the plan (and write the settings the recipe uses to --env-out, as shell assignments)
    python fairseq_posenc/recipe/plan.py plan --data-bin data/wmt14_en_fr/data-bin --src en --tgt fr \\
        --arch big --stage train 300000 - --average 20 [--gpus auto] [--device auto] \\
        [--precision "--fp16"] [--max-tokens 4096] [--update-freq auto] [--env-out plan.env]
    # exit 0 if the checkpoint reached the stage's end, 3 (one line saying where it stopped) if not
    python fairseq_posenc/recipe/plan.py check-finished --checkpoint runs/x/checkpoint_last.pt \\
        --max-update 100000 [--max-epoch 30]
    # exit 2 (one line) if prepare.sh's corpus would not fit on the disk of --work
    python fairseq_posenc/recipe/plan.py prepare-space --work data/x --recipe wmt14_en_de --sources S \\
        --archives-dir data/archives --src en --tgt de      # or --raw-text data/x/raw once extracted

World: the processes of every node (find_world): NNODES > 1 runs torchrun on each node (the
recipe once per node, NODE_RANK, MASTER_ADDR, LAUNCH_ID); under srun, SLURM's tasks, as fairseq
reads them (a task a node: every GPU it sees; a task per process: SLURM_PROCID's rank); else this
node's GPUs (NUM_GPUS of them), or one CPU process. The first process writes the shared files.

Tokens per update: every process takes its own batches of --max-tokens and --update-freq of them
make an update, so one update holds about max_tokens x world x update_freq tokens. With both auto
that is kept within 0.1% of 32768 padded tokens (8 x 4096, the ~25k source + 25k target tokens of
Vaswani et al.) at any world size; a given --max-tokens (or a longest pair above what the world
allows) states its deviation and is refused past 5% unless --allow-batch. --batch-target sets
another target: IWSLT'14 trains at fairseq's example's 4096 (one GPU, update-freq 1); the WMT
recipes' LARGE_BATCH=1 at 16x 32768 (fairseq's examples/scaling_nmt big batches, recipes/common.sh).
The plan prints the padded tokens an update holds on average (whole sentences, a multiple of 8 a
batch, fill a small --max-tokens less) and warns below 2048 tokens a GPU (512 at 64 GPUs: a step
is small against the all-reduce of every gradient, and an update holds ~19% fewer tokens on WMT14
En-De's lengths than with 4096-token batches).

Time and memory (--tokens-per-second, IWSLT's plan): the updates x this corpus's target tokens
an update / an assumed speed (fairseq's wps), and the GPU memory of weights, gradients and Adam.
length_distribution: a corpus side's length distribution and what a short-to-long split would keep
(what ``scripts/length_split.py --lengths-only`` prints).

Updates per epoch: the batches fairseq-train makes of the binarized training set (the .idx
sizes, sorted and cut by fairseq's own batch_by_size at --max-tokens), shared by the GPUs,
grouped by update_freq.

Checkpoints: every --save-interval-updates updates (auto: 1250 for base, 600 for big: about
10 minutes of Vaswani et al.'s 8-P100 steps, 0.43 s base / 1.0 s big, rounded to divide 100k
and 300k updates), the last --average kept and averaged. A checkpoint due exactly at an epoch's end is written as an epoch checkpoint
instead, and a stage ending between two intervals leaves its last updates out of the average:
both are counted. A plan whose last stage writes fewer interval checkpoints than --average is
refused (exit 2), and so is one whose checkpoints do not fit the free space of --out's
filesystem (unless --allow-low-disk).
"""
import argparse
import logging
import math
import os
import shlex
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional


ARCHS = {  # d_model, ffn, layers per side (Vaswani et al.'s base and big, fairseq's transformer_iwslt_de_en)
    "base": (512, 2048, 6),
    "big": (1024, 4096, 6),
    "iwslt": (512, 1024, 6),
}
# about 10 minutes of training at Vaswani et al.'s step times on 8 P100s: base 100k steps in
# 12 h (0.43 s a step: 1400 in 10 min, 1250 divides 100k), big 300k in 3.5 days (1.0 s: 600)
SAVE_INTERVAL = {"base": 1250, "big": 600, "iwslt": 1000}
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
        # What fairseq-train does on the CPU (measured with torch's CPU build): --bf16 and
        # --memory-efficient-bf16 train (compat.bf16_without_tpu); --fp16 builds its fp32 master
        # copy on torch.cuda.current_device() unless --fp16-no-flatten-grads, while
        # --memory-efficient-fp16 keeps none and trains; --amp is CUDA's autocast, which torch
        # switches off on the CPU, so the run would be fp32 under a half-precision name
        if "--amp" in flags:
            raise PlanError(f"DEVICE=cpu with {precision}: --amp autocasts on CUDA only (on the CPU torch turns it "
                            "off and fairseq-train runs fp32); use --bf16")
        if "--fp16" in flags and "--fp16-no-flatten-grads" not in flags:
            raise PlanError(f"DEVICE=cpu with {precision}: fairseq's --fp16 keeps its fp32 weights on a CUDA device; "
                            "on the CPU use --bf16, --memory-efficient-fp16 or --fp16 --fp16-no-flatten-grads")
        train = [f for f in flags if f != "--cpu"]
        gen = list(dict.fromkeys(PRECISION_FLAGS.get(f, f) for f in train))
        # the plugin's models cast themselves for --bf16 (prepare_for_inference_), fairseq halves for --fp16
        name = "bf16" if "--bf16" in gen else "fp16" if "--fp16" in gen else "fp32"
        desc = (f"CPU (DEVICE=cpu asked for it; {' '.join(train)}); decoding on the CPU ({name})" if train
                else "CPU (DEVICE=cpu asked for it; fp32)")
        return {"TRAIN_DEVICE_FLAGS": " ".join(["--cpu", *train]), "GEN_DEVICE_FLAGS": " ".join(["--cpu", *gen]),
                "DEVICE_DESC": desc}
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
# below this a GPU's batch is small against what every step exchanges (the all-reduce of every
# gradient, the same size whatever the batch), and whole sentences fill its cap less: the plan warns
SMALL_BATCH_PER_GPU = 2048


def batch_for(max_tokens: Optional[int], gpus: int, update_freq: Optional[int] = None,
              target: int = TOKENS_PER_UPDATE, longest: int = 1):
    """(max_tokens, update_freq, relative deviation of max_tokens x GPUs x update_freq from
    ``target``). Whatever is not given is chosen: with both free, the fewest batches per update
    of at most 4096 tokens, and max_tokens = target / (GPUs x update_freq), so that 3, 5, 6 or
    16 GPUs hold the same ~32k tokens an update as 1, 2, 4 and 8 (4096 x GPUs x round(8 / GPUs)
    is 12.5% to 2x off there). A chosen max_tokens is at least ``longest`` (the longest training
    pair: fairseq refuses a batch that cannot hold it), which on a large world overshoots."""
    gpus = max(gpus, 1)
    if max_tokens is None:
        if update_freq is None:
            update_freq = max(1, math.ceil(target / (MAX_TOKENS_PER_GPU * gpus)))
        max_tokens = max(1, longest, round(target / (gpus * update_freq)))
    elif update_freq is None:
        update_freq = update_freq_for(max_tokens, gpus, target)
    return max_tokens, update_freq, max_tokens * gpus * update_freq / target - 1


# ------------------------------------------------------------------------------------------------
# Several processes and nodes. fairseq-train finds its world in three ways (fairseq/distributed/
# utils.py, infer_init_method): torchrun's environment (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK:
# one process per GPU, started by torchrun on each node), SLURM's (the node list, SLURM_NNODES,
# SLURM_NTASKS_PER_NODE or SLURM_NTASKS, SLURM_NODEID, SLURM_PROCID, SLURM_LOCALID, and
# `scontrol show hostnames`; the first node's port from --distributed-port), or neither (one node:
# it spawns a process per GPU). The plan works out the same world, so that its tokens per update
# and updates per epoch are the ones fairseq-train will run, and which process writes the files
# every node shares (logs, settings, markers, averages).
TORCHRUN_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")


@dataclass
class World:
    launcher: str  # "node" (fairseq-train alone), "torchrun" or "slurm"
    nodes: int
    per_node: int  # processes a node: one per GPU (on the CPU, as many as asked)
    node_rank: int
    first: bool  # this process writes the shared files (the first process of the first node)
    launch_id: str = ""  # what every node of this launch shares (fairseq_posenc/recipe/steps.py stage --launch)
    flags: Optional[List[str]] = None  # fairseq-train's distributed flags
    command: Optional[List[str]] = None  # what starts fairseq-train on this node ([]: it is run itself)
    how: str = ""

    @property
    def size(self) -> int:
        return self.nodes * self.per_node


def torch_gpus() -> int:
    """The GPUs torch sees on this node (CUDA_VISIBLE_DEVICES respected)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _int(value, what: str) -> int:
    if value is None or not str(value).isdigit():
        raise PlanError(f"{what} must be a number, got {value!r}")
    return int(value)


def find_world(env, device: str, asked: Optional[int], visible: int, nnodes: int = 1, node_rank: int = 0,
               nproc_per_node: Optional[int] = None, master_addr: str = "", master_port: str = "",
               launch_id: str = "", scontrol: Optional[bool] = None) -> World:
    """The world fairseq-train will run in on this node, from the launcher's environment ``env``.

    ``asked``: NUM_GPUS, the GPUs of the whole run (None: every GPU torch sees, ``visible``, on
    each node). ``nnodes`` > 1 (NNODES): the recipe runs once per node and starts torchrun there
    (NODE_RANK, MASTER_ADDR, MASTER_PORT, NPROC_PER_NODE). Otherwise SLURM's environment, where
    there is one and ``scontrol`` is on the PATH, as fairseq requires; otherwise this node alone.
    On the CPU a node runs NPROC_PER_NODE processes (1 by default), or SLURM's tasks."""
    import shutil

    cpu = device == "cpu"
    if all(key in env for key in TORCHRUN_ENV):
        raise PlanError("WORLD_SIZE and RANK are set (is the recipe running under torchrun?): fairseq-train would take "
                        "them for its own; run the recipe once per node with NNODES, NODE_RANK and MASTER_ADDR (it "
                        "starts torchrun itself), or unset them")

    def gpus_a_node(nodes: int) -> int:
        if asked is None:
            return nproc_per_node or visible
        if asked % nodes:
            raise PlanError(f"NUM_GPUS={asked} (the GPUs of all nodes) does not divide into {nodes} nodes")
        per_node = asked // nodes
        if visible and per_node > visible:
            raise PlanError(f"NUM_GPUS={asked} is {per_node} GPUs a node but torch sees {visible} here: for several "
                            "nodes set NNODES, NODE_RANK and MASTER_ADDR (torchrun) or start the recipe with srun")
        return per_node

    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise PlanError(f"NODE_RANK={node_rank} is not one of the {nnodes} nodes (0 to {nnodes - 1})")
    node_list = env.get("SLURM_STEP_NODELIST", env.get("SLURM_JOB_NODELIST"))
    if scontrol is None:
        scontrol = shutil.which("scontrol", path=env.get("PATH")) is not None
    if nnodes > 1 or (cpu and (nproc_per_node or 1) > 1 and not (node_list and scontrol)):
        per_node = (nproc_per_node or 1) if cpu else gpus_a_node(nnodes)
        if nnodes > 1 and not master_addr:
            raise PlanError(f"NNODES={nnodes} needs MASTER_ADDR: the address of the node with NODE_RANK=0, the same "
                            "on every node")
        if nnodes > 1 and not launch_id:
            raise PlanError(f"NNODES={nnodes} needs LAUNCH_ID: an id every node of this launch shares and no earlier "
                            "launch used (the scheduler's job id, say), so that the nodes act on the same decision")
        port = master_port or "29500"
        command = ["torchrun", "--nnodes", str(nnodes), "--node-rank", str(node_rank), "--nproc-per-node",
                   str(per_node), "--master-addr", master_addr or "127.0.0.1", "--master-port", port]
        world = World("torchrun", nnodes, per_node, node_rank, node_rank == 0, launch_id, command=command,
                      how=f"torchrun on each node, meeting at {master_addr or '127.0.0.1'}:{port}")
    elif node_list and scontrol:
        if "SLURM_NNODES" not in env:
            raise PlanError("SLURM's node list is set but SLURM_NNODES is not: start the recipe with srun")
        nodes = _int(env["SLURM_NNODES"], "SLURM_NNODES")
        if "SLURM_NTASKS_PER_NODE" in env:
            tasks = _int(env["SLURM_NTASKS_PER_NODE"], "SLURM_NTASKS_PER_NODE")
        else:
            total = _int(env.get("SLURM_NTASKS", str(nodes)), "SLURM_NTASKS")
            if total % nodes:
                raise PlanError(f"SLURM_NTASKS={total} tasks do not divide into SLURM_NNODES={nodes} nodes: give "
                                "srun --ntasks-per-node")
            tasks = total // nodes
        node_rank = _int(env.get("SLURM_NODEID", "0"), "SLURM_NODEID")
        rank = _int(env.get("SLURM_PROCID", "0"), "SLURM_PROCID")
        if tasks == 1:
            if cpu:
                if nodes > 1:
                    raise PlanError("under SLURM with one task a node fairseq-train starts a process per GPU, and on "
                                    "the CPU there is none: start a task per process (srun --ntasks-per-node=P)")
                per_node = 1
            else:
                # fairseq takes nodes x the GPUs it sees, whatever --distributed-world-size says
                per_node = visible or (asked // nodes if asked else 0)
                if asked is not None and visible and asked != nodes * visible:
                    a_node = asked // nodes if asked % nodes == 0 else "fewer"
                    raise PlanError(f"NUM_GPUS={asked}, but under SLURM fairseq-train uses every GPU it sees on each "
                                    f"node: {nodes} node(s) x {visible} = {nodes * visible}; ask SLURM for {a_node} "
                                    "GPUs a node, or set NUM_GPUS=auto")
            how = "SLURM, a task a node: fairseq-train starts a process per GPU"
        else:
            per_node = tasks
            if not cpu and visible and tasks > visible:
                raise PlanError(f"SLURM starts {tasks} tasks a node and fairseq puts task SLURM_LOCALID on that GPU, "
                                f"but torch sees {visible}: give each task the node's GPUs (--gpus-per-node, not "
                                "--gpus-per-task)")
            if asked is not None and asked != nodes * tasks:
                raise PlanError(f"NUM_GPUS={asked}, but SLURM starts {nodes} node(s) x {tasks} tasks = {nodes * tasks} "
                                "processes, one per GPU: set NUM_GPUS=auto or change srun's task count")
            how = "SLURM, a task per process"
        job, step = env.get("SLURM_JOB_ID", "0"), env.get("SLURM_STEP_ID", "batch")
        # the same on every node; another step of the job (or its requeued run) gets another
        import random

        port = master_port or str(random.Random(f"{job}.{step}").randint(10000, 60000))
        world = World("slurm", nodes, per_node, node_rank, rank == 0,
                      launch_id or f"slurm-{job}.{step}.{env.get('SLURM_RESTART_COUNT', '0')}", command=[],
                      how=how, flags=["--distributed-port", port] if nodes * per_node > 1 else [])
    else:
        per_node = 1 if cpu else gpus_a_node(1)
        world = World("node", 1, per_node, 0, True, launch_id, command=[],
                      how="this node alone" + ("" if cpu else ": fairseq-train starts a process per GPU"))
    flags = list(world.flags or [])
    if not cpu or world.size > 1:
        flags = ["--distributed-world-size", str(world.size)] + flags
    if cpu and world.size > 1:
        flags += ["--distributed-backend", "gloo"]  # NCCL needs GPUs
    world.flags = flags
    return world


def describe_world(world: World, cpu: bool) -> str:
    unit = ("process" if world.size == 1 else "processes") if cpu else ("GPU" if world.size == 1 else "GPUs")
    line = f"{world.size} {unit}"
    if world.nodes > 1 or world.launcher != "node":
        line += f" = {world.nodes} node(s) x {world.per_node} ({world.how}); this is node {world.node_rank}"
        line += (", which writes the shared files (FIRST_NODE=1)" if world.first
                 else ", which leaves the shared files to the first process (FIRST_NODE=0)")
    else:
        line += f" ({world.how})"
    return line


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
    return batch_layout(src_sizes, tgt_sizes, max_tokens)[0]


def batch_layout(src_sizes, tgt_sizes, max_tokens: int):
    """(batches, padded tokens of all of them) of :func:`batches_per_epoch`'s batches: a batch
    holds its sentence count x its longest pair (source or target), what --max-tokens caps. Whole
    sentences, a multiple of 8 of them, fill a small cap less: on WMT14 En-De's lengths 96% of
    4096 tokens, 78% of 512."""
    import numpy as np
    from fairseq.data import data_utils

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
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
    counts = np.fromiter((len(b) for b in batches), dtype=np.int64, count=len(batches))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    longest_in = np.maximum.reduceat(num_tokens[np.concatenate(batches)], starts)
    return len(batches), int((longest_in * counts).sum())


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


def same_dictionary(data_bin: str, src: str, tgt: str) -> bool:
    paths = [os.path.join(data_bin, f"dict.{lang}.txt") for lang in (src, tgt)]
    if not all(os.path.isfile(p) for p in paths):
        return True
    return open(paths[0], "rb").read() == open(paths[1], "rb").read()


def dictionary_size(data_bin: str, src: str) -> int:
    path = os.path.join(data_bin, f"dict.{src}.txt")
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f) + 4  # <s>, <pad>, </s>, <unk>


# Disk. prepare.sh keeps about 7-9x the extracted text: raw/, tok/, split/, bpe/ (a segmented
# copy), the cleaned train/valid/test and train.tok.* beside them, and data-bin/ (measured on
# tests/test_recipes.py's miniature archives, 3,600 pairs: 7.1x with subword-nmt merging every word
# whole, 9.1x with 60 merges splitting most; real 40k-merge BPE lies between); 9.2 leaves a margin.
PREPARED_PER_RAW = 9.2
# the extracted text of a recipe's pair per byte of the archives it reads (estimated from the
# published corpus sizes: Europarl and Common Crawl archives also hold other pairs, Gigaword
# French-English and UN are larger uncompressed)
RAW_PER_ARCHIVE = {"wmt14_en_de": 0.8, "wmt14_en_fr": 2.0, "wmt18": 0.8,
                   "iwslt14_de_en": 3.0}  # IWSLT: one gzipped tar of text, ~3x (estimate)


def bytes_under(path: str, suffix: str = "") -> int:
    """Bytes of the files under ``path`` (or of ``path`` itself), those ending in ``suffix`` only if given."""
    if os.path.isfile(path):
        return os.path.getsize(path) if path.endswith(suffix) else 0
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files
                     if f.endswith(suffix) and not os.path.islink(os.path.join(root, f)))
    return total


def disk_free(path: str) -> int:
    """Free bytes of the filesystem ``path`` is (or will be) on."""
    import shutil

    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free


def check_space(path: str, needed: float, held: int, what: str, allow: bool) -> str:
    """One line on ``needed`` bytes (``held`` of them already in ``path``) against the free space
    of ``path``'s filesystem; PlanError when short, unless ``allow``. ``what`` ends in its verb."""
    free = disk_free(path)
    line = (f"{what} about {human_bytes(needed)}" + (f" ({human_bytes(held)} already in {path})" if held else "")
            + f"; {human_bytes(free)} free on the filesystem of {path}")
    if needed - held > free:
        if not allow:
            raise PlanError(f"{line}: free some, use another directory, or set ALLOW_LOW_DISK=1 to go on")
        line += ": short (a run stops here unless ALLOW_LOW_DISK=1)"
    return line


def prepare_space(work: str, recipe: str, archives: List[str] = (), raw_text: str = "", allow: bool = False) -> str:
    """The disk a prepared corpus takes, from the extracted text once it is there (``raw_text``),
    else estimated from the archives' size."""
    if raw_text:
        raw = bytes_under(raw_text)
        basis = f"{PREPARED_PER_RAW}x the {human_bytes(raw)} of extracted text"
    else:
        ratio = next((r for name, r in RAW_PER_ARCHIVE.items() if recipe.startswith(name)), 2.0)  # wmt18_cs_en
        size = sum(os.path.getsize(a) for a in archives)
        raw = size * ratio
        basis = (f"an estimate: {PREPARED_PER_RAW}x the text, itself ~{ratio}x the {human_bytes(size)} of "
                 "archives")
    return check_space(work, raw * PREPARED_PER_RAW, bytes_under(work), f"the prepared corpus ({basis}) needs", allow)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return ""


# ------------------------------------------------------------------------------------------------
def make_plan(args) -> Dict[str, str]:
    stages = [Stage(name, None if u == "-" else int(u), None if e == "-" else int(e)) for name, u, e in args.stage]
    cpu = args.device == "cpu"
    asked = None if args.gpus == "auto" else visible_gpus(args.gpus)
    world = find_world(os.environ, args.device, asked, torch_gpus(), nnodes=_int(args.nnodes or "1", "NNODES"),
                       node_rank=_int(args.node_rank or "0", "NODE_RANK"),
                       nproc_per_node=None if args.nproc_per_node in ("", "auto") else _int(args.nproc_per_node,
                                                                                            "NPROC_PER_NODE"),
                       master_addr=args.master_addr, master_port=args.master_port, launch_id=args.launch_id)
    workers = world.size
    device = device_settings(args.device, 0 if cpu else workers, args.precision)
    if world.launcher != "node" or world.nodes > 1 or (cpu and workers > 1):
        device["DEVICE_DESC"] += f", {world.nodes} node(s) x {world.per_node} ({world.launcher})"
    src_sizes, tgt_sizes = dataset_sizes(args.data_bin, args.src, args.tgt)
    longest = int(max(src_sizes.max(), tgt_sizes.max())) if len(src_sizes) else 1
    chosen = args.max_tokens == "auto" or args.update_freq == "auto"
    target = args.batch_target
    # whose batch the target is: the papers' 32768 (WMT), or what the recipe names (IWSLT: fairseq's example's 4096)
    whose = args.batch_source or "the papers'"
    max_tokens, update_freq, deviation = batch_for(None if args.max_tokens == "auto" else int(args.max_tokens), workers,
                                                   None if args.update_freq == "auto" else int(args.update_freq),
                                                   target=target, longest=longest)
    held_up = (args.max_tokens == "auto" and max_tokens == longest
               and max_tokens * workers * update_freq > target)  # by the longest pair
    args.max_tokens = max_tokens
    interval = SAVE_INTERVAL[args.arch] if args.save_interval_updates == "auto" else int(args.save_interval_updates)
    batches, padded = batch_layout(src_sizes, tgt_sizes, args.max_tokens)
    per_epoch = updates_per_epoch(batches, workers, update_freq)
    tokens = args.max_tokens * workers * update_freq
    real_tokens = int(src_sizes.sum() + tgt_sizes.sum())
    padded_per_update = padded / per_epoch
    print(f"| device: {device['DEVICE_DESC']}")
    print(f"| world: {describe_world(world, cpu)}")
    unit = "GPU" if not cpu else "CPU process" if workers == 1 else "CPU processes"
    print(f"| tokens per update: {args.max_tokens} x {workers} {unit} x update-freq {update_freq} = {tokens} padded "
          f"tokens at most ({deviation:+.1%} from {whose} {target})")
    if chosen and abs(deviation) > BATCH_TOLERANCE:
        why = (f"MAX_TOKENS={longest}, the longest training pair" if held_up else f"MAX_TOKENS={args.max_tokens}")
        if not args.allow_batch:
            raise PlanError(f"{tokens} tokens per update is {deviation:+.1%} from {whose} {target} at "
                            f"{workers} {'process(es)' if cpu else 'GPU(s)'} with {why}: "
                            + ("train on fewer" if held_up else "set MAX_TOKENS=auto")
                            + ", or ALLOW_BATCH=1 to train with it (the lr and the update count stay the papers')")
        print(f"| note: tokens per update {deviation:+.1%} from {whose} (ALLOW_BATCH=1)")
    print(f"| training set: {len(src_sizes)} pairs, {real_tokens} tokens (source + target, with </s>), "
          f"{batches} batches of --max-tokens {args.max_tokens}")
    print(f"| updates per epoch: {per_epoch}")
    print(f"| padded tokens per update: {padded_per_update:.0f} on average ({padded_per_update / tokens - 1:+.1%} from "
          f"the {tokens} cap: a batch holds whole sentences, a multiple of 8 of them)")
    if not cpu and args.max_tokens < SMALL_BATCH_PER_GPU:
        for line in small_batch_warning(src_sizes, tgt_sizes, args.max_tokens, workers, padded_per_update, target):
            print(line)
    pair = training_pair(args.data_bin)
    vocab = dictionary_size(args.data_bin, args.src or pair[0])
    if not same_dictionary(args.data_bin, args.src or pair[0], args.tgt or pair[1]):
        # separate dictionaries (IWSLT): an encoder embedding and a decoder one (shared with its output)
        vocab += dictionary_size(args.data_bin, args.tgt or pair[1])
    checkpoint = parameters(args.arch, vocab, args.model_flags) * BYTES_PER_PARAM
    disk = total = 0
    values = {**device, "UPDATE_FREQ": str(update_freq), "MAX_TOKENS": str(args.max_tokens),
              "SAVE_INTERVAL_UPDATES": str(interval),
              "UPDATES_PER_EPOCH": str(per_epoch), "TOKENS_PER_UPDATE": str(tokens),
              "WORLD_SIZE": str(workers), "FIRST_NODE": "1" if world.first else "0", "LAUNCH_ID": world.launch_id,
              "TRAIN_LAUNCHER": " ".join(world.command)}
    values["TRAIN_DEVICE_FLAGS"] = " ".join([values["TRAIN_DEVICE_FLAGS"], *world.flags]).strip()
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
            values[f"STAGE{number}_DISK"] = str(3 * checkpoint)
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
    if args.control_stage:
        # the last stage's schedule again from the same start, without what the last stage adds
        print(f"| control stage {args.control_stage}: stage {stages[-1].name}'s schedule from the same start, "
              f"without it: {end} more updates ({end / per_epoch:.2f} epochs), the last {args.average} averaged")
        total += end
        disk += (args.average + 3) * checkpoint
    if len(stages) > 1 or args.baseline_updates:
        line = f"| budget: {total} updates in all ({total / per_epoch:.2f} epochs)"
        if args.baseline_updates:
            line += (f"; the baseline trains {args.baseline_updates} ({args.baseline_updates / per_epoch:.2f} epochs): "
                     f"{total / args.baseline_updates:.2f}x its updates")
        print(line)
    print(f"| disk for checkpoints: about {human_bytes(disk)} ({human_bytes(checkpoint)} each, estimated for "
          f"{parameters(args.arch, vocab, args.model_flags) / 1e6:.1f}M parameters with Adam's state)")
    if args.tokens_per_second:
        for line in time_and_memory(total, int(tgt_sizes.sum()), per_epoch, args.tokens_per_second,
                                    parameters(args.arch, vocab, args.model_flags), args.speed_note):
            print("| " + line)
    values["CHECKPOINT_DISK"] = str(disk)
    values["TOTAL_UPDATES"] = str(total)
    if args.out:
        # checkpoints already there (a resumed run) are replaced or kept, not added
        print("| disk: " + check_space(args.out, disk, bytes_under(args.out, ".pt"), "the checkpoints need",
                                       args.allow_low_disk))
    return values


def small_batch_warning(src_sizes, tgt_sizes, max_tokens: int, workers: int, padded_per_update: float,
                        target: int) -> List[str]:
    """The plan's warning for a batch of fewer than SMALL_BATCH_PER_GPU tokens a GPU (many GPUs
    sharing one update: 512 each at 64 GPUs), with what the same update holds at 4096 a GPU."""
    full = min(MAX_TOKENS_PER_GPU, target)
    full_batches, full_padded = batch_layout(src_sizes, tgt_sizes, full)
    full_gpus = max(1, target // full)
    full_freq = max(1, round(target / (full * full_gpus)))
    full_per_update = full_padded / updates_per_epoch(full_batches, full_gpus, full_freq)
    fewer = max(1, target // SMALL_BATCH_PER_GPU)
    return [f"| warning: {max_tokens} tokens a batch on each of {workers} GPUs, below ~{SMALL_BATCH_PER_GPU}: a step "
            f"computes little against the all-reduce of every gradient, which does not shrink with the batch (expect "
            f"it communication-bound), and an update holds {padded_per_update:.0f} padded tokens on average, "
            f"{padded_per_update / full_per_update - 1:+.1%} from {full_per_update:.0f} with {full}-token batches "
            f"(more updates an epoch, the lr and the update count unchanged)",
            f"|   train on {fewer} GPUs or fewer for the same update with {SMALL_BATCH_PER_GPU} tokens or more a "
            f"GPU, or with a larger update: LARGE_BATCH=1 (WMT recipes: fairseq's scaling_nmt batch, 16x, with its lr; "
            f"see recipes/README.md)"]


def time_and_memory(updates: int, target_tokens: int, per_epoch: int, tokens_per_second: float, params: int,
                    note: str = "") -> List[str]:
    """Lines on how long ``updates`` take at ``tokens_per_second`` target tokens a second
    (fairseq's logged wps, which counts target tokens), and what the GPU holds besides the
    activations: fp32 weights, gradients and Adam's two moments, 16 bytes a parameter."""
    per_update = target_tokens / per_epoch
    seconds = updates * per_update / tokens_per_second
    state = params * 16
    return [f"expected time on one GPU: {updates} updates x ~{per_update:.0f} target tokens an update (this corpus) / "
            f"{tokens_per_second:.0f} target tokens a second = {seconds / 3600:.1f} h"
            + (f" ({note})" if note else " (an assumption, not a measurement: TOKENS_PER_SECOND)"),
            f"memory: {human_bytes(state)} of GPU memory for fp32 weights, gradients and Adam's moments (16 bytes a "
            f"parameter) plus the activations of one batch; the binarized corpus is memory-mapped"]


def length_distribution(path: str, train_below: int, bins: List[int]) -> List[str]:
    """Lines on the token counts of ``path`` (one sentence a line, tokens separated by spaces):
    percentiles, and how many pairs a short-to-long split at ``train_below`` with these ``bins``
    (the extrapolation recipe's TRAIN_BELOW and BINS, the last bin open) trains on and tests."""
    import numpy as np

    with open(path, encoding="utf-8") as f:
        lengths = np.array([len(line.split()) for line in f], dtype=np.int64)
    if not len(lengths):
        raise PlanError(f"{path} is empty")
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


def totals(plans: str, out: str, allow: bool = False) -> List[str]:
    """Lines adding up the plans in ``plans`` (one ``OUT UPDATES DISK`` line per model, as
    recipes/common.sh's plan_training appends them), the disk checked against ``out``'s filesystem.
    A model whose first stage is shared (FLOATER's and RNN's vanilla stage, in one directory keyed
    by its configuration: recipes/floater/protocol.sh) appends ``SHARED_DIR UPDATES DISK`` of that
    stage: its updates and checkpoints count once for every model that names the same directory."""
    rows = [line.split() for line in open(plans, encoding="utf-8") if line.strip()]
    if not rows:
        raise PlanError(f"no plan in {plans}")
    if any(len(r) not in (3, 6) for r in rows):
        raise PlanError(f"{plans}: a line is OUT UPDATES DISK [SHARED_DIR UPDATES DISK]")
    updates = sum(int(r[1]) for r in rows)
    disk = sum(int(r[2]) for r in rows)
    sharing: Dict[str, List[List[str]]] = {}
    for r in rows[:]:
        if len(r) == 6:
            sharing.setdefault(r[3], []).append(r)
    notes = []
    for directory, users in sharing.items():
        # every model after the first that names it: its shared stage is already counted
        updates -= sum(int(r[4]) for r in users[1:])
        disk -= sum(int(r[5]) for r in users[1:])
        if len(users) > 1:
            notes.append(f"{os.path.basename(directory)} ({int(users[0][4])} updates) shared by {len(users)} models, "
                         f"counted once")
    line = f"total for {len(rows)} model(s): {updates} updates, about {human_bytes(disk)} of checkpoints"
    if notes:
        line += "; " + ", ".join(notes)
    return [line, "disk: " + check_space(out, disk, bytes_under(out, ".pt"), "they need", allow)]


def read_progress(path: str):
    """(updates, finished epochs) of a fairseq checkpoint (fairseq_posenc/recipe/stages.py reads it)."""
    if not os.path.isfile(path):
        raise PlanError(f"no checkpoint {path}: has training run?")
    try:
        from . import stages
    except ImportError:  # run as a file: this folder is on sys.path
        import stages

    return stages.read_progress(path)


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
    # before fairseq's import configures the root logger at INFO (fairseq/tasks/text_to_speech.py); not at
    # import: the workflow imports this module into Snakemake's process, whose log it would repeat
    logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
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
    p.add_argument("--control-stage", default="",
                   help="NAME of a control trained like the last stage from the same start (FLOATER's vanilla "
                        "continued): its updates and checkpoints are counted too")
    p.add_argument("--baseline-updates", type=int, default=0,
                   help="the updates of the baseline this plan is compared with (FLOATER: the sinusoidal model's)")
    p.add_argument("--batch-target", type=int, default=TOKENS_PER_UPDATE,
                   help="padded tokens an update to keep at any GPU count (default 32768, the papers'; "
                        "fairseq's IWSLT example: 4096)")
    p.add_argument("--batch-source", default="", help="whose batch --batch-target is, for the plan's lines")
    p.add_argument("--tokens-per-second", type=float, default=0,
                   help="target tokens a second on one GPU (fairseq's wps): the plan then prints the expected time")
    p.add_argument("--speed-note", default="", help="where --tokens-per-second comes from, printed with the time")
    p.add_argument("--allow-batch", action="store_true",
                   help="train even when the chosen batch is more than 5%% from the papers' tokens per update")
    p.add_argument("--update-freq", default="auto", help="batches per update per GPU (auto: ~32768 tokens an update)")
    p.add_argument("--nnodes", default="1", help="NNODES: nodes of a torchrun launch (the recipe runs once on each)")
    p.add_argument("--node-rank", default="0", help="NODE_RANK: this node's place among them (0 writes the logs)")
    p.add_argument("--nproc-per-node", default="auto",
                   help="NPROC_PER_NODE: processes a node (auto: NUM_GPUS / NNODES, or every GPU torch sees; "
                        "1 on the CPU)")
    p.add_argument("--master-addr", default="", help="MASTER_ADDR: the address of node 0, for torchrun")
    p.add_argument("--master-port", default="",
                   help="MASTER_PORT: where the processes meet on the first node (torchrun: 29500; SLURM: "
                        "derived from the job and step ids)")
    p.add_argument("--launch-id", default="",
                   help="LAUNCH_ID: shared by every node of one launch, new for each (SLURM: from the job)")
    p.add_argument("--out", default="", help="where the checkpoints go: its filesystem's free space is checked")
    p.add_argument("--allow-low-disk", action="store_true",
                   help="only say it when the checkpoints need more than the free space of --out's filesystem "
                        "(ALLOW_LOW_DISK=1, and --dry-run)")
    p.add_argument("--gpus", default="auto", help="GPUs fairseq will use (auto: those torch sees)")
    p.add_argument("--device", default="auto", help="auto | gpu | cpu (cpu only when asked for)")
    p.add_argument("--precision", default="--fp16", help="fairseq's precision flags on a GPU (--fp16, --bf16, --amp, ...)")
    p.add_argument("--env-out", help="write the settings as shell assignments here")
    p = sub.add_parser("device", help="print the device line; write the training/decoding flags to --env-out")
    p.add_argument("--gpus", default="auto", help="GPUs fairseq will use (auto: those torch sees)")
    p.add_argument("--device", default="auto", help="auto | gpu | cpu (cpu only when asked for)")
    p.add_argument("--precision", default="--fp16", help="fairseq's precision flags on a GPU")
    p.add_argument("--env-out", help="write the settings as shell assignments here")
    p = sub.add_parser("prepare-space", help="refuse (exit 2) when a corpus's preparation would not fit on its disk")
    p.add_argument("--work", required=True, help="the directory prepare.sh writes (--out)")
    p.add_argument("--recipe", default="", help="the recipe (its archives' text ratio)")
    p.add_argument("--sources", help="the recipe's sources file (which archives the pair reads)")
    p.add_argument("--archives-dir", help="where the archives are")
    p.add_argument("--src", default="", help="source language")
    p.add_argument("--tgt", default="", help="target language")
    p.add_argument("--raw-text", default="", help="the extracted text (WORK/raw): measured instead of estimated")
    p.add_argument("--allow-low-disk", action="store_true", help="only say it when the space is short")
    p = sub.add_parser("totals", help="add up several models' plans (the extrapolation recipe's --dry-run)")
    p.add_argument("--plans", required=True, help="a file of OUT UPDATES DISK lines, one per model")
    p.add_argument("--out", required=True, help="where the models go: its filesystem's free space is checked")
    p.add_argument("--allow-low-disk", action="store_true", help="only say it when the space is short")
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
        elif args.command == "totals":
            for line in totals(args.plans, args.out, args.allow_low_disk):
                print("| " + line)
        elif args.command == "prepare-space":
            archives = []
            if not args.raw_text:
                try:
                    from .wmt_data import archive_path, read_sources
                except ImportError:  # run as a file: this folder is on sys.path
                    from wmt_data import archive_path, read_sources

                corpora = read_sources(args.sources, args.src, args.tgt)[1]
                archives = [archive_path(args.archives_dir, name) for name in sorted({c.archive for c in corpora})]
            print("| disk: " + prepare_space(args.work, args.recipe, archives, args.raw_text, args.allow_low_disk))
        elif args.command == "device":
            values = device_settings(args.device, visible_gpus(args.gpus), args.precision)
            print(f"| device: {values['DEVICE_DESC']}")
        if args.command in ("plan", "device"):
            if args.env_out:
                with open(args.env_out, "w", encoding="utf-8") as f:
                    f.writelines(f"{k}={shlex.quote(v)}\n" for k, v in values.items())
        elif args.command == "check-finished":
            print("| " + check_finished(args.checkpoint, args.max_update, args.max_epoch))
    except PlanError as e:
        parser.exit(3 if args.command == "check-finished" else 2, f"plan.py: error: {e}\n")


if __name__ == "__main__":
    main()


# ------------------------------------------------------------------------------------------------
# the workflow's plan (recipes/rules/train.smk): once per distinct model, then the totals
def model_plan(data_bin: str, config: Dict, arch: str, model_flags: str, average: int, epoch_checkpoints: bool,
               tokens_per_second: Optional[float], gpus: int, keeps_three: bool = False) -> Dict:
    """What one model's training takes, from its resolved fairseq configuration: tokens per
    update, updates per epoch (fairseq's own batches of the binarized training set, where it is
    prepared), where it stops, the checkpoints averaged, disk and GPU-hours."""
    max_tokens = int(config.get("dataset.max_tokens") or 0)
    update_freq = int((config.get("optimization.update_freq") or [1])[0])
    world = int(config.get("distributed_training.distributed_world_size") or 1)
    max_update = config.get("optimization.max_update") or None
    max_epoch = config.get("optimization.max_epoch") or None
    interval = int(config.get("checkpoint.save_interval_updates") or 0)
    lines = [f"tokens per update: {max_tokens} x {world} process(es) x update-freq {update_freq} = "
             f"{max_tokens * world * update_freq} padded tokens at most"]
    out = {"updates": None, "disk": None, "gpu_hours": None, "lines": lines}
    if not glob_train(data_bin):
        budget = " or ".join(x for x in (max_update and f"update {max_update}", max_epoch and f"epoch {max_epoch}") if x)
        lines.append(f"ends at {budget}; updates per epoch, checkpoints and disk once {data_bin} is prepared")
        out["updates"] = max_update if max_update and not max_epoch else None
        return out
    src, tgt = training_pair(data_bin)
    src_sizes, tgt_sizes = dataset_sizes(data_bin, src, tgt)
    batches, padded = batch_layout(src_sizes, tgt_sizes, max_tokens)
    per_epoch = updates_per_epoch(batches, world, update_freq)
    end = stage_end(Stage("train", max_update, max_epoch), per_epoch)
    lines.append(f"training set: {len(src_sizes)} pairs, {batches} batches of --max-tokens {max_tokens}; "
                 f"updates per epoch: {per_epoch}")
    lines.append(f"ends at update {end} ({end / per_epoch:.2f} epochs, "
                 f"{'--max-update' if end == max_update else '--max-epoch'})")
    vocab = dictionary_size(data_bin, src)
    if not same_dictionary(data_bin, src, tgt):
        vocab += dictionary_size(data_bin, tgt)
    size = parameters(arch, vocab, model_flags) * BYTES_PER_PARAM if arch in ARCHS else 0
    if epoch_checkpoints:
        epochs = end // per_epoch
        lines.append(f"averaged: the last {average} of {epochs} epoch checkpoints")
        kept = average + 2
    elif keeps_three:
        lines.append("keeps checkpoint_best.pt, checkpoint_last.pt and its last interval checkpoint (a start)")
        kept = 3
    else:
        saved = interval_checkpoints(end, interval, per_epoch) if interval else []
        averaged = saved[-average:]
        if len(saved) < average:
            lines.append(f"WARNING: {len(saved)} interval checkpoints every {interval} updates: too few to average "
                         f"the last {average}; lower save_interval_updates or evaluate.average, or train longer")
        else:
            lines.append(f"averaged: updates {', '.join(map(str, averaged))} (checkpoints every {interval})")
        kept = average + 3
    out["updates"] = end
    if size:
        out["disk"] = kept * size
        lines.append(f"disk: about {human_bytes(kept * size)} ({human_bytes(size)} a checkpoint with Adam's state)")
    if tokens_per_second:
        seconds = end * (int(tgt_sizes.sum()) / per_epoch) / tokens_per_second
        out["gpu_hours"] = seconds / 3600 * gpus
        lines.append(f"time: {seconds / 3600:.1f} h on {gpus} GPU(s) at {tokens_per_second:g} target tokens a second a "
                     f"GPU ({out['gpu_hours']:.1f} GPU-hours; an assumption: set train.tokens_per_second from "
                     "fairseq's wps)")
    return out


def glob_train(data_bin: str) -> bool:
    import glob

    return bool(glob.glob(os.path.join(data_bin, "train.*-*.*.idx")))


def print_study_plan(study, resolved: Dict[str, tuple], stream=None):
    """The plan of every distinct model of ``study`` (models of one resolved configuration, start
    and teacher counted once: FLOATER's vanilla stage), then the totals, in the dry run."""
    stream = stream or sys.stderr
    seen, totals = {}, {"updates": 0, "disk": 0, "gpu_hours": 0.0}
    unknown = []
    gpus = study.world() if study.train["device"] == "gpu" else 0
    for model in study.models:
        config, config_id = resolved[model.key]
        key = (config_id, model.start, model.teacher)
        if key in seen:
            print(f"| plan {model.key}: the same model as {seen[key]}", file=stream)
            continue
        seen[key] = model.key
        model_flags = " ".join(map(str, study.train.get("model_flags", [])))
        try:
            plan = model_plan(study.data_bin(), config, study.arch, model_flags, study.average(model),
                              study.evaluate["checkpoints"] == "epoch", study.train.get("tokens_per_second"),
                              max(gpus, 1), keeps_three=model.kind == "vanilla")
        except PlanError as e:
            raise PlanError(f"{model.key}: {e}") from None
        print(f"| plan {model.key} (configuration {config_id}):", file=stream)
        for line in plan["lines"]:
            print(f"|   {line}", file=stream)
        for name in totals:
            totals[name] += plan[name] or 0
        if plan["updates"] is None:
            unknown.append(model.key)
    line = f"| plan total: {len(seen)} model(s) to train"
    line += f", {totals['updates']} updates" + (f" and those of {len(unknown)} trained by epochs" if unknown else "")
    if totals["disk"]:
        line += f", about {human_bytes(totals['disk'])} of checkpoints"
    if totals["gpu_hours"]:
        line += f", {totals['gpu_hours']:.1f} GPU-hours"
    print(line, file=stream)
