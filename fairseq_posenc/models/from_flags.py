"""Build a registered fairseq model from command-line flags, without a data directory: for the
tests, the benchmark and notebooks."""
import argparse
from typing import Sequence

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


def build_from_flags(arch: str, flags: Sequence[str], task, max_positions: int = 1024, seed: int = 1):
    """``task`` needs ``source_dictionary`` and ``target_dictionary``."""
    torch.manual_seed(seed)
    args = model_args(arch, flags, max_positions)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task)
