"""Everything fairseq needs to run on this stack (Python 3.11, torch >= 2.6), in one place.

Applied once when the plugin is imported, which fairseq's CLI does (``--user-dir``) before it
touches a checkpoint. Each fix has a test in ``tests/test_compat.py`` that fails without it.
"""
import argparse
import builtins
import collections
import typing

import numpy as np
import torch

_applied = False


def _checkpoint_globals():
    """The classes fairseq pickles into checkpoints, and nothing else.

    torch >= 2.6 loads with ``weights_only=True`` by default and refuses any class not on its
    allow-list. fairseq stores its config as an ``argparse.Namespace`` (legacy models) or as
    omegaconf containers (older checkpoints), and metric values as numpy scalars. Allow-listing
    these keeps torch's safe unpickler on for everything else, unlike
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` or ``weights_only=False``.
    """
    from omegaconf import DictConfig, ListConfig
    from omegaconf.base import ContainerMetadata, Metadata
    from omegaconf.nodes import AnyNode

    numpy_dtypes = [type(np.dtype(t)) for t in (np.float64, np.float32, np.int64, np.int32, np.bool_)]
    return [
        argparse.Namespace,
        DictConfig,
        ListConfig,
        ContainerMetadata,
        Metadata,
        AnyNode,
        typing.Any,
        builtins.dict,
        builtins.list,
        builtins.int,
        collections.defaultdict,
        np._core.multiarray.scalar,
        np.dtype,
        *numpy_dtypes,
    ]


def allow_fairseq_checkpoints():
    torch.serialization.add_safe_globals(_checkpoint_globals())


def apply():
    """Apply every fix; safe to call more than once."""
    global _applied
    if _applied:
        return
    allow_fairseq_checkpoints()
    _applied = True
