#!/usr/bin/env python
"""The arithmetic of a study's plan, worked out before the GPU-days and printed by recipes/Snakefile
once per distinct model, with the totals of those that train (:func:`print_study_plan`): tokens per
update, updates per epoch, where training stops, the checkpoints averaged, disk, and GPU-hours or
hours on the CPU, with how many CPU trainings run at once.

    # exit 2 (one line) if a corpus's preparation would not fit on the disk of --work (the extract
    # and gather rules run it before they write the text)
    python recipes/posenc_workflow/plan.py prepare-space --work data/x --recipe wmt14_en_de --sources S \\
        --archives-dir data/archives --src en --tgt de      # or --raw-text data/x/raw (or a files corpus's files)

Tokens per update: every process takes its own batches of --max-tokens and --update-freq of them
make an update, so one update holds about max_tokens x world x update_freq tokens. With both auto
(:func:`batch_for`) that is kept within 0.1% of 32768 padded tokens (8 x 4096, the ~25k source +
25k target tokens of Vaswani et al.) at any world size; train.batch_target sets another target:
IWSLT'14 trains at fairseq's example's 4096; train.large_batch at 16x 32768 (fairseq's
examples/scaling_nmt big batches).

Updates per epoch: the batches fairseq-train makes of the binarized training set (the .idx
sizes, sorted and cut by fairseq's own batch_by_size at --max-tokens), shared by the GPUs,
grouped by update_freq.

Checkpoints: every save_interval_updates updates (auto: 1250 for base, 600 for big: about 10
minutes of Vaswani et al.'s 8-P100 steps, 0.43 s base / 1.0 s big, rounded to divide 100k and
300k updates), the last N kept and averaged. A checkpoint due exactly at an epoch's end is written
as an epoch checkpoint instead, and a run ending between two intervals leaves its last updates
out of the average: both are counted, and too few checkpoints to average is said.
"""
import argparse
import glob
import json
import logging
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional

from posenc_workflow import cluster, train_config
from posenc_workflow.corpus import Corpus
from posenc_workflow.trained_code import code_key
from posenc_workflow.wmt_data import archive_path, read_sources


# Vaswani et al.'s own speed, the GPU-hours' default (train.tokens_per_second auto): ~25k target
# tokens an update (of 8 x 4096 padded tokens) on 8 P100s, base 100k updates in 12 hours, big 300k
# in 3.5 days: about 7,200 and 3,100 target tokens a second a GPU. A newer GPU, fp16 and fairseq's
# speed-ups go faster: set train.tokens_per_second from fairseq's wps in train.log
PAPER_TOKENS_PER_SECOND = {"base": 100000 * 25000 / (12 * 3600 * 8), "big": 300000 * 25000 / (3.5 * 86400 * 8)}
# and fairseq's IWSLT model (files.yaml's, iwslt14_de_en.yaml's) on one GPU: an assumption
GPU_TOKENS_PER_SECOND = {**PAPER_TOKENS_PER_SECOND, "iwslt": 25000}
# A CPU's speed (train.tokens_per_second auto with train.device cpu): the floating-point operations
# a second of one thread of fairseq-train, about 6 a parameter a target token (forward and backward),
# measured on files.yaml's IWSLT model (transformer_iwslt_de_en, 31,596,544 parameters with a 104-row
# dictionary, --max-tokens 4096, fp32, OMP_NUM_THREADS=1) on one core of an x86 server (AVX-512):
# updates 3-7 held 18,945 target tokens in 51.6 s of user and system time (updates 1-7 less 1-2):
# 367 target tokens a CPU-second, about 70 GFLOP/s. A model's speed is that over 6 x its
# parameters, times train.threads (which torch's threads reach less than in full)
CPU_FLOPS_PER_THREAD = 6 * 31_596_544 * 367
# narrower models run below that rate (small matrices, the per-layer work beside them):
# iwslt14_cpu.yaml's small model (128 wide) measured at about 40% of it; no speed is assumed there
CPU_AUTO_WIDTH = 512
# target tokens in an update of padded tokens (Vaswani et al.: ~25k in 8 x 4096), where the
# corpus is not prepared yet to count them
TARGET_SHARE = 25000 / 32768
TOKENS_PER_UPDATE = 8 * 4096
# a checkpoint holds the weights (4 bytes each in fp32, 2 under --fp16) and Adam's two fp32
# moments: 12 bytes a parameter is the upper bound
BYTES_PER_PARAM = 12


