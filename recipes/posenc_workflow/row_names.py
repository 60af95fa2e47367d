"""A report's row names: each model's label (fairseq_posenc/labels.py: its encoding and how that
differs from the published form) and, in the same brackets, every other option of its training
configuration in which it differs from the study's other rows, e.g. ``sinusoidal (--encoder-layers
3)`` beside ``sinusoidal``, ``alibi (split, --dropout 0.2)``.

The options are read from each checkpoint's stored configuration, never from how a row was asked
for: the fields that name a model (recipes/posenc_workflow/train_config.py ``hashed_fields``: the
resolved configuration less paths, logging, devices and the budget, the batch as its tokens per
update), less the plugin's position options and fairseq's input position embedding, which the label speaks
for, and the architecture's name, which the label's encoding and the fields it sets say. An option is named in the rows whose
value differs from the most common one among the rows (the earliest row's where several are as
common), so that a study's common setting is named nowhere.
"""
import argparse
import collections
import json
from typing import Any, Dict, List

# fairseq's own input position embedding: the encoding decides it, so the label names it
from posenc_workflow.train_config import DECIDED as INPUT_POSITIONS

ARCH_NAMES = ("model.arch", "model._name")


def stored_config(path: str) -> Dict[str, Any]:
    """``section.field -> value`` of a fairseq checkpoint's stored configuration, as
    train_config.resolve flattens one (its tensors memory-mapped, not read)."""
    import torch

    import fairseq_posenc  # noqa: F401  (torch's loader allow-list for fairseq's checkpoints)

    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except RuntimeError:  # a legacy (non-zip) file cannot be memory-mapped
        state = torch.load(path, map_location="cpu", weights_only=False)
    cfg = state.get("cfg")
    if cfg is None:
        raise ValueError(f"{path}: no stored configuration (cfg): not a checkpoint of fairseq >= 0.10")
    flat: Dict[str, Any] = {}
    for section, value in (cfg.items() if isinstance(cfg, dict) else ((k, cfg[k]) for k in cfg)):
        if isinstance(value, argparse.Namespace):
            value = vars(value)
        elif hasattr(value, "items"):
            value = dict(value.items())
        if isinstance(value, dict):
            flat.update({f"{section}.{name}": field for name, field in value.items()})
        else:
            flat[section] = value
    return json.loads(json.dumps(flat, default=repr))


def _position_options() -> set:
    """The options the plugin adds to fairseq's Transformer: what a label names."""
    from fairseq_posenc.models.transformer_posenc import PosencTransformerModel

    def dests(model):
        parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
        model.add_args(parser)
        return {action.dest for action in parser._actions}

    return dests(PosencTransformerModel) - dests(PosencTransformerModel.__bases__[0])


def training_options(config: Dict[str, Any]) -> Dict[str, Any]:
    """The fields of a stored configuration that can make two rows two models, less the label's."""
    from posenc_workflow.train_config import hashed_fields

    position = _position_options() | set(INPUT_POSITIONS)
    return {key: value for key, value in hashed_fields(config).items()
            if key not in ARCH_NAMES and key.rpartition(".")[2] not in position}


def describe(key: str, value: Any) -> str:
    """``--encoder-layers 3``, ``--share-all-embeddings``, ``no --share-all-embeddings``."""
    if "." not in key:  # computed, not an option: tokens_per_update
        return f"{key.replace('_', ' ')} {value}"
    flag = "--" + key.rpartition(".")[2].replace("_", "-")
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if value is True:
        return flag
    if value is False:
        return f"no {flag}"
    from fairseq_posenc.labels import number

    return f"{flag} {number(value)}" if isinstance(value, float) else f"{flag} {value}"


def row_names(labels: List[str], options: List[Dict[str, Any]]) -> List[str]:
    """Each row's label with the options (:func:`training_options`) in which it differs from the
    rows' most common value, in the label's brackets."""
    extra: List[List[str]] = [[] for _ in labels]
    for key in sorted(set().union(*options)) if options else ():
        values = [json.dumps(o.get(key), sort_keys=True) for o in options]
        if len(set(values)) < 2:
            continue
        counts = collections.Counter(values)
        common = max(values, key=lambda v: (counts[v], -values.index(v)))
        for i, value in enumerate(values):
            if value != common:
                extra[i].append(describe(key, options[i].get(key)))
    names = []
    for label, items in zip(labels, extra):
        if not items:
            names.append(label)
        elif label.endswith(")") and " (" in label:
            names.append(f"{label[:-1]}, {', '.join(items)})")
        else:
            names.append(f"{label} ({', '.join(items)})")
    return names
