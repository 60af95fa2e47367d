"""KERPLE (Chi et al., 2022) and FIRE (Li et al., 2023): their bias matrices against the papers'
equations worked by hand, KERPLE's constraints after an optimizer step that would break them, and
their non-default forms in report labels. The shared walks over the registry (incremental decoding,
gradients, kept tables, flags, ...) cover them without a list of their own."""
import math
from types import SimpleNamespace

import pytest
import torch

from fairseq_posenc.labels import model_label
from fairseq_posenc.positions import AttentionPositions
from fairseq_posenc.positions.fire import Fire
from fairseq_posenc.positions.kerple import Kerple
from helpers.toy import build_model

L2, L3, L4, L5 = (math.log(n) for n in (2, 3, 4, 5))


def bias(scheme, n):
    """The (H, n, n) self-attention bias of ``scheme`` over n unpadded positions, query i, key j."""
    scheme.begin_forward(torch.zeros(1, n, dtype=torch.long))
    return scheme.attention_bias(0, None, AttentionPositions.build(n, n, None, "cpu"))[0]


def kerple(kernel, r1, r2, side="encoder"):
    scheme = Kerple(SimpleNamespace(kerple_kernel=kernel), side, 2, 2, 8)
    with torch.no_grad():
        scheme.r1.copy_(torch.tensor(r1))
        scheme.r2.copy_(torch.tensor(r2))
    return scheme


@torch.no_grad()
def test_kerple_log_is_minus_r1_log_of_1_plus_r2_distance():
    got = bias(kerple("log", [1.0, 0.5], [2.0, 1.0]), 3)
    # head 0: -log(1 + 2 d); head 1: -0.5 log(1 + d), d = |i - j|
    head0 = [[0, -L3, -L5], [-L3, 0, -L3], [-L5, -L3, 0]]
    head1 = [[0, -L2 / 2, -L3 / 2], [-L2 / 2, 0, -L2 / 2], [-L3 / 2, -L2 / 2, 0]]
    torch.testing.assert_close(got, torch.tensor([head0, head1]), rtol=0, atol=1e-6)


@torch.no_grad()
def test_kerple_power_is_minus_r1_distance_to_the_r2():
    got = bias(kerple("power", [1.0, 0.5], [2.0, 0.5]), 3)
    # head 0: -d^2; head 1: -0.5 sqrt(d)
    s = math.sqrt(2) / 2
    head0 = [[0, -1, -4], [-1, 0, -1], [-4, -1, 0]]
    head1 = [[0, -0.5, -s], [-0.5, 0, -0.5], [-s, -0.5, 0]]
    torch.testing.assert_close(got, torch.tensor([head0, head1], dtype=torch.float32), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kernel, r2_bound", [("log", 0.01), ("power", 2.0)])
def test_kerple_keeps_its_constraints_after_a_huge_optimizer_step(kernel, r2_bound):
    scheme = kerple(kernel, [1.0, 0.5], [1.0, 1.5])
    optimizer = torch.optim.SGD(scheme.parameters(), lr=1.0)
    scheme.r1.grad = torch.full((2,), 1e6)  # r1 to -1e6
    # r2 to -1e6 (log) or +1e6 (power: past its bound of 2)
    scheme.r2.grad = torch.full((2,), 1e6 if kernel == "log" else -1e6)
    optimizer.step()
    assert scheme.r1.min().item() < 0
    # a decode right after the step (no gradient: the parameters are left as they are) reads them clamped
    with torch.no_grad():
        decoded = bias(scheme, 3)
    # a training forward projects them back, as the authors' code: r1 >= 0.01, r2 in [0.01, 2]
    trained = bias(scheme, 3)
    assert scheme.r1.tolist() == pytest.approx([0.01, 0.01], rel=0, abs=1e-9)
    assert scheme.r2.tolist() == pytest.approx([r2_bound, r2_bound], rel=0, abs=1e-9)
    d = torch.tensor([[0.0, 1, 2], [1, 0, 1], [2, 1, 0]])
    expected = -0.01 * (torch.log1p(0.01 * d) if kernel == "log" else d ** 2)
    for got in (decoded, trained):
        torch.testing.assert_close(got, expected.expand(2, 3, 3), rtol=0, atol=1e-7)
        assert bool(torch.isfinite(got).all())


def fire(form="symmetric", side="encoder"):
    """FIRE with hand-picked weights: c = 1, L = 2; of the 32 hidden units only two act, h0 = relu(x)
    and h1 = relu(0.6 - x); head 0 is h0, head 1 is 2 h1."""
    scheme = Fire(SimpleNamespace(fire_encoder=form), side, 2, 2, 8)
    first, _, last = scheme.mlp
    with torch.no_grad():
        for p in scheme.parameters():
            p.zero_()
        scheme.c.fill_(1.0)
        scheme.L_multiplier.fill_(2 / 512)
        first.weight[0, 0], first.weight[1, 0], first.bias[1] = 1.0, -1.0, 0.6
        last.weight[0, 0], last.weight[1, 1] = 1.0, 2.0
    return scheme


def fire_inputs(signed):
    """psi(i - j) / psi(max(L, i)), psi(x) = log(|x| + 1), L = 2, over 4 positions (x sign(i - j) if
    ``signed``): rows 0-2 divide by psi(2) = log 3, row 3 by psi(3) = log 4."""
    psi = [0, L2, L3, L4]
    rows = [[psi[abs(i - j)] / (max(L3, psi[i]) + 1e-6) for j in range(4)] for i in range(4)]
    return [[x * (1 if i > j else -1 if signed else 1) for j, x in enumerate(row)] for i, row in enumerate(rows)]


@pytest.mark.parametrize("form", ["symmetric", "signed"])
@torch.no_grad()
def test_fire_is_the_mlp_of_the_interpolated_log_distance(form):
    x = fire_inputs(form == "signed")
    # e.g. row 3, key 1: log 3 / log 4 = 0.7925; row 1, key 0: log 2 / log 3 = 0.6309
    assert x[3][1] == pytest.approx(L3 / L4, abs=1e-6) and x[1][0] == pytest.approx(L2 / L3, abs=1e-6)
    head0 = [[max(v, 0) for v in row] for row in x]
    head1 = [[2 * max(0.6 - v, 0) for v in row] for row in x]
    torch.testing.assert_close(bias(fire(form), 4), torch.tensor([head0, head1]), rtol=0, atol=1e-6)


@torch.no_grad()
def test_fire_s_decoder_is_the_paper_s_formula_whatever_the_encoder_s_form():
    decoder = fire("signed", side="decoder")
    x = fire_inputs(False)
    expected = torch.tensor([[[max(v, 0) for v in row] for row in x], [[2 * max(0.6 - v, 0) for v in row] for row in x]])
    torch.testing.assert_close(bias(decoder, 4), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("flags, expected", [
    ((), "kerple"), (("--kerple-kernel", "log"), "kerple"), (("--kerple-kernel", "power"), "kerple (power)")])
def test_kerple_s_label_names_the_power_kernel(flags, expected):
    assert model_label(build_model("transformer_posenc", "--position-encoding", "kerple", *flags)) == expected


@pytest.mark.parametrize("flags, expected", [((), "fire"), (("--fire-encoder", "signed"), "fire (signed)")])
def test_fire_s_label_names_the_signed_encoder(flags, expected):
    assert model_label(build_model("transformer_posenc", "--position-encoding", "fire", *flags)) == expected
