"""Shaw's key and value terms (a gather and a scatter over 2k + 1 offsets) equal the equations
written out with a table entry per (query, key) pair, values and gradients, wherever the queries
sit among the keys."""
import argparse
import copy

import pytest
import torch

from fairseq_posenc.modules import PositionalAttention
from fairseq_posenc.positions import AttentionPositions
from fairseq_posenc.positions.shaw import ShawRelative
from helpers.tolerances import assert_within, float32_tolerance, float64_tolerance, magnitude


def shaw(k, heads=2, head_dim=4, layers=2):
    cfg = argparse.Namespace(max_relative_distance=k, max_source_positions=64, max_target_positions=64)
    return ShawRelative(cfg, "encoder", layers, heads, head_dim).double()


def reference_terms(scheme, layer, q, probs, pos):
    """a^K_ij and a^V_ij looked up for every pair: the key bias and value term of Shaw et al."""
    k = scheme.max_distance
    index = (pos.k_frame[None, :] - pos.q_frame[:, None]).clamp(-k, k) + k  # (T, S)
    bias = torch.einsum("bhid,ijd->bhij", q, scheme.rel_k[layer][index]) * scheme.head_dim**-0.5
    value = torch.einsum("bhij,ijd->bhid", probs, scheme.rel_v[layer][index])
    return bias, value


def positions(t, s, left_pads):
    mask = None
    if left_pads is not None:
        mask = torch.arange(s)[None, :] < torch.tensor(left_pads)[:, None]
    return AttentionPositions.build(t, s, mask, "cpu")


def grads(outputs, inputs, seed, dtype=None):
    """Gradients of sum(w * output), w random (drawn in ``dtype``, then cast to the output's)."""
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(o.shape, generator=g, dtype=dtype or o.dtype).to(o.dtype) for o in outputs]
    return torch.autograd.grad(outputs, inputs, weights)


def largest_pool(pos, k):
    """The most (query, key) pairs that share one clipped offset: the longest sum of a pooled
    probability, and of a^K's and a^V's gradients (the edge offsets pool every pair beyond k)."""
    index = (pos.k_frame[None, :] - pos.q_frame[:, None]).clamp(-k, k) + k
    return torch.bincount(index.flatten()).max().item()


def term_counts(batch, heads, t, s, k, head_dim):
    """How many terms each compared tensor sums, counted on the longer of the two ways:
    (bias, value, grad q, grad probs, grad a^K, grad a^V). The scheme gathers q . a^K over the
    2k + 1 offsets (head dim terms), pools the probabilities per offset (up to s terms) before
    a sum over the 2k + 1 offsets, and the gradients of the tables sum over every (batch, head,
    query, key) pair of an offset; the equations sum over the keys and the head dim."""
    offsets = 2 * k + 1
    pairs = batch * heads * largest_pool(positions(t, s, None), k)
    return (head_dim + 1, s + offsets, s + offsets, head_dim, pairs, pairs)


CASES = [
    (6, 6, 2, None),  # k inside the length: clipped edges on both sides
    (7, 7, 3, [0, 3, 6]),  # left-padded batch: offsets follow the frame
    (1, 9, 2, None),  # an incremental decoding step: one query, the last of 9 keys
    (1, 9, 3, [2, 0, 5]),
    (1, 1, 4, None),  # the first decoding step
    (5, 5, 16, None),  # k beyond the length: no clipping
    (1, 6, 16, None),
    (3, 10, 2, None),  # a few queries at the end of longer keys
    (33, 33, 16, None),
]


@pytest.mark.numerics
@pytest.mark.parametrize("t, s, k, left_pads", CASES)
def test_terms_equal_the_equations_per_pair_and_their_gradients(t, s, k, left_pads):
    torch.manual_seed(t * 100 + s)
    scheme = shaw(k)
    pos = positions(t, s, left_pads)
    assert pos.padded == (left_pads is not None and any(left_pads))
    batch = len(left_pads) if left_pads else 2
    q = torch.randn(batch, 2, t, 4, dtype=torch.double, requires_grad=True)
    probs = torch.randn(batch, 2, t, s, dtype=torch.double).softmax(-1).requires_grad_()
    bias = scheme.attention_bias(1, q, pos)
    value = scheme.value_term(1, probs, pos)
    expected_bias, expected_value = reference_terms(scheme, 1, q, probs, pos)
    assert bias.shape == (batch, 2, t, s) and value.shape == (batch, 2, t, 4)
    inputs = (q, probs, scheme.rel_k, scheme.rel_v)
    got = (bias, value) + grads((bias, value), inputs, seed=1)
    want = (expected_bias, expected_value) + grads((expected_bias, expected_value), inputs, seed=1)
    # float64 both ways: each sum within terms x eps64 x its largest value of the exact one
    names = ("bias", "value", "grad q", "grad probs", "grad a^K", "grad a^V")
    for a, b, terms, name in zip(got, want, term_counts(batch, 2, t, s, k, 4), names):
        assert_within(a, b, float64_tolerance(terms, magnitude(a, b)), name)


