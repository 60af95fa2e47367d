"""Bounds of option values past which the model is meaningless, cannot be built, or a computation of
it overflows float32: each derived from the model's sizes, the machine's memory or
float32's range and the computation it guards, one function per bound, for the option's declared
values (:mod:`.values`, ``Values(low=..., high=...)``). The model's sizes are those its architecture
set (``set_defaults`` checks after it); fairseq's transformer defaults where a namespace lacks them."""
import math
import os
from typing import Optional, Tuple

import torch

FLOAT32 = torch.finfo(torch.float32)
#: fairseq's transformer defaults: --max-source/target-positions, embed dim, heads, layers
DEFAULT_POSITIONS, DEFAULT_WIDTH, DEFAULT_HEADS, DEFAULT_LAYERS = 1024, 512, 8, 6
#: the largest |z| of a standard normal draw of torch's generators: Box-Muller on uniforms of at most
#: 64 bits (u >= 2^-64), |z| <= sqrt(-2 ln 2^-64) = 9.42
NORMAL_DRAW_MAX = math.sqrt(2 * 64 * math.log(2))


def _sides(args):
    """(head size, positions, heads, width, layers) of the encoder's and the decoder's attention, as
    the model is built (models/transformer_stacks.py's _head_dim)."""
    given = getattr(args, "attention_head_dim", None)
    for side in ("encoder", "decoder"):
        heads = getattr(args, f"{side}_attention_heads", None) or DEFAULT_HEADS
        width = getattr(args, f"{side}_embed_dim", None) or DEFAULT_WIDTH
        positions = getattr(args, f"max_{'source' if side == 'encoder' else 'target'}_positions", None)
        layers = getattr(args, f"{side}_layers", None) or DEFAULT_LAYERS
        yield (given or width // heads), (positions or DEFAULT_POSITIONS), heads, width, layers


def longest_positions(args) -> int:
    """The larger of --max-source-positions and --max-target-positions (fairseq's default where the
    namespace lacks them: a flag checked as fairseq parses it, before the task's options are read)."""
    return max(positions for _, positions, *_ in _sides(args))


def _largest_finite(roundings: int) -> float:
    """float32's largest number lowered by ``roundings`` float32 roundings (at most 1 ulp each), so
    that a result computed within them stays finite."""
    return float(FLOAT32.max) / (1 + roundings * float(FLOAT32.eps))


def rope_theta_low(args) -> float:
    """The smallest --rope-theta whose RoPE angles are finite in float32 (rope.py's rope_angles):
    angle = p theta^(-2i/d), largest at the last position p = P - 1 and the largest exponent,
    2i/d = (d - 2)/d, so (P - 1) theta^(-(d - 2)/d) <= max32, i.e. theta >= ((P - 1) / max32)^(d / (d - 2)),
    with max32 lowered by 4 roundings of float32 (the power's and the product's, at most 2 ulp
    each) so that the computed angle stays finite; at least float32's smallest normal number, so
    that theta itself keeps its precision in float32. Head size 2: every angle is p theta^0 = p."""
    bound = float(FLOAT32.tiny)
    for head_dim, positions, *_ in _sides(args):
        if head_dim > 2 and positions > 1:
            largest = _largest_finite(4)
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


def max_relative_distance_high(args) -> int:
    """The largest --max-relative-distance K that clips anything: no two of the model's P positions
    (the larger of --max-source-positions and --max-target-positions; K is the encoder's and the
    decoder's) are more than P - 1 apart, and a larger K only adds 2 (K - P + 1) table rows no
    offset reads (1e12 tried to allocate 64 TB)."""
    return longest_positions(args) - 1


def physical_memory() -> int:
    """This machine's memory in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def attention_head_dim_high(args) -> Optional[int]:
    """The largest --attention-head-dim N whose attention projections fit in this machine's memory.
    fairseq builds the model in the process's memory, in float32 (on the CPU, before moving it to
    a device): every attention has 4 projections of width x (heads x N) weights (q, k, v and the
    output), the encoder's layers one attention each, the decoder's two (self and cross). Those
    weights alone must fit in the machine's physical memory: a necessary bound, not a sufficient one
    (the rest of the model, the optimizer's state), so only a model that cannot be built is refused.
    Machine memory unknown: no bound."""
    memory = physical_memory()
    if memory <= 0:
        return None
    per_unit = sum(4 * width * heads * layers * (1 if side == 0 else 2)
                   for side, (_, _, heads, width, layers) in enumerate(_sides(args)))
    return max(1, memory // (per_unit * torch.tensor([], dtype=torch.float32).element_size()))


def position_bias_scale_stds(args) -> Tuple[float, ...]:
    """The standard deviations of the initialisations of the parameters --position-bias-scale scales
    in the model ``args`` describes: its encoding's (its ``initial_stds``), per side. The segment
    bias of --segment-attention starts at 0 (``SegmentBias.initial_stds`` is empty): no bound."""
    from .base import REGISTERED

    scheme = REGISTERED.get(getattr(args, "position_encoding", None))
    stds = getattr(scheme, "initial_stds", None)  # a scheme of ScaledBiases (bias_scale.py)
    return tuple(std for head_dim, *_ in _sides(args) for std in (stds(args, head_dim) if stds else ()))


def position_bias_scale_range(stds) -> Tuple[float, float]:
    """(lowest, highest) --position-bias-scale S for scaled parameters initialised N(0, std^2) for
    each of ``stds`` (bias_scale.py: stored as w = init / S, used as S w, in float32): S itself a
    normal float32 number (1e-300 is 0 in float32 and w = init / 0 infinite; 1e300 is inf), the
    largest initial draw, std x 9.42 / S (:data:`NORMAL_DRAW_MAX`), finite, and the initialisation's
    scale std / S a normal float32 number, else w keeps fewer bits of it, down to 0 (1e300: S w =
    0 x inf = NaN). ``stds`` empty (a bias initialised at 0): S's own range."""
    low, high = float(FLOAT32.tiny), float(FLOAT32.max)
    for std in stds:
        low = max(low, std * NORMAL_DRAW_MAX / _largest_finite(2))
        high = min(high, std / float(FLOAT32.tiny))
    return low, high


def floater_solved_positions(positions: int) -> int:
    """The most positions FLOATER's ODE solves for inputs of up to ``positions``: a training forward
    the input's, a decode's kept solution at least MIN_TABLE and grown by doubling past the length
    it needs (floater/ode.py's ``positions``): from s < L <= P to max(L, 2 s) <= 2 (P - 1)."""
    from .base import MIN_TABLE

    return max(MIN_TABLE, positions, 2 * (positions - 1))


def floater_dt_range(args) -> Tuple[float, float]:
    """(lowest, highest) --floater-dt: dt a normal float32 number (1e-300 is 0 in float32: every
    time 0 and the count of solver steps NaN), and the times of FLOATER's positions, i x dt, finite
    in float32 up to the last position solved (:func:`floater_solved_positions` of the larger of
    --max-source-positions and --max-target-positions), with 2 roundings (dt's to float32 and the
    product's; 1e300 is inf, and time 0 x inf is NaN). The solver's steps lie between those times.
    What this does not bound: how large the solution grows with the time, which h's learned
    weights decide (--floater-dissipation bounds it)."""
    positions = longest_positions(args)
    return float(FLOAT32.tiny), _largest_finite(2) / max(1, floater_solved_positions(positions) - 1)


def floater_step_range(args) -> Tuple[float, float]:
    """(lowest, highest) --floater-step s of the fixed-step solvers: the solver's grid (solver.py's
    ``step_grid``, torchdiffeq's) holds span / s + 1 times over the span (P - 1) dt of the positions
    solved, and the solve keeps a state of the model's width per step: at least 4 (1 + width) bytes a
    step, which must fit in this machine's memory (1e-300: 0 in float32, a grid of inf steps); the
    grid's times, up to s past the span, finite in float32 (1e300: inf). Machine memory unknown: s
    a normal float32 number."""
    dt = getattr(args, "floater_dt", None) or 0.1
    positions = longest_positions(args)
    width = max(width for _, _, _, width, _ in _sides(args))
    span = (floater_solved_positions(positions) - 1) * dt
    steps = physical_memory() // (4 * (1 + width))
    low = max(float(FLOAT32.tiny), span / steps) if steps > 0 else float(FLOAT32.tiny)
    return low, _largest_finite(2) - span

#: ln of float32's smallest normal number (-ln 2^-126): xPos's factors stay normal numbers within it
_LOG_TINY = 126 * math.log(2)


def _usable(value, published: float) -> float:
    """``value`` where it is a positive finite number, else the published one (its own check refuses it)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    return float(value) if ok else published


def _xpos_span(args) -> int:
    """The largest position xPos scales (P - 1 of the longer side)."""
    return longest_positions(args) - 1


def xpos_scale_base_low(args) -> float:
    """The smallest --xpos-scale-base B whose factors zeta_i^(+-p/B) (xpos.py) are normal float32
    numbers up to the last position p = P - 1: the smallest zeta, gamma / (1 + gamma) (i = 0), gives the
    largest exponent, (P - 1) / B x ln((1 + gamma) / gamma) <= 126 ln 2. At a gamma that is not usable
    (refused by its own check) the published 0.4, so that each refusal names the flag to change."""
    gamma = _usable(getattr(args, "xpos_gamma", None), 0.4)
    if gamma <= xpos_gamma_low(args):  # gamma's own check, after this one, refuses it: B is not to blame
        gamma = 0.4
    return _xpos_span(args) * math.log((1 + gamma) / gamma) / _LOG_TINY


def xpos_gamma_low(args) -> float:
    """The smallest --xpos-gamma with the same factors normal: ln((1 + gamma) / gamma) <=
    126 ln 2 x B / (P - 1), i.e. gamma >= 1 / (exp(126 ln 2 x B / (P - 1)) - 1) (B = --xpos-scale-base)."""
    base = _usable(getattr(args, "xpos_scale_base", None), 512.0)
    exponent = _LOG_TINY * base / max(1, _xpos_span(args))
    return 0.0 if exponent > 700 else 1 / math.expm1(exponent)