class PlanError(Exception):
    """A plan that cannot work: the message is the one line the user sees."""


@dataclass
class Stage:
    name: str
    max_update: Optional[int]
    max_epoch: Optional[int]


def update_freq_for(max_tokens: int, gpus: int, target: int = TOKENS_PER_UPDATE) -> int:
    """Batches summed per update so that max_tokens x GPUs x update_freq is nearest ``target``."""
    return max(1, round(target / (max_tokens * max(gpus, 1))))


BATCH_TOLERANCE = 0.05  # tokens per update within 5% of the target, or the plan says why not
MAX_TOKENS_PER_GPU = 4096  # the papers' batch per GPU (fits fp16 base and big on 16 GB)
# below this a GPU's batch is small against what every step exchanges (the all-reduce of every
# gradient, the same size whatever the batch), and whole sentences fill its cap less: the plan warns



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
def training_pair(data_bin: str):
    """(src, tgt) of the binarized training set in ``data_bin`` (train.SRC-TGT.SRC.idx)."""
    for path in sorted(glob.glob(os.path.join(data_bin, "train.*-*.*.idx"))):
        pair, lang = os.path.basename(path).split(".")[1:3]
        src, _, tgt = pair.partition("-")
        if lang == src:
            return src, tgt
    raise PlanError(f"no binarized training set in {data_bin} (train.SRC-TGT.SRC.idx): prepare the corpus first (its binarize rule)")


def dataset_sizes(data_bin: str, src: str, tgt: str):
    """The token counts (with </s>) of every training pair, from the binarized .idx files."""
    # numpy and fairseq (seconds): where a prepared corpus is measured, not in prepare-space's process
    import numpy as np
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    if not (src and tgt):
        src, tgt = training_pair(data_bin)
    sizes = []
    for lang in (src, tgt):
        prefix = os.path.join(data_bin, f"train.{src}-{tgt}.{lang}")
        if not os.path.isfile(prefix + ".idx"):
            raise PlanError(f"no binarized training set {prefix}.idx: prepare the corpus first (its binarize rule)")
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
    # numpy, fairseq and the plugin (seconds): where a prepared corpus is measured
    import numpy as np
    from fairseq.data import data_utils

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


def parameters(config: Dict, vocab: int) -> int:
    """Parameters of the post-LN Transformer of a resolved configuration (its sizes: the
    architecture's defaults and the study's flags applied), ``vocab`` embedding rows (the
    position encodings' own few parameters left out): an estimate for the disk figures."""
    def size(side, name):
        return int(config[f"model.{side}_{name}"])

    total = vocab * size("encoder", "embed_dim")
    for side, attentions in (("encoder", 1), ("decoder", 2)):
        d, ffn = size(side, "embed_dim"), size(side, "ffn_embed_dim")
        attention = 4 * d * d + 4 * d
        layer = attentions * attention + 2 * d * ffn + ffn + d + (attentions + 1) * 2 * d
        total += size(side, "layers") * layer
    return total


def same_dictionary(data_bin: str, src: str, tgt: str) -> bool:
    paths = [os.path.join(data_bin, f"dict.{lang}.txt") for lang in (src, tgt)]
    if not all(os.path.isfile(p) for p in paths):
        return True
    return open(paths[0], "rb").read() == open(paths[1], "rb").read()


def dictionary_size(data_bin: str, src: str) -> int:
    path = os.path.join(data_bin, f"dict.{src}.txt")
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f) + 4  # <s>, <pad>, </s>, <unk>


# Disk. The preparation keeps about 7-9x the extracted text: raw/, tok/, split/, bpe/ (a segmented
# copy), the cleaned train/valid/test and train.tok.* beside them, and data-bin/ (measured on
# tests/helpers/toy_archives.py's miniature archives, 3,600 pairs: 7.1x with subword-nmt merging every word
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
            raise PlanError(f"{line}: free some, use another directory, or pass --allow-low-disk to go on")
        line += ": short (a run stops here without --allow-low-disk)"
    return line


