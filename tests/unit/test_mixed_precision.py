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
from helpers.tolerances import assert_within, float32_tolerance, magnitude
from helpers.floater_trainer import FLOW
from helpers.toy import build_model, toy_batch, with_strong_positions
from helpers.fairseq_runs import preprocess_here


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
    # tests/helpers/tolerances.py, ~70 roundings of bfloat16 in a row would allow +-50%)
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


@pytest.mark.slow  # about 10 s
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


# --- FLOATER's --floater-solve-every under fairseq's half-precision optimizers -------------------
# Through fairseq's own Trainer in this process (tests/helpers/floater_trainer.py): --fp16 (FP16Optimizer,
# fp32 master weights, loss scaling), --memory-efficient-fp16 (Adam on the fp16 weights, loss
# scaling), --bf16 / --memory-efficient-bf16 (the same two, no loss scaler), --amp (fp32 weights,
# torch's GradScaler: on a machine without CUDA fairseq's scaler is disabled, so the test gives it
# torch's CPU GradScaler, which scales as the CUDA one does). fairseq's flattened FP16Optimizer (one
# fp32 tensor for all weights) needs CUDA: the schedule asks for --fp16-no-flatten-grads (tested).

HALF = ["--fp16", "--memory-efficient-fp16", "--amp", "--bf16", "--memory-efficient-bf16"]
LOSS_SCALED = ("--fp16", "--memory-efficient-fp16", "--amp")


@pytest.fixture(scope="module")
def toy_bin(tmp_path_factory):
    from posenc_workflow import toy_data

    root = tmp_path_factory.mktemp("half_floater")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (200, 3, 10), "valid": (10, 3, 10)})
    return preprocess_here(prefixes, str(root / "bin"))


@pytest.mark.slow  # fairseq's Trainer on a preprocessed corpus
@pytest.mark.numerics
@pytest.mark.parametrize("precision", HALF)
def test_floaters_flow_update_in_half_precision_is_the_float32_one(toy_bin, precision, monkeypatch):
    """A cycle of N = 3 updates of 2 passes. Under loss scaling the second update overflows (an
    infinite gradient injected into one decoder weight, the positions untouched): fairseq skips it
    (fp16: the next batch is the same update, at half the loss scale; amp: retried at half the
    scale), and its gradient must not reach the flow update. Between flow updates fairseq's
    optimizer must hand Adam no gradient for h and the initial states (FP16Optimizer would hand it
    zeros, and Adam's momentum would move them): they stay as they are and Adam keeps no state for
    them. At the cycle's last update Adam gets, for each, the mean of the taken updates' gradients
    on the solution, each normalised by its sample size and divided by its own loss scale,
    backpropagated through one solve: compared with that computed in float64 from the recorded
    gradients of the passes. Tolerances: float32 roundings of the solve's backward (12 positions at
    most of 5 rk4 steps of 4 evaluations, each a sum over the width of 32) and of the cycle's sums,
    and where the optimizer holds half-precision gradients (memory-efficient) two roundings to that
    format (half a unit in the last place each: 2**-11 fp16, 2**-8 bf16, relative) and, fp16 only,
    its subnormal spacing 2**-24 (the gradient is unscaled in fp16)."""
    from helpers.floater_trainer import Recorder, batches, build_trainer, config

    every, passes = 3, 2
    trainer = build_trainer(config(toy_bin, "--floater-solve-every", str(every), *precision.split()))
    optimizer = trainer.optimizer
    if precision == "--amp":
        assert not optimizer.scaler.is_enabled()  # no CUDA: fairseq's scaler does nothing here
        optimizer._grad_scaler = torch.amp.GradScaler("cpu", init_scale=128.0)
    recorder = Recorder(trainer, monkeypatch)
    updates = iter(batches(trainer, passes))
    victim = trainer.get_model().decoder.layers[0].fc2.weight
    steps = []
    while trainer.get_num_updates() < every:
        overflow = precision in LOSS_SCALED and len(steps) == 1
        steps.append(recorder.step(next(updates), overflow_in=victim if overflow else None))
    if precision in LOSS_SCALED:
        first, second = steps[1]["attempts"][0]["loss_scale"], steps[-1]["attempts"][-1]["loss_scale"]
        assert second == first / 2  # the overflow was seen, and the scale lowered
        assert (not steps[1]["taken"]) if precision != "--amp" else len(steps[1]["attempts"]) == 2
    for step in steps[:-1]:
        assert step["handed"] is None or all(g is None for g in step["handed"]), "a gradient between flow updates"
        assert step["handed"] is None or not any(step["adam_state"]), "Adam's state for the flow model"
        assert not any(step["moved"]), "the flow model moved between flow updates"
    flow = steps[-1]
    assert flow["taken"] and all(flow["moved"]) and all(g is not None for g in flow["handed"])
    expected, mean = recorder.expected_flow_gradient(steps)
    final_scale = flow["attempts"][-1]["loss_scale"]
    for name, got, want in zip(FLOW, flow["handed"], expected):
        if precision == "--amp":
            # fairseq's AMPOptimizer unscales the torch optimizer's gradients at clipping and its own
            # wrapper's at the step: torch's GradScaler counts the two as different optimizers and
            # divides every gradient twice (all parameters alike; Adam hardly feels a common scale)
            got = got * final_scale
        terms = mean.size(0) * 5 * 4 * 32 + every * passes + 4
        tolerance = float32_tolerance(terms, magnitude(want), sides=1) + torch.zeros_like(want)
        if precision.startswith("--memory-efficient"):
            fmt = torch.float16 if "fp16" in precision else torch.bfloat16
            tolerance = tolerance + 2 * torch.finfo(fmt).eps / 2 * want.abs() + (2 ** -24 if fmt == torch.float16 else 0)
        difference = (got.double() - want).abs()
        assert (difference <= tolerance).all(), (name, difference.max().item(), tolerance.max().item())
        assert want.abs().max() > 10 * tolerance.max(), name  # the bound is far below the gradient compared


def test_floaters_schedule_asks_for_unflattened_fp16_gradients(toy_bin):
    """fairseq's default --fp16 optimizer keeps one flat fp32 tensor with one gradient for all
    weights (and needs CUDA): h's part would be zeros between flow updates and Adam would move it.
    The schedule sets --fp16-no-flatten-grads before the optimizer is built, and says so."""
    from helpers.floater_trainer import build_trainer, config

    cfg = config(toy_bin, "--floater-solve-every", "2", "--fp16")
    assert not cfg.common.fp16_no_flatten_grads
    trainer = build_trainer(cfg)
    assert cfg.common.fp16_no_flatten_grads and not trainer.optimizer.has_flat_params
