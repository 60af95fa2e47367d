"""Half precision: position terms are computed in float32 and cast where attention uses them.

fairseq-train refuses both half-precision modes on CPU (``--bf16`` implies ``--tpu`` and fails
without torch_xla; ``--fp16`` needs CUDA), so these tests convert the model itself, as fairseq's
trainer does (``model.half()`` / ``model.bfloat16()``). A half-precision model's bias is
compared with the float32 computation on the same parameter values (the float32 model's
parameters are rounded to bfloat16 first), cast: they must be equal to the last bit.
"""
import argparse
import copy
import math

import pytest
import torch
from torchdiffeq import odeint

from fairseq_posenc.positions import POSITION_ENCODINGS, AttentionPositions, PositionEncoding
from fairseq_posenc.positions.alibi import ALiBi
from fairseq_posenc.positions.floater import FloaterODE
from tolerances import assert_within
from toy import build_model, toy_batch, with_strong_positions


def _rounded_to(model, dtype):
    """The float32 model with every parameter rounded to ``dtype`` (values both can hold)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).float())
    return model


def _loss(model, batch):
    src, lengths, prev = batch
    target = torch.roll(prev, -1, dims=1)
    lprobs = model.get_normalized_probs(model(src, lengths, prev), log_probs=True).float()
    return -lprobs.gather(-1, target[..., None]).mean()


@pytest.mark.numerics
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("encoding", list(POSITION_ENCODINGS))
def test_every_encoding_trains_in_half_precision_with_finite_losses(encoding, dtype):
    reference = _rounded_to(build_model("transformer_posenc", "--position-encoding", encoding, "--dropout", "0"),
                            dtype)
    half = copy.deepcopy(reference).to(dtype)
    batch = toy_batch(reference.encoder.dictionary, [5, 9, 3, 7], tgt_len=8)
    exact, loss = _loss(reference, batch), _loss(half, batch)
    loss.backward()
    assert math.isfinite(loss.item())
    # the whole network runs in half precision (8 or 11 bits of mantissa), not only the positions:
    # a check that half-precision training is close, 2% of the loss (not derived: counted as in
    # tests/tolerances.py, ~70 roundings of bfloat16 in a row would allow +-50%)
    assert_within(loss.detach(), exact.detach(), 2e-2 * abs(exact.item()), "loss")
    grads = {name: p.grad for name, p in half.named_parameters()}
    assert all(torch.isfinite(g).all() for g in grads.values() if g is not None)
    # every position parameter receives a gradient, and not an all-zero one
    for name, grad in grads.items():
        if "position" in name:
            assert grad is not None and grad.abs().max() > 0, name


def _bias(scheme, length, q=None):
    scheme.begin_forward(torch.zeros(1, length, dtype=torch.long))
    pos = AttentionPositions.build(length, length, None, torch.device("cpu"))
    if q is None:
        q = torch.zeros(1, scheme.num_heads, length, scheme.head_dim)
    return scheme.attention_bias(0, q, pos)


BIASED = [name for name, scheme in POSITION_ENCODINGS.items()
          if scheme.attention_bias is not PositionEncoding.attention_bias]


def test_the_attention_biases_are_found_in_the_registry():
    assert {"diet_abs", "diet_rel", "shaw", "t5", "alibi"} <= set(BIASED)
    assert not {"sinusoidal", "learned", "rope", "floater"} & set(BIASED)


@pytest.mark.numerics
@pytest.mark.parametrize("encoding", BIASED)
def test_a_bfloat16_models_bias_is_the_float32_bias_cast(encoding):
    model = with_strong_positions(_rounded_to(build_model("transformer_posenc", "--position-encoding", encoding),
                                              torch.bfloat16))
    _rounded_to(model, torch.bfloat16)  # the strong position parameters too
    half = copy.deepcopy(model).bfloat16()
    q = torch.randn(2, 4, 40, 8, generator=torch.Generator().manual_seed(0)).bfloat16()
    with torch.no_grad():
        exact = _bias(model.encoder.position_encoding, 40, q.float())
        got = _bias(half.encoder.position_encoding, 40, q)
    assert torch.equal(got.to(torch.bfloat16), exact.to(torch.bfloat16))


@pytest.mark.numerics
def test_shaws_value_term_pools_the_probabilities_in_float32():
    model = with_strong_positions(build_model("transformer_posenc", "--position-encoding", "shaw"))
    _rounded_to(model, torch.bfloat16)
    half = copy.deepcopy(model).bfloat16()
    # 600 keys, each with probability 1/600: the edge offsets pool ~580 of them (torch's CPU
    # scatter_add happens to accumulate bfloat16 in float32; other kernels need not)
    probs = torch.full((1, 4, 1, 600), 1 / 600).bfloat16()
    pos = AttentionPositions.build(1, 600, None, torch.device("cpu"))
    with torch.no_grad():
        exact = model.encoder.position_encoding.value_term(0, probs.float(), pos)
        got = half.encoder.position_encoding.value_term(0, probs, pos)
    assert torch.equal(got, exact.bfloat16())


@pytest.mark.numerics
def test_alibi_in_bfloat16_equals_the_float32_bias_cast_where_bfloat16_arithmetic_would_not():
    # 12 heads: slopes 2^(-k/2) that bfloat16 cannot hold exactly; the symmetric form, whose
    # every entry is finite, so that the comparison below covers every head and offset
    scheme = ALiBi(argparse.Namespace(alibi_encoder="symmetric"), "encoder", 1, 12, 8)
    half = copy.deepcopy(scheme).bfloat16()
    with torch.no_grad():
        exact = _bias(scheme, 600)
        got = _bias(half, 600).to(torch.bfloat16)
        offsets = torch.arange(600)
        in_bf16 = -half.slopes[:, None, None] * (offsets[None, :] - offsets[:, None]).abs().bfloat16()
    assert torch.equal(got[0], exact[0].to(torch.bfloat16))
    # bfloat16 arithmetic (rounded slope x distance) is off by several units at 600 positions
    assert (in_bf16.float() - exact[0]).abs().max().item() > 2.0


@pytest.mark.numerics
def test_floaters_ode_is_solved_in_float32_in_a_bfloat16_model():
    torch.manual_seed(0)
    ode = FloaterODE(num_states=3, dim=8, hidden=8, dt=0.1, solver="euler", step=0.1, adjoint=False)
    with torch.no_grad():
        for p in ode.parameters():
            p.copy_((torch.randn(p.shape) * 0.3).bfloat16().float())
    half = copy.deepcopy(ode).bfloat16()
    with torch.no_grad():
        exact = ode.positions(800)
        got = half.positions(800)
        # the same solve with the time, the state and the dynamics in bfloat16
        times = (torch.arange(800, dtype=torch.float32) * 0.1).bfloat16()
        field = half.dynamics.float32()
        field.weights = tuple(w.bfloat16() for w in field.weights)
        in_bf16 = odeint(field, half.initial.detach(), times[:150], method="euler", options={"step_size": 0.1})
    assert got.dtype == torch.float32 and torch.equal(got, exact)
    # in bfloat16 800 positions have 449 distinct times (steps of 0.125 from t = 16 on, 0.5
    # from t = 64), which torchdiffeq refuses; over the first 150 the state drifts by more than
    # the distance between two neighbouring positions (measured 2.04 against 0.33)
    assert torch.unique(times).numel() == 449
    error = (in_bf16.float() - exact[:150]).abs().max().item()
    neighbours = (exact[1:150] - exact[:149]).abs().mean().item()
    assert error > 3 * neighbours


@pytest.mark.numerics
@pytest.mark.parametrize("solver, adjoint", [("midpoint", False), ("dopri5", False), ("rk4", True)])
def test_torchdiffeqs_solvers_stay_in_float32_under_autocast(solver, adjoint):
    """The solvers other than FLOATER's own rk4 (and rk4 with --floater-adjoint) run on
    torchdiffeq, whose steps call h inside the model's forward: under bf16 autocast (--bf16,
    --amp) h's matmuls would drop to bfloat16 (measured here: the solution off by 0.01 in 5.5)."""
    torch.manual_seed(0)
    ode = FloaterODE(num_states=3, dim=8, hidden=8, dt=0.1, solver=solver, step=None, adjoint=adjoint)
    with torch.no_grad():
        ode.initial.normal_(std=0.5)
    results = []
    for autocast in (False, True):
        ode.zero_grad()
        ode.new_forward()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            solution = ode.positions(60)
        solution.pow(2).sum().backward()  # outside autocast, as fairseq's trainer does
        results.append((solution.detach(), {name: p.grad.clone() for name, p in ode.named_parameters()}))
    (exact, exact_grads), (got, got_grads) = results
    assert got.dtype == torch.float32 and torch.equal(got, exact)
    for name, grad in exact_grads.items():
        assert torch.equal(got_grads[name], grad), name