def prepare_space(work: str, recipe: str, archives: List[str] = (), raw_text=(), allow: bool = False) -> str:
    """The disk a prepared corpus takes, from the extracted text once it is there (``raw_text``:
    its directory or files), else estimated from the archives' size."""
    if isinstance(raw_text, str):
        raw_text = [raw_text] if raw_text else []
    if raw_text:
        raw = sum(bytes_under(path) for path in raw_text)
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


def main(argv: Optional[List[str]] = None):
    # before fairseq's import configures the root logger at INFO (fairseq/tasks/text_to_speech.py); not at
    # import: the workflow imports this module into Snakemake's process, whose log it would repeat
    logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare-space", help="refuse (exit 2) when a corpus's preparation would not fit on its disk")
    p.add_argument("--work", required=True, help="the corpus's directory (corpus.data)")
    p.add_argument("--recipe", default="", help="the corpus (its archives' text ratio)")
    p.add_argument("--sources", help="the corpus's sources file (which archives the pair reads)")
    p.add_argument("--archives-dir", help="where the archives are")
    p.add_argument("--src", default="", help="source language")
    p.add_argument("--tgt", default="", help="target language")
    p.add_argument("--raw-text", nargs="+", default=[], help="the extracted text (WORK/raw) or a files corpus's "
                   "files: measured instead of estimated")
    p.add_argument("--allow-low-disk", action="store_true", help="only say it when the space is short")
    args = parser.parse_args(argv)
    try:
        archives = []
        if not args.raw_text:
            corpora = read_sources(args.sources, args.src, args.tgt)[1]
            archives = [archive_path(args.archives_dir, name) for name in sorted({c.archive for c in corpora})]
        print("| disk: " + prepare_space(args.work, args.recipe, archives, args.raw_text, args.allow_low_disk))
    except PlanError as e:
        parser.exit(2, f"plan.py: error: {e}\n")



# ------------------------------------------------------------------------------------------------
# the workflow's plan (recipes/rules/train.smk): once per distinct model, then the totals
@dataclass
class CorpusEstimate:
    """What a corpus holds before it is prepared (its published size): for the plan of a first dry run."""
    pairs: int
    target_tokens_per_pair: float
    vocab: int  # embedding rows: the joint dictionary, or both of two
    source: str  # where the pair count comes from
    counted: bool = False  # counted in the corpus's own files (pairs and words), not published

    def describe(self) -> str:
        if self.counted:
            return (f"{self.pairs:,} training pairs ({self.source}) of {self.target_tokens_per_pair:.1f} target "
                    f"tokens, a word a subword (BPE adds some), {self.vocab:,} embedding rows; exact once the corpus "
                    "is prepared")
        return (f"an estimate: {self.pairs:,} pairs ({self.source}) of ~{self.target_tokens_per_pair:g} target "
                f"subwords, {self.vocab:,} embedding rows; exact once the corpus is prepared")


def duration(hours: float, gpu: bool = False) -> str:
    """``1.7 h``; under an hour ``45 min`` (``0.0 h`` said nothing), or ``under a minute``
    (``gpu``: GPU-hours, GPU-minutes)."""
    hour, minute, least = ("GPU-hours", "GPU-minutes", "a GPU-minute") if gpu else ("h", "min", "a minute")
    minutes = round(hours * 60)
    if minutes >= 60:
        return f"{hours:.1f} {hour}"
    return f"{minutes} {minute[:-1] if gpu and minutes == 1 else minute}" if minutes else f"under {least}"


def cpu_tokens_per_second(config: Dict, vocab: int, threads: int = 1) -> Optional[float]:
    """train.tokens_per_second auto on a CPU: :data:`CPU_FLOPS_PER_THREAD` x threads over 6 x the
    model's parameters; None for a model narrower than :data:`CPU_AUTO_WIDTH`."""
    if min(int(config[f"model.{side}_embed_dim"]) for side in ("encoder", "decoder")) < CPU_AUTO_WIDTH:
        return None
    return CPU_FLOPS_PER_THREAD * max(threads, 1) / (6 * parameters(config, vocab))


