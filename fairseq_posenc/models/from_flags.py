"""Build a registered fairseq model from command-line flags, without a data directory: for the
tests, the benchmark and notebooks."""
import argparse
from typing import List, Sequence

import torch
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY


def model_args(arch: str, flags: Sequence[str], max_positions: int = 1024) -> argparse.Namespace:
    """The namespace ``fairseq-train --arch ARCH FLAGS`` would give the model."""
    # as fairseq: unset model flags are absent, so that architectures fill in their defaults
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    ARCH_MODEL_REGISTRY[arch].add_args(parser)
    args = parser.parse_args([str(f) for f in flags])
    args.arch = arch
    args.max_source_positions = args.max_target_positions = max_positions
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def build_from_flags(arch: str, flags: Sequence[str], task, max_positions: int = 1024, seed: int = 1,
                     from_checkpoint: bool = False):
    """``task`` needs ``source_dictionary`` and ``target_dictionary``; ``from_checkpoint``: built as
    from a checkpoint's saved configuration (:func:`.config.as_saved`), as a decode does."""
    from .config import as_saved

    torch.manual_seed(seed)
    args = model_args(arch, flags, max_positions)
    if from_checkpoint:
        as_saved(args)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task)


#: named model sizes shared by the demo, the benchmark and the tests: layers per stack, d, ffn, heads
MODEL_SIZES = {
    "tiny": (2, 64, 128, 4),
    "small": (2, 128, 256, 4),
    "medium": (3, 256, 1024, 4),
    "base": (6, 512, 2048, 8),
}


def size_flags(size: str) -> List[str]:
    """fairseq flags for a named size, the same in encoder and decoder."""
    layers, dim, ffn, heads = (str(v) for v in MODEL_SIZES[size])
    flags = []
    for side in ("encoder", "decoder"):
        flags += [f"--{side}-layers", layers, f"--{side}-embed-dim", dim,
                  f"--{side}-ffn-embed-dim", ffn, f"--{side}-attention-heads", heads]
    return flags
