"""Tolerances for comparing floats, derived from the computation instead of measured once.

torch picks its vector kernels by CPU (``ATEN_CPU_CAPABILITY`` = default, avx2, avx512) and
splits work by thread count, so the same sum of float32 terms is added in another order on
another machine and rounds differently. A tolerance that was one measurement times a margin
fails there; one that follows from what is summed does not.

The bound: a float operation rounds its result by at most u = eps / 2 of its size. A sum of
``terms`` terms (a dot product: one multiplication and one addition per term) makes at most
2 x terms roundings, each at most u x ``magnitude`` when ``magnitude`` bounds the values it passes
through (its terms, partial sums and result), so one evaluation is within terms x eps x magnitude
of the exact sum, and two evaluations in different orders (``sides=2``, the default) within twice
that of each other. Against a float64 reference only the float32 side rounds: ``sides=1``.
Along a chain of sums (the layers of a network) the terms of the sums add up, as long as each
step passes on an error about the size it received (layer norms and softmax do; see
:func:`transformer_terms`).

Exact equality (``torch.equal``) is right where both sides are the same operations on the same
data (a cached table against the one it was built from, a view against a slice): the tests
that use it say why.

Usage::

    from helpers.tolerances import assert_within, float32_tolerance

    # q . k over a head of 64: 64 terms; its terms and partial sums stay below 16
    assert_within(got, want, float32_tolerance(terms=64, magnitude=16), "attention logits")

``assert_within`` compares with ``atol`` only (the derivation already holds the magnitude) and,
when ``NUMERICS_LOG`` names a file, appends the largest difference and the tolerance to it, which
``make test-numerics`` summarises (``python tests/helpers/tolerances.py LOG [how many]``).
"""
import json
import os
import sys

import torch

EPS32 = torch.finfo(torch.float32).eps  # 2**-23 = 1.19e-7
EPS64 = torch.finfo(torch.float64).eps  # 2**-52 = 2.22e-16


def float32_tolerance(terms, magnitude, sides=2):
    """|a - b| bound for float32 results of a sum of ``terms`` terms on values up to ``magnitude``
    (``sides`` = how many of a and b were computed in float32: 2, or 1 against float64)."""
    return sides * terms * EPS32 * float(magnitude)


def float64_tolerance(terms, magnitude, sides=2):
    """The same bound for float64 results."""
    return sides * terms * EPS64 * float(magnitude)


def transformer_terms(model, source_len, target_len):
    """The terms along the chain of sums from the tokens to a log-probability of a fairseq
    encoder-decoder transformer, counted from its modules.

    Per attention block: the input projection (d terms), the attention logit (head size, and as
    many again for a position term added to it: Shaw's q . a^K, DIET's P_Q . P_K), the softmax's
    normaliser and the weighted sum of the values (one term per key each, and once more for a
    position term on the values, Shaw's a^V), the output projection (attention width) and the
    layer norm after it (2d: mean and variance). Per feed-forward block: fc1 (d), fc2 (ffn width)
    and a layer norm (2d). Then the output projection (d) and the log-softmax (one term per word).
    The encoder's layers come first (the decoder attends to their output), then the decoder's.
    """
    def attention(attn, keys):
        dim, width = attn.q_proj.in_features, attn.q_proj.out_features
        head = width // attn.num_heads
        return dim + 2 * head + 3 * keys + width + 2 * dim

    def feed_forward(layer):
        return layer.fc1.in_features + layer.fc1.out_features + 2 * layer.fc1.in_features

    terms = 0
    for layer in model.encoder.layers:
        terms += attention(layer.self_attn, source_len) + feed_forward(layer)
    for layer in model.decoder.layers:
        terms += attention(layer.self_attn, target_len) + feed_forward(layer)
        if getattr(layer, "encoder_attn", None) is not None:
            terms += attention(layer.encoder_attn, source_len)
    output = model.decoder.output_projection
    return terms + output.in_features + output.out_features


def encoder_terms(model, source_len):
    """:func:`transformer_terms` up to the encoder's output."""
    terms = 0
    for layer in model.encoder.layers:
        attn = layer.self_attn
        dim, width = attn.q_proj.in_features, attn.q_proj.out_features
        terms += dim + 2 * (width // attn.num_heads) + 3 * source_len + width + 2 * dim
        terms += layer.fc1.in_features + layer.fc1.out_features + 2 * layer.fc1.in_features
    return terms


def magnitude(*tensors, floor=0.0):
    """The largest |value| among ``tensors``, and at least ``floor`` (1 for a network's outputs:
    its layer-normed activations are of size 1 whatever its outputs are)."""
    return max([floor] + [t.detach().abs().max().item() for t in tensors if t.numel()])


def assert_within(actual, expected, atol, msg=None):
    """``torch.testing.assert_close`` with ``atol`` only; the largest difference is logged."""
    diff = (actual.detach().double() - expected.detach().double()).abs()
    largest = diff.max().item() if diff.numel() else 0.0
    log = os.environ.get("NUMERICS_LOG")
    if log:
        record = {"test": os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0], "what": msg or "",
                  "difference": largest, "tolerance": float(atol),
                  "capability": os.environ.get("ATEN_CPU_CAPABILITY", ""),
                  "threads": os.environ.get("OMP_NUM_THREADS", "")}
        with open(log, "a") as f:
            f.write(json.dumps(record) + "\n")
    torch.testing.assert_close(actual, expected, atol=float(atol), rtol=0, msg=msg)


def summarise(log, top=None):
    """Per test and comparison: the largest difference over the runs logged, its tolerance and
    the ratio (the ``top`` tightest first, or all)."""
    worst = {}
    with open(log) as f:
        for line in f:
            r = json.loads(line)
            key = (r["test"], r["what"])
            if r["tolerance"]:
                ratio = r["difference"] / r["tolerance"]
            else:  # an exact comparison
                ratio = float("inf") if r["difference"] else 0.0
            if key not in worst or ratio > worst[key][2]:
                worst[key] = (r["difference"], r["tolerance"], ratio)
    rows = sorted(worst.items(), key=lambda kv: -kv[1][2])[:top]
    print(f"{'difference':>11} {'tolerance':>11} {'ratio':>7}  test [comparison]")
    for (test, what), (difference, tolerance, ratio) in rows:
        print(f"{difference:11.3e} {tolerance:11.3e} {ratio:7.4f}  {test}" + (f" [{what}]" if what else ""))


def solution_tolerance(ode, positions: int, expected) -> float:
    """float32_tolerance for a solution over ``positions`` computed twice by the same code (in a
    fairseq process and in the test), counted as test_floater_solver.solve_terms counts: each
    evaluation of the step adds its rounding to the state carried along the positions (rk4: 4
    evaluations a step and dt / step steps a position; the RNN: each layer once a position), and
    within one evaluation a value passes through dot products over the width (h: two layers)."""
    if hasattr(ode, "layers"):  # the RNN
        carried, within = positions * len(ode.layers), len(ode.layers) * (ode.initial.size(1) + 1)
    else:
        carried = 4 * round(ode.dt / ode.step) * positions
        within = ode.dynamics.fc1.in_features + ode.dynamics.fc1.out_features
    return float32_tolerance(carried + within, magnitude(expected))


if __name__ == "__main__":
    summarise(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