def model_plan(data_bin: str, config: Dict, average: int, epoch_checkpoints: bool,
               tokens_per_second, keeps_three: bool = False,
               estimate: Optional[CorpusEstimate] = None, cpu: bool = False, threads: int = 1,
               stale: str = "") -> Dict:
    """What one model's training takes, from its resolved fairseq configuration: tokens per
    update, updates per epoch (fairseq's own batches of the binarized training set, where it is
    prepared; else, or where ``stale`` says why it is prepared again, ``estimate``), where it stops,
    the checkpoints averaged, disk and GPU-hours (``cpu``: hours on the CPU, ``tokens_per_second``
    being the CPU's, "auto": :func:`cpu_tokens_per_second` of ``threads``)."""
    max_tokens = int(config.get("dataset.max_tokens") or 0)
    update_freq = int((config.get("optimization.update_freq") or [1])[0])
    world = int(config.get("distributed_training.distributed_world_size") or 1)
    max_update = config.get("optimization.max_update") or None
    max_epoch = config.get("optimization.max_epoch") or None
    interval = int(config.get("checkpoint.save_interval_updates") or 0)
    per_update = max_tokens * world * update_freq
    lines = [f"tokens per update: {max_tokens} x {world} process(es) x update-freq {update_freq} = "
             f"{per_update} padded tokens at most"]
    out = {"updates": None, "disk": None, "gpu_hours": None, "lines": lines}
    guess = ""
    again = f"prepared again: {stale}" if stale else ""
    if glob_train(data_bin) and not (stale and estimate):
        src, tgt = training_pair(data_bin)
        src_sizes, tgt_sizes = dataset_sizes(data_bin, src, tgt)
        batches, padded = batch_layout(src_sizes, tgt_sizes, max_tokens)
        per_epoch = updates_per_epoch(batches, world, update_freq)
        target_per_update = int(tgt_sizes.sum()) / per_epoch
        lines.append(f"training set: {len(src_sizes)} pairs, {batches} batches of --max-tokens {max_tokens}; "
                     f"updates per epoch: {per_epoch}" + (f" (the previous preparation's; {again})" if stale else ""))
        vocab = dictionary_size(data_bin, src) + (0 if same_dictionary(data_bin, src, tgt)
                                                  else dictionary_size(data_bin, tgt))
    elif estimate:
        target_per_update = per_update * TARGET_SHARE
        per_epoch = max(1, round(estimate.pairs * estimate.target_tokens_per_pair / target_per_update))
        vocab, guess = estimate.vocab, f" ({again + '; ' if again else ''}{estimate.describe()})"
        lines.append(f"updates per epoch: ~{per_epoch}{guess}")
        out["estimated"] = True
    else:
        budget = " or ".join(x for x in (max_update and f"update {max_update}", max_epoch and f"epoch {max_epoch}") if x)
        lines.append(f"ends at {budget}; updates per epoch, checkpoints and disk once {data_bin} is prepared")
        out["updates"] = max_update if max_update and not max_epoch else None
        return out
    end = stage_end(Stage("train", max_update, max_epoch), per_epoch)
    lines.append(f"ends at update {end} ({end / per_epoch:.2f} epochs, "
                 f"{'--max-update' if end == max_update else '--max-epoch'}){' (estimated)' if guess else ''}")
    size = parameters(config, vocab) * BYTES_PER_PARAM
    if epoch_checkpoints:
        lines.append(f"averaged: the last {average} of {end // per_epoch} epoch checkpoints")
        kept = average + 2
    elif keeps_three:
        lines.append("keeps checkpoint_best.pt, checkpoint_last.pt and its last interval checkpoint (a start)")
        kept = 3
    else:
        saved = interval_checkpoints(end, interval, per_epoch) if interval else []
        if len(saved) < average:
            lines.append(f"WARNING: {len(saved)} interval checkpoints every {interval} updates: too few to average "
                         f"the last {average}; lower save_interval_updates or evaluate.average, or train longer")
        else:
            lines.append(f"averaged: updates {', '.join(map(str, saved[-average:]))} (checkpoints every {interval})")
        kept = average + 3
    out["updates"] = end
    out["disk"] = kept * size
    lines.append(f"disk: about {human_bytes(kept * size)} ({human_bytes(size)} a checkpoint with Adam's state)"
                 + (" (estimated)" if guess else ""))
    if cpu:
        auto = tokens_per_second == "auto"
        rate = cpu_tokens_per_second(config, vocab, threads) if auto else tokens_per_second
        if rate:
            out["cpu_hours"] = end * target_per_update / rate / 3600
            how = (f"auto: {threads} thread(s) at {CPU_FLOPS_PER_THREAD / 1e9:.0f} GFLOP/s, as measured on an x86 "
                   f"server, over 6 x {parameters(config, vocab):,} parameters" if auto else "train.tokens_per_second")
            lines.append(f"time: {duration(out['cpu_hours'])} on the CPU at {rate:,.0f} target tokens a second ({how}; "
                         "set train.tokens_per_second from fairseq's wps in train.log on your CPU)"
                         + (" (estimated)" if guess else ""))
        else:
            lines.append("time on the CPU: unknown" + (f" (auto assumes no speed for a model under {CPU_AUTO_WIDTH} wide)"
                                                       if auto else "")
                         + "; set train.tokens_per_second from fairseq's wps (train.log)")
    elif tokens_per_second:
        # tokens_per_second is a GPU's: the updates' target tokens over it are GPU-seconds, shared by the world
        gpu_hours = end * target_per_update / tokens_per_second / 3600
        out["gpu_hours"] = gpu_hours
        lines.append(f"time: {duration(gpu_hours / world)} on {world} GPU(s) at {tokens_per_second:,.0f} target tokens "
                     f"a second a GPU ({duration(gpu_hours, gpu=True)}; an assumption: set train.tokens_per_second from "
                     f"fairseq's wps){' (estimated)' if guess else ''}")
    return out