@pytest.mark.numerics
def test_float32_terms_match_the_equations_to_single_precision():
    """The float32 terms against the equations in float64 on the same (float32) values: only
    the float32 side rounds, each tensor by at most its terms x eps32 x its largest value. The
    gradients of a^K and a^V at the edge offsets sum 3 x 4 x 1176 = 14112 pairs each, whose
    float32 sum rounds differently with each CPU's vector kernels."""
    torch.manual_seed(0)
    scheme = shaw(16, heads=4, head_dim=64).float()
    pos = positions(64, 64, None)
    q = torch.randn(3, 4, 64, 64, requires_grad=True)
    probs = torch.randn(3, 4, 64, 64).softmax(-1).requires_grad_()
    got = (scheme.attention_bias(0, q, pos), scheme.value_term(0, probs, pos))
    got += grads(got, (q, probs, scheme.rel_k, scheme.rel_v), 2)
    exact = copy.deepcopy(scheme).double()
    q64, probs64 = q.detach().double().requires_grad_(), probs.detach().double().requires_grad_()
    want = reference_terms(exact, 0, q64, probs64, pos)
    want += grads(want, (q64, probs64, exact.rel_k, exact.rel_v), 2, dtype=torch.float32)
    names = ("bias", "value", "grad q", "grad probs", "grad a^K", "grad a^V")
    for a, b, terms, name in zip(got, want, term_counts(3, 4, 64, 64, 16, 64), names):
        assert a.dtype == torch.float32
        assert_within(a.double(), b, float32_tolerance(terms, magnitude(b), sides=1), name)


class ReferenceShaw(ShawRelative):
    def attention_bias(self, layer, q, pos):
        return reference_terms(self, layer, q, torch.zeros(*q.shape[:3], pos.k_frame.numel(), dtype=q.dtype), pos)[0]

    def value_term(self, layer, probs, pos):
        q = torch.zeros(*probs.shape[:3], self.head_dim, dtype=probs.dtype)
        return reference_terms(self, layer, q, probs, pos)[1]


@pytest.mark.numerics
def test_attention_over_a_left_padded_batch_equals_the_reference_with_its_gradients():
    torch.manual_seed(0)
    scheme = shaw(3, heads=2, head_dim=4, layers=1)
    reference = ReferenceShaw(argparse.Namespace(max_relative_distance=3), "encoder", 1, 2, 4).double()
    reference.load_state_dict(scheme.state_dict())
    attn = PositionalAttention(8, 2, self_attention=True).double().eval()
    x = torch.randn(9, 3, 8, dtype=torch.double, requires_grad=True)
    pads = torch.arange(9)[None, :] < torch.tensor([0, 4, 7])[:, None]
    results = []
    for term in (scheme, reference):
        attn.attach([term], 0)
        term.begin_forward(torch.zeros(3, 9, dtype=torch.long))
        out, _ = attn(x, x, x, key_padding_mask=pads, need_weights=False)
        results.append((out,) + grads((out,), (x, term.rel_k, term.rel_v), seed=3))
    # float64 both ways. The forward's chain of sums: the projections (8 terms), a logit (4, and
    # 4 for q . a^K), the softmax and the weighted values (9 keys each), a^V pooled over 9 keys
    # and 7 offsets, the output projection (8): 58 terms; the backward runs it again, and a^K's
    # and a^V's gradients add 3 sentences x 2 heads x up to 21 pairs per edge offset
    terms = 2 * 58 + 3 * 2 * largest_pool(positions(9, 9, None), 3)
    for got, want, name in zip(*results, ("output", "grad x", "grad a^K", "grad a^V")):
        assert_within(got, want, float64_tolerance(terms, magnitude(got, want)), name)


def test_a_max_distance_of_1_gives_three_offsets_clipped_at_1():
    scheme = shaw(1, layers=1)
    assert scheme.rel_k.shape == scheme.rel_v.shape == (1, 3, 4)
    index = scheme._index(AttentionPositions.build(4, 4, None, "cpu"))
    assert index.tolist() == [[max(-1, min(1, j - i)) + 1 for j in range(4)] for i in range(4)]
    with pytest.raises(ValueError, match=r"--max-relative-distance must be from 1 to 63 \(.*\), got -1$"):
        shaw(-1)
    with pytest.raises(ValueError, match=r"--max-relative-distance must be from 1 to 63 \(.*\), got 0$"):
        shaw(0)  # not read as "unset" (16)
