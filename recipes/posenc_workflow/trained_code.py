"""The code a model is trained with (:func:`code_key`): what an edit of fairseq_posenc/ or an
upgrade of fairseq or torch does to it (recipes/README.md, "Reuse")."""
import hashlib
import json
import os
import sys
from importlib import metadata
from typing import Dict, List, Optional

from posenc_workflow.base import ROOT
from posenc_workflow.sources import sources


def code_files(root: str = ROOT, encoding: Optional[str] = None) -> List[str]:
    """The files fairseq's ``--user-dir`` runs to train a model of ``encoding``: what
    ``fairseq_posenc/__init__.py`` imports (at module level or inside a function, the C++
    extension's source included), read from the source (recipes/posenc_workflow/sources.py), never
    from what a process happened to import; less what only the other encodings' schemes run (the
    files of their classes and what only those import), which the registry
    (positions/__init__.py) imports beside this one's. A file of another scheme that this scheme
    imports itself (learned.py imports sinusoidal.py) is its code too. Without ``encoding``: every
    encoding's."""
    init = os.path.join(root, "fairseq_posenc", "__init__.py")
    if encoding is None:
        return list(sources(init, root=root))
    owned = _encoding_files(root)
    schemes = set().union(*owned.values())
    # what the plugin runs besides the schemes, then what this encoding's scheme runs, not
    # following the registry (it imports every scheme) but every other import
    registry = os.path.join(root, "fairseq_posenc", "positions", "__init__.py")
    files = set(sources(init, root=root, stop=schemes))
    files |= set(sources(*owned[encoding], root=root, stop=[registry]))
    return sorted(files)


def _encoding_files(root: str = ROOT) -> Dict[str, set]:
    """encoding -> the files defining the classes of its scheme (its MRO), for every registered one."""
    from fairseq_posenc.positions import POSITION_ENCODINGS  # the plugin's registry: torch, fairseq (seconds)

    owned = {}
    for name, cls in POSITION_ENCODINGS.items():
        owned[name] = set()
        for c in cls.__mro__:
            if c.__module__.startswith("fairseq_posenc."):
                parts = c.__module__.split(".")
                owned[name].add(os.path.join(root, *parts) + ".py")
                if len(parts) > 3:  # a scheme in a package of its own (positions/floater/): the package too
                    owned[name].add(os.path.join(root, *parts[:3], "__init__.py"))
    return owned


def software_versions() -> Dict[str, str]:
    import fairseq  # seconds: imported where asked for, not with the module
    import torch

    return {"fairseq": getattr(fairseq, "__version__", "?"), "torch": torch.__version__,
            "python": ".".join(map(str, sys.version_info[:3])),
            "fairseq_distribution": next((f"{d} {metadata.version(d)}" for d in ("fairseq", "ve-fairseq")
                                          if _has_distribution(d)), "?")}


def _has_distribution(name: str) -> bool:
    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


_CODE_CACHE: Dict[tuple, str] = {}


def code_key(encoding: str, root: str = ROOT) -> str:
    """12 hex digits of what trains a model of ``encoding``: the source of :func:`code_files`
    (a class of another encoding in this one's MRO counts: rnn is trained by FLOATER's package too) and
    the versions of fairseq, torch and Python. An edit of fairseq_posenc/positions/alibi.py
    retrains the alibi models and no other, one of FLOATER's solver the floater and rnn models; an
    edit of the shared model code or an upgrade retrains every model; an edit of a module that
    does not train (labels.py, the recipes) retrains none. ``root``: the checkout (another one, in
    tests)."""
    if (encoding, root) not in _CODE_CACHE:
        digest = hashlib.sha1(json.dumps(software_versions(), sort_keys=True).encode())
        for path in code_files(root, encoding):
            with open(path, "rb") as f:
                digest.update(os.path.relpath(path, root).encode() + b"\0" + f.read())
        _CODE_CACHE[(encoding, root)] = digest.hexdigest()[:12]
    return _CODE_CACHE[(encoding, root)]
