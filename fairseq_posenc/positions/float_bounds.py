"""Bounds of option values past which a computation of the model overflows float32:
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


def floater_lr_scale_low(args) -> float:
    """The smallest --floater-lr-scale C: float32's smallest normal number, 2^-126. FLOATER stores
    h's weights and the initial states as V = W / C and uses W = C V, in float32 (floater/dynamics.py,
    ode.py). Below the normal range C itself loses its precision in float32, down to 0 (1e-300: V =
    W / 0 = inf, then NaN); from 2^-126 up, |V| <= |W| 2^126 stays below max32 = 2^128 (1 - 2^-24)
    for h's weights (nn.Linear's initialisation: |W| <= 1) and for the initial states (0.02 z, a
    normal draw of |z| < 200)."""
    return float(FLOAT32.tiny)
