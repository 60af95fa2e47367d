"""Bounds of option values past which a computation of the model overflows float32 (issue 53):
each derived from float32's range and the computation it guards, one function per bound, for the
option's declared values (:mod:`.values`, ``Values(low=...)``)."""
import torch

FLOAT32 = torch.finfo(torch.float32)
#: fairseq's transformer default of --max-source-positions and --max-target-positions
DEFAULT_POSITIONS = 1024


def _sides(args):
    """(head size, positions) of the encoder's and the decoder's attention, as the model is built
    (models/transformer_stacks.py's _head_dim)."""
    given = getattr(args, "attention_head_dim", None)
    for side in ("encoder", "decoder"):
        heads = getattr(args, f"{side}_attention_heads", None) or 8
        width = getattr(args, f"{side}_embed_dim", None) or 512
        positions = getattr(args, f"max_{'source' if side == 'encoder' else 'target'}_positions", None)
        yield (given or width // heads), (positions or DEFAULT_POSITIONS)


def rope_theta_low(args) -> float:
    """The smallest --rope-theta whose RoPE angles are finite in float32 (rope.py's rope_angles):
    angle = p theta^(-2i/d), largest at the last position p = P - 1 and the largest exponent,
    2i/d = (d - 2)/d, so (P - 1) theta^(-(d - 2)/d) <= max32, i.e. theta >= ((P - 1) / max32)^(d / (d - 2)),
    with max32 lowered by 4 roundings of float32 (the power's and the product's, at most 2 ulp
    each) so that the computed angle stays finite; at least float32's smallest normal number, so
    that theta itself keeps its precision in float32. Head size 2: every angle is p theta^0 = p."""
    bound = float(FLOAT32.tiny)
    for head_dim, positions in _sides(args):
        if head_dim > 2 and positions > 1:
            largest = float(FLOAT32.max) / (1 + 4 * float(FLOAT32.eps))
            bound = max(bound, ((positions - 1) / largest) ** (head_dim / (head_dim - 2)))
    return bound
