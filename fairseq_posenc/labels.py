"""The label a report gives a model: its encoding's name, and in brackets every option that differs
from that encoding's published form, e.g. ``alibi (split)``, ``shaw (--max-relative-distance 4)``,
``floater (warm start, solve every 10)``; the plain name where nothing does.

Derived, not written per encoding: the options are the fields of the encoding's ``config`` (and of
the segment bias's with ``--segment-attention``) and the general position flags
(:class:`~.models.config.PosencConfig`), each with the value the model was built with
(``PositionEncoding.options``: a checkpoint's saved configuration, or the command line), except
where the weights carry their own (``carried_options``: ALiBi's encoder form, the bias scale,
FLOATER's N, C and warm start, the head size), which a resumed or re-configured run cannot change.
An option is named where its value differs from the published one (the field's default, or what
the scheme makes of a default of None: ``published_options``), by its flag (``--rope-theta
500``) or by the short name its field declares (``metadata["label"]``: ``split``, ``solve every
10``). A new option is labelled without anyone adding it here; :data:`UNLABELLED` lists the options
that cannot change the trained model, each with the reason.

    python -m fairseq_posenc.labels CHECKPOINT...   # the label of each fairseq checkpoint

A checkpoint is labelled from its own contents (its saved configuration and weights), without the
data it was trained on: a label never falls back to a name given on a command line.
"""
import dataclasses
import math
import sys
from typing import Dict, List

from .models.label import (  # noqa: F401  (the label's parts, as the reports and tests name them)
    UNKNOWN, UNLABELLED, encoding_name, number, describe, differing, scheme_items, stack_items, model_forms, model_label)


class LabelError(ValueError):
    """A checkpoint whose label cannot be read."""


def _dictionary(size: int):
    """A fairseq dictionary of ``size`` entries (the model's embedding tables fix its size)."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    while len(dictionary) < size:
        dictionary.add_symbol(f"<{len(dictionary)}>")
    return dictionary


def checkpoint_model(path: str):
    """The model a fairseq checkpoint of transformer_posenc holds, built from its saved
    configuration and loaded with its weights as fairseq would (never refused for a flag,
    :func:`~.models.config.load_checkpoints_as_saved`), without its data: the dictionaries are
    stand-ins of the sizes of its embedding tables."""
    import torch

    import fairseq_posenc  # noqa: F401  (registers the plugin, the torch load allow-list)
    from fairseq.models import ARCH_MODEL_REGISTRY

    from .models.config import as_saved
    from .models.transformer_posenc import PosencTransformerModel

    state = torch.load(path, map_location="cpu")
    args = state["cfg"]["model"] if state.get("cfg") is not None else state["args"]
    arch = getattr(args, "arch", None)
    if not issubclass(ARCH_MODEL_REGISTRY.get(arch, object), PosencTransformerModel):
        raise LabelError(f"its model is --arch {arch}, not one of transformer_posenc's architectures")
    weights = state["model"]

    class Task:
        source_dictionary = _dictionary(weights["encoder.embed_tokens.weight"].size(0))
        target_dictionary = _dictionary(weights["decoder.embed_tokens.weight"].size(0))

    model = ARCH_MODEL_REGISTRY[args.arch].build_model(as_saved(args), Task())
    model.load_state_dict(weights, strict=True)
    return model


def checkpoint_label(path: str) -> str:
    """:func:`model_label` of the model a fairseq checkpoint holds (:func:`checkpoint_model`);
    :class:`LabelError` naming the file where it cannot be read."""
    try:
        return model_label(checkpoint_model(path))
    except LabelError as error:
        raise LabelError(f"{path}: no label: {error}") from None
    except Exception as error:  # noqa: BLE001  (any reason, one line naming the file)
        raise LabelError(f"{path}: no label: {type(error).__name__}: {' '.join(str(error).split())}") from error


def main(argv=None):
    import argparse
    import logging

    logging.basicConfig(level=logging.ERROR)
    parser = argparse.ArgumentParser(description="Print the report label of fairseq checkpoints, one a line.")
    parser.add_argument("checkpoints", nargs="+")
    args = parser.parse_args(argv)
    for path in args.checkpoints:
        try:
            print(checkpoint_label(path))
        except LabelError as error:
            parser.exit(2, f"{parser.prog}: error: {error}\n")


if __name__ == "__main__":
    sys.exit(main())