def glob_train(data_bin: str) -> bool:
    return bool(glob.glob(os.path.join(data_bin, "train.*-*.*.idx")))


def print_study_plan(study, resolved: Dict[str, tuple], same: Dict[str, object], stream=None,
                     cores: Optional[int] = None, jobs: Optional[int] = None, launch: Optional[dict] = None):
    """The plan of every distinct model of ``study``, then the totals of those to train, in the dry
    run. ``same``: model key -> the earlier model it is (recipes/rules/train.smk's ``_same_as``: one
    checkpoint directory, trained once), planned with that one. ``cores``: Snakemake's --cores,
    where the jobs run here; ``jobs``: its --jobs, where a profile or executor runs them;
    ``launch``: recipes/posenc_workflow/cluster.py's launch_settings (a profile or executor, retries)."""

    launch = launch or {"remote": False, "retries": 0}
    stream = stream or sys.stderr
    totals = {"updates": 0, "disk": 0, "gpu_hours": 0.0, "cpu_hours": 0.0}
    cpu = study.train["device"] == "cpu"
    # Snakemake gives a job at most --cores threads
    threads = min(int(study.train["threads"]), cores or int(study.train["threads"]))
    unknown, estimated, hours = [], False, []
    estimate = study.corpus_estimate()
    stale = stale_data(study)
    states = training_states(study, resolved, same, stale)
    for model in study.models:
        config, config_id = resolved[model.key]
        if model.key in same:
            print(f"| plan {model.key}: the same model as {same[model.key].key}, trained once (its job waits for "
                  "that one's and finds its checkpoints)", file=stream)
            continue
        try:
            plan = model_plan(study.data_bin(), config, study.average(model), study.evaluate["checkpoints"] == "epoch",
                              study.tokens_per_second(model), keeps_three=model.kind == "vanilla", estimate=estimate,
                              cpu=cpu, threads=threads, stale=stale)
        except PlanError as e:
            raise PlanError(f"{model.key}: {e}") from None
        to_train, lines = states[model.key]
        print(f"| plan {model.key} (configuration {config_id}):", file=stream)
        for line in plan["lines"] + lines:
            print(f"|   {line}", file=stream)
        if launch["remote"] and to_train and not cpu and plan.get("gpu_hours"):
            warning = cluster.time_warning(study, model.key, plan["gpu_hours"] / study.world(), launch["retries"])
            if warning:
                print(warning, file=stream)
        if not to_train:
            continue
        for name in totals:
            totals[name] += plan.get(name) or 0
        hours.append(plan.get("cpu_hours") or 0)
        estimated |= bool(plan.get("estimated"))
        if plan["updates"] is None:
            unknown.append(model.key)
    distinct = len(study.models) - len(same)
    count = sum(to_train for to_train, _ in states.values())
    line = f"| plan total: {distinct} model(s), {count or 'nothing'} to train"
    line += f" ({distinct - count} trained)" if count < distinct else ""
    if count:
        line += f", {totals['updates']} updates" + (f" and those of {len(unknown)} trained by epochs" if unknown else "")
    if totals["disk"]:
        line += f", about {human_bytes(totals['disk'])} of checkpoints"
    if totals["gpu_hours"]:
        line += f", {duration(totals['gpu_hours'], gpu=True)}"
    if totals["cpu_hours"]:
        line += f", {duration(totals['cpu_hours'])} on the CPU, " + cpu_schedule(hours, threads, cores, jobs)
    if estimated and (totals["disk"] or totals["gpu_hours"] or totals["cpu_hours"]):
        line += " (estimated before the corpus is prepared)"
    print(line, file=stream)
    if launch["remote"] and cluster.account_note(study):
        print(cluster.account_note(study), file=stream)
    if study.train["device"] == "gpu" and not launch["remote"] and not local_gpus():
        print("| plan: no GPU on this machine: the trainings and decodes run through a profile or executor "
              "(--profile recipes/profiles/slurm); run here they are refused (train.device: cpu runs them on the CPU)",
              file=stream)


