"""Shaw's key and value terms (a gather and a scatter over 2k + 1 offsets) equal the equations
written out with a table entry per (query, key) pair, values and gradients, wherever the queries
sit among the keys."""
import argparse

import pytest
import torch

from fairseq_posenc.modules import PositionalAttention
from fairseq_posenc.positions import AttentionPositions
from fairseq_posenc.positions.shaw import ShawRelative


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


def grads(outputs, inputs, seed):
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outputs]
    return torch.autograd.grad(outputs, inputs, weights)


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
    torch.testing.assert_close(bias, expected_bias, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(value, expected_value, atol=1e-12, rtol=1e-12)
    inputs = (q, probs, scheme.rel_k, scheme.rel_v)
    for got, want in zip(grads((bias, value), inputs, seed=1), grads((expected_bias, expected_value), inputs, seed=1)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_float32_terms_match_the_equations_to_single_precision():
    torch.manual_seed(0)
    scheme = shaw(16, heads=4, head_dim=64).float()
    pos = positions(64, 64, None)
    q = torch.randn(3, 4, 64, 64, requires_grad=True)
    probs = torch.randn(3, 4, 64, 64).softmax(-1).requires_grad_()
    got = (scheme.attention_bias(0, q, pos), scheme.value_term(0, probs, pos))
    want = reference_terms(scheme, 0, q, probs, pos)
    inputs = (q, probs, scheme.rel_k, scheme.rel_v)
    for a, b in zip(got + grads(got, inputs, 2), want + grads(want, inputs, 2)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


class ReferenceShaw(ShawRelative):
    def attention_bias(self, layer, q, pos):
        return reference_terms(self, layer, q, torch.zeros(*q.shape[:3], pos.k_frame.numel(), dtype=q.dtype), pos)[0]

    def value_term(self, layer, probs, pos):
        q = torch.zeros(*probs.shape[:3], self.head_dim, dtype=probs.dtype)
        return reference_terms(self, layer, q, probs, pos)[1]


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
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
