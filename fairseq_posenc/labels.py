"""The label a report gives a model: its encoding's name, and in brackets what differs from that
encoding's published form, e.g. ``alibi (split)``, ``t5 (bias scale 10)``, ``floater (solve
every 10)``; the plain name where nothing does.

Read from the model itself: each scheme's :meth:`~.positions.base.PositionEncoding.form` (its
buffers, extra state and the attributes a loaded checkpoint restores), the segment bias, and the
attention projections' shape for the head size. Never from the command line or the saved
configuration: a split ALiBi run resumed after the default became symmetric keeps split in its
``encoder_form`` buffer while its saved configuration says symmetric, and its rows must say split.

    python -m fairseq_posenc.labels CHECKPOINT   # prints the label of a fairseq checkpoint
"""
import sys
from typing import List

#: the label of a model whose encoding this module does not know (not a transformer_posenc)
UNKNOWN = "?"


def encoding_name(scheme) -> str:
    """The --position-encoding name of a scheme instance (its exact class: rnn subclasses floater)."""
    from .positions import POSITION_ENCODINGS

    for name, cls in POSITION_ENCODINGS.items():
        if type(scheme) is cls:
            return name
    return type(scheme).__name__


def _ordered_union(*lists) -> List[str]:
    seen = []
    for items in lists:
        for item in items:
            if item not in seen:
                seen.append(item)
    return seen


def _head_size(stack) -> List[str]:
    """``head size N`` where the attention heads are not embed dim / heads wide (--attention-head-dim),
    from the projections' shape (what the weights have)."""
    layers = getattr(stack, "layers", None)
    if not layers:
        return []
    attn = layers[0].self_attn
    width, embed_dim = attn.q_proj.weight.shape
    if width == embed_dim:
        return []
    return [f"head size {width // attn.num_heads}"]


def model_forms(model) -> List[str]:
    """What differs from the published form of the model's encoding, each item once: the schemes'
    forms (one side's alone prefixed with its side where both sides differ, differently), the
    segment attention and its forms, a head size that is not embed dim / heads."""
    encoder, decoder = model.encoder, model.decoder
    enc = list(encoder.position_encoding.form())
    dec = list(decoder.position_encoding.form())
    only_enc = [f for f in enc if f not in dec]
    only_dec = [f for f in dec if f not in enc]
    if only_enc and only_dec:  # the two stacks differ in different ways: say which is which
        forms = [f for f in enc if f in dec] + [f"encoder {f}" for f in only_enc] + [f"decoder {f}" for f in only_dec]
    else:
        forms = _ordered_union(enc, dec)
    segment = getattr(encoder, "segment_bias", None)
    if segment is not None:
        forms = _ordered_union(forms, ["segment attention"], segment.form())
    return _ordered_union(forms, _head_size(encoder), _head_size(decoder))


def model_label(model) -> str:
    """``NAME`` or ``NAME (form, form)`` for a transformer_posenc model (see the module doc)."""
    scheme = getattr(getattr(model, "encoder", None), "position_encoding", None)
    if scheme is None:
        return UNKNOWN
    forms = model_forms(model)
    name = encoding_name(scheme)
    return f"{name} ({', '.join(forms)})" if forms else name


def checkpoint_label(path: str) -> str:
    """:func:`model_label` of the model a fairseq checkpoint holds, built and loaded as fairseq
    loads it (its saved configuration builds the model, then its state is loaded into it)."""
    import fairseq_posenc  # noqa: F401  (registers the plugin, the torch load allow-list)
    from fairseq import checkpoint_utils

    models, _ = checkpoint_utils.load_model_ensemble([path])
    return model_label(models[0])


def main(argv=None):
    import argparse
    import logging

    logging.basicConfig(level=logging.ERROR)
    parser = argparse.ArgumentParser(description="Print the report label of fairseq checkpoints, one a line.")
    parser.add_argument("checkpoints", nargs="+")
    args = parser.parse_args(argv)
    for path in args.checkpoints:
        print(checkpoint_label(path))


if __name__ == "__main__":
    sys.exit(main())