def local_gpus(resources: Optional[dict] = None) -> int:
    """The GPUs of the jobs Snakemake runs here: recipes/run.sh's ``--resources gpus=N`` where
    ``resources`` (Snakemake's global resources) hold it, else counted as run.sh counts them
    (CUDA_VISIBLE_DEVICES where set, else ``nvidia-smi -L``)."""
    if resources and "gpus" in resources:
        return int(getattr(resources["gpus"], "value", resources["gpus"]))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU") for line in listed.splitlines())


def cpu_schedule(hours: List[float], threads: int, cores: Optional[int], jobs: Optional[int]) -> str:
    """How the CPU trainings of ``hours`` each run: Snakemake starts as many at once as --cores
    holds jobs of ``threads``, or as --jobs says where it is given (a profile or executor, or -j
    here: --cores then limits nothing), each next one on the first slot free (a warm start or
    student waits for its start or teacher: later, not counted)."""
    how = ", ".join(([f"--jobs {jobs}"] if jobs else [f"--cores {cores}"] if cores else [])
                    + [f"{threads} thread(s) each"])
    at_once = min(len(hours), jobs or max(1, (cores or 1) // max(threads, 1)))
    if len(hours) == 1:
        return f"one training ({how})"
    if at_once == 1:
        return f"one model after another ({how})"
    slots = [0.0] * at_once
    for h in sorted(hours, reverse=True):
        slots[slots.index(min(slots))] += h
    return f"{at_once} at a time ({how}): about {duration(max(slots))} from the first start"


def stale_data(study) -> str:
    """Why the study's prepared training data (its data-bin) is prepared again before anything
    trains, as Snakemake will find: '' where it is not prepared, or will not be. An input of the
    corpus newer than it (a files corpus's files, a shipped corpus's sources file and archives),
    other preparation settings than DATA/prepared.json's, or a split made before its corpus or with
    another split.train_below or split.unit. Edited scripts are left out: Snakemake prepares again
    only where their content changed, which their times do not say."""
    if study.facts["style"] == "toy":
        return ""
    corpus_bin = os.path.join(study.data, "data-bin")
    prepared = _oldest(corpus_bin)
    if prepared is None:
        return ""
    corpus = Corpus(study)
    inputs = corpus.own_files() if study.facts["style"] == "files" else [corpus.sources, *corpus.archive_paths()]
    newer = [path for path in inputs if os.path.isfile(path) and os.path.getmtime(path) > prepared]
    if newer:
        return f"{', '.join(newer)} newer than {corpus_bin}"
    record = corpus.prepared_record()
    changed = corpus.preparation_changes(record, "{ours} (prepared with {theirs})") if record is not None else ""
    if changed:
        return changed
    if not study.split:
        return ""
    split_bin = study.data_bin()
    made = _oldest(split_bin)
    if made is None:
        return ""
    if _newest(corpus_bin) > made:
        return f"{corpus_bin} newer than the split's {split_bin}"
    try:
        with open(os.path.join(os.path.dirname(split_bin), "text", "split.json"), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return ""
    changed = [f"split.{k} {study.split[k]} (split with {manifest[k]})" for k in ("train_below", "unit")
               if k in manifest and manifest[k] != study.split[k]]
    return ", ".join(changed)


def _train_files(data_bin: str) -> List[str]:
    return glob.glob(os.path.join(data_bin, "train.*-*.*.idx")) + glob.glob(os.path.join(data_bin, "train.*-*.*.bin"))


def _oldest(data_bin: str) -> Optional[float]:
    files = _train_files(data_bin)
    return min(map(os.path.getmtime, files)) if files else None


def _newest(data_bin: str) -> float:
    return max(map(os.path.getmtime, _train_files(data_bin)), default=0.0)


def training_states(study, resolved: Dict[str, tuple], same: Dict[str, object], stale: str) -> Dict[str, tuple]:
    """model key -> (whether it trains, the plan's lines on why or why not), for each distinct model:
    it trains where its record (trained.json) is missing, names another configuration or code, its
    data is prepared again (``stale``) or is newer than the record, or its start or teacher trains or
    is newer than the record."""
    states = {}
    for model in study.models:
        if model.key in same:
            continue
        config, config_id = resolved[model.key]
        path = os.path.join(study.model_dir(model), "trained.json")
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
            recorded = "keyed" in record
        except (OSError, ValueError, TypeError):
            recorded = False
        if not recorded:
            states[model.key] = (True, [])
            continue
        lines = changes_since_trained(study, model, config, config_id)
        # the budget is no part of the configuration's hash: a longer one goes on in its directory
        was, now = record.get("budget") or {}, dict(zip(("max_update", "max_epoch"), train_config.budget(config)))
        if [was.get(k) for k in now] != list(now.values()):
            lines.append(f"trains again: its budget changed since {path}: "
                         + "; ".join(f"{k}: {was.get(k)} -> {v}" for k, v in now.items() if was.get(k) != v))
        if stale:
            lines.append(f"trains again: its data is prepared again ({stale})")
        elif _newest(study.data_bin()) > os.path.getmtime(path):
            lines.append(f"trains again: {study.data_bin()} is newer than {path}")
        # the inputs recipes/rules/train.smk gives it: a start's record, a teacher's average
        for name, file in ((model.start, "trained.json"), (model.teacher, "averaged.pt")):
            before = name and os.path.join(study.model_dir(study.model(name, model.seed)), file)
            if before and os.path.exists(before) and os.path.getmtime(before) > os.path.getmtime(path):
                lines.append(f"trains again: {before} is newer than {path}")
        states[model.key] = (bool(lines), lines)
    for _ in states:  # a chain of starts: at most as long as the models
        for model in study.models:
            for role, name in (("start", model.start), ("teacher", model.teacher)):
                if model.key not in states or states[model.key][0] or not name:
                    continue
                other = study.model(name, model.seed)
                other = same.get(other.key, other)
                if states[other.key][0]:
                    states[model.key] = (True, [f"trains again: its {role} {other.key} trains"])
    return {model.key: (states[model.key][0], states[model.key][1] if states[model.key][0] else [
        f"trained: {os.path.join(study.model_dir(model), 'trained.json')}, with its configuration, code and data as "
        "they are: not in the total"]) for model in study.models if model.key in states}


def changes_since_trained(study, model, config: Dict, config_id: str) -> List[str]:
    """What makes ``model`` train again where its record (trained.json) names another model: each
    changed field of fairseq's resolved configuration with its old and new value
    (train_config.differences of the recorded command's), and the code."""
    path = os.path.join(study.model_dir(model), "trained.json")
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        keyed = record["keyed"]
    except (OSError, ValueError, KeyError):
        return []
    lines = []
    if keyed.get("config") != config_id:
        command = record["command"]
        if command and os.path.basename(command[0]) == "fairseq-train":  # the program, then its arguments
            command = command[1:]
        try:
            changed = train_config.differences(train_config.resolve(command, cache=train_config.config_cache()), config)
        except (KeyError, ValueError) as error:
            changed = [f"its recorded command no longer resolves ({error})"]
        lines.append(f"trains again, its configuration changed since {path}: {'; '.join(changed) or '?'}")
    if keyed.get("code") != code_key(model.encoding):
        lines.append(f"trains again: the code that trains {model.encoding} changed since {path}")
    return lines


if __name__ == "__main__":
    main()
