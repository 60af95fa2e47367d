"""A model's label as the reports name it: its encoding and each option in which it differs from
that encoding's published form (fairseq_posenc/labels.py reads it from a checkpoint). In the models
layer, so that what loads a checkpoint (checkpoint_settings) can name a model without a circle."""
import dataclasses
import math
from typing import Dict, List

#: the label of a model whose encoding this module does not know (not a transformer_posenc)
UNKNOWN = "?"

#: options that are not named in a label, and why
UNLABELLED = {
    "position_encoding": "the label's name itself",
    "floater_adjoint": "the adjoint method computes the same gradient (to rounding) in less memory and more time",
}


def encoding_name(scheme) -> str:
    """The --position-encoding name of a scheme instance (its exact class: rnn subclasses floater)."""
    from ..positions import POSITION_ENCODINGS

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


def _same(value, published, carried: bool) -> bool:
    """A value given is the published one only if equal; one the weights carry (a float64 sum over
    averaged checkpoints) also where it differs by that sum's rounding."""
    if carried and (isinstance(value, float) or isinstance(published, float)):
        return published is not None and math.isclose(float(value), float(published), rel_tol=1e-12)
    return value == published


def number(value: float) -> str:
    """The shortest text that reads back as ``value`` (``repr``), a whole number without its
    ``.0``: two different values never print alike (``{:g}`` printed 1000000 and 1000001 both as
    1e+06)."""
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def describe(field: dataclasses.Field, value) -> str:
    """One option as a label names it: its field's short name (``metadata["label"]``, ``{}`` the
    value), else its flag, ``--name value`` (a switch: ``--name``)."""
    text = number(value) if isinstance(value, float) else str(value)
    short = field.metadata.get("label")
    if short is not None:
        return short.format(text)
    flag = "--" + field.name.replace("_", "-")
    return flag if value is True else f"{flag} {text}"


def differing(fields, given: Dict[str, object], published: Dict[str, object], carried: Dict[str, object]) -> List[str]:
    """The options among ``fields`` whose value (``carried`` over ``given``; None: the published
    one) differs from the published one (``published``, else the field's default), described."""
    items = []
    for f in fields:
        if f.name.startswith("_") or f.name in UNLABELLED:
            continue
        value = carried.get(f.name, given.get(f.name, f.default))
        if value is None or _same(value, published.get(f.name, f.default), f.name in carried):
            continue
        items.append(describe(f, value))
    return items


def scheme_items(scheme) -> List[str]:
    """What differs from the published form in one position module's own options."""
    fields = dataclasses.fields(scheme.config) if scheme.config else ()
    return differing(fields, scheme.options, scheme.published_options(), scheme.carried_options())


def _head_size(stack):
    """The head size where the attention heads are not embed dim / heads wide
    (--attention-head-dim), from the projections' shape (what the weights have); else None."""
    layers = getattr(stack, "layers", None)
    if not layers:
        return None
    attn = layers[0].self_attn
    width, embed_dim = attn.q_proj.weight.shape
    return None if width == embed_dim else width // attn.num_heads


def stack_items(model, stack) -> List[str]:
    """What differs from the published form in one stack: its encoding's options, the general
    position flags (the head size read from the weights) and, in the encoder, the segment bias."""
    from .config import PosencConfig

    segment = getattr(stack, "segment_bias", None)
    carried = {"attention_head_dim": _head_size(stack), "segment_attention": segment is not None}
    general = differing(dataclasses.fields(PosencConfig), vars(model.args) if hasattr(model, "args") else {}, {},
                        carried)
    return scheme_items(stack.position_encoding) + general + (scheme_items(segment) if segment is not None else [])


def model_forms(model) -> List[str]:
    """What differs from the published form of the model's encoding, each item once (one side's
    alone prefixed with its side where both sides differ, differently)."""
    enc, dec = stack_items(model, model.encoder), stack_items(model, model.decoder)
    only_enc = [f for f in enc if f not in dec]
    only_dec = [f for f in dec if f not in enc]
    if only_enc and only_dec:  # the two stacks differ in different ways: say which is which
        return [f for f in enc if f in dec] + [f"encoder {f}" for f in only_enc] + [f"decoder {f}" for f in only_dec]
    return _ordered_union(enc, dec)


def model_label(model) -> str:
    """``NAME`` or ``NAME (form, form)`` for a transformer_posenc model (see the module doc)."""
    scheme = getattr(getattr(model, "encoder", None), "position_encoding", None)
    if scheme is None:
        return UNKNOWN
    forms = model_forms(model)
    name = encoding_name(scheme)
    return f"{name} ({', '.join(forms)})" if forms else name
