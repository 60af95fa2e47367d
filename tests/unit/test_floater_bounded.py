"""FLOATER with --floater-dissipation LAMBDA (issue 32, item 5): dp/dt = -LAMBDA p + tanh(h(t, p)),
whose every coordinate stays within max(|p(0)|, 1 / LAMBDA); the warm start is still exactly the
vanilla model; the adjoint and --floater-solve-every solve the same field. And FLOATER's label
(``form``), read from the model's state."""
import re

import pytest
import torch

from fairseq_posenc.compat import PosencError
from fairseq_posenc.labels import scheme_items
from fairseq_posenc.positions.floater import schedule as floater_schedule
from fairseq_posenc.positions.floater import FloaterODE, stability_limit
from fairseq_posenc.positions.floater.solver import rk4
from helpers.tolerances import assert_within, float32_tolerance, magnitude
from helpers.toy import build_model, full_log_probs, toy_batch

DIM = 32


def floater(*flags, seed=1):
    return build_model("transformer_posenc", "--position-encoding", "floater", *flags, seed=seed)


def reference_field(dynamics, dissipation):
    """-LAMBDA p + tanh(h(t, p)) from h's nn.Linear layers, written apart from Float32Field."""
    def field(t, p):
        hidden = torch.relu(dynamics.fc1(p) + t * dynamics.time1)
        return torch.tanh(dynamics.fc2(hidden) + t * dynamics.time2) - dissipation * p
    return field


def test_warm_start_with_dissipation_is_exactly_the_vanilla_model(tmp_path):
    """h = 0 and p(0) = 0: the field is tanh(0) - LAMBDA 0 = 0, every bias an exact 0."""
    vanilla = build_model("transformer_posenc", "--dropout", "0.0", seed=5)
    path = tmp_path / "vanilla.pt"
    torch.save({"model": vanilla.state_dict()}, path)
    warm = floater("--dropout", "0.0", "--floater-dissipation", "1.0", "--floater-init-from", str(path))
    assert warm.encoder.position_encoding.ode.dynamics.dissipation == 1.0
    src, lengths, prev = toy_batch(vanilla.encoder.dictionary, [9, 5, 7], tgt_len=8)
    for mode in ("train", "eval"):
        getattr(vanilla, mode)(), getattr(warm, mode)()
        with torch.set_grad_enabled(mode == "train"):
            assert torch.equal(full_log_probs(warm, src, lengths, prev), full_log_probs(vanilla, src, lengths, prev))
        assert not warm.encoder.position_encoding.ode.solution.any()


def _unstable(ode, a=1.0):
    """h(p) = p A with A = a I + a skew part (relu(p) A - relu(-p) A, hidden = 2 d): the paper's
    form grows like exp(a t); plus random initial states in [-0.5, 0.5]."""
    dyn = ode.dynamics
    g = torch.Generator().manual_seed(0)
    skew = torch.randn(DIM, DIM, generator=g)
    a_matrix = a * torch.eye(DIM) + (skew - skew.t()) * 0.3
    with torch.no_grad():
        dyn.fc1.weight.copy_(torch.cat([torch.eye(DIM), -torch.eye(DIM)]))
        dyn.fc2.weight.copy_(torch.cat([a_matrix, -a_matrix]).t())
        for p in (dyn.fc1.bias, dyn.fc2.bias, dyn.time1, dyn.time2):
            p.zero_()
        ode.initial.copy_(torch.rand(ode.initial.shape, generator=g) - 0.5)


@pytest.mark.slow  # about 10 s each
@pytest.mark.parametrize("weights", ["linear", "random"])
@pytest.mark.parametrize("dissipation", [0.5, 2.0])
@torch.no_grad()
def test_every_coordinate_stays_within_the_bound_where_the_papers_form_grows(weights, dissipation):
    """400 positions (t = 40, 40 times a training range of 10 at dt 0.1): the paper's form grows by
    orders of magnitude; with LAMBDA every coordinate stays within max(|p_j(0)|, 1 / LAMBDA)."""
    solutions = {}
    for lam in (0.0, dissipation):
        ode = FloaterODE(num_states=6, dim=DIM, hidden=2 * DIM, dt=0.1, solver="rk4", step=None, adjoint=False,
                         dissipation=lam)
        if weights == "linear":
            _unstable(ode)
        else:  # h's initialisation, its output layer 4 times larger
            torch.manual_seed(2)
            ode = FloaterODE(num_states=6, dim=DIM, hidden=2 * DIM, dt=0.1, solver="rk4", step=None, adjoint=False,
                             dissipation=lam)
            ode.dynamics.fc2.weight.mul_(4)
            ode.dynamics.fc2.bias.mul_(4)
            ode.initial.uniform_(-0.5, 0.5)
        solutions[lam] = ode.positions(400)[:400]
    paper, bounded = solutions[0.0], solutions[dissipation]
    bound = torch.maximum(bounded[0].abs(), torch.tensor(1 / dissipation))  # per state and coordinate
    assert torch.isfinite(bounded).all()
    assert (bounded.abs() <= bound * (1 + 1e-5)).all(), float((bounded.abs() / bound).max())
    # the unbounded form leaves that bound far behind (or overflows)
    grown = paper[-1].norm(dim=-1)
    assert (~torch.isfinite(grown) | (grown > 100 * bound.norm(dim=-1))).any(), grown


def test_the_adjoint_and_solve_every_solve_the_same_bounded_field():
    """The solution and the gradients of h and p(0), by backpropagation through FLOATER's own rk4
    (its state-space loops, with the field's tanh and decay in the hand-written backward), by the
    adjoint (torchdiffeq), and by --floater-solve-every's flow update, against torchdiffeq's rk4
    through autograd on the reference field."""
    from torchdiffeq import odeint

    length, lam = 20, 1.5
    mean = torch.randn(length, 4, 8, generator=torch.Generator().manual_seed(1))
    results = {}
    for name, kwargs in (("backprop", {}), ("adjoint", {"adjoint": True}), ("solve every", {"solve_every": 3, "lr_scale": 1.0})):
        torch.manual_seed(3)
        kwargs = {"adjoint": False, **kwargs}
        ode = FloaterODE(num_states=4, dim=8, hidden=8, dt=0.1, solver="rk4", step=None, dissipation=lam, **kwargs)
        with torch.no_grad():
            ode.dynamics.fc2.weight.mul_(3)
        params = floater_schedule.flow_parameters(ode)  # the order of the flow update's gradients
        if name == "solve every":  # the flow update's backward (floater_schedule.SolveSchedule._backward)
            grads = ode.schedule._backward(ode, mean)
            with torch.no_grad():
                solution = ode.positions(length)[:length]
        else:
            solution = ode._solve(ode.initial_state(), 0, length)
            expected_path = "_RK4Backward" if name == "backprop" else "OdeintAdjointMethodBackward"
            assert type(solution.grad_fn).__name__ == expected_path, name
            grads = torch.autograd.grad(solution, params, mean)
        # the reference: torchdiffeq's rk4 on the reference field, backpropagated
        times = torch.arange(length, dtype=torch.float32) * 0.1
        expected = odeint(reference_field(ode.dynamics, lam), ode.initial, times, method="rk4",
                          options={"step_size": 0.02})
        expected_grads = torch.autograd.grad(expected, params, mean)
        results[name] = (solution.detach(), grads, expected.detach(), expected_grads)
    for name, (solution, grads, expected, expected_grads) in results.items():
        # h's evaluation sums 8 + 8 terms; 20 positions of 5 steps of 4 evaluations
        assert_within(solution, expected, float32_tolerance(20 * 5 * 4 * 16, magnitude(expected)), name)
        for g, e in zip(grads, expected_grads):
            if name == "adjoint":  # the continuous adjoint: rk4's truncation error as well (as test_floater's)
                assert_within(g, e, 1e-3 * magnitude(e) + 1e-6, name)
            else:
                assert_within(g, e, float32_tolerance(20 * 5 * 4 * 4 * 16, magnitude(e)), name)


def test_a_negative_dissipation_is_refused_in_one_line():
    with pytest.raises(PosencError, match=r"--floater-dissipation must be a finite number >= 0"):
        floater("--floater-dissipation", "-1")
    with pytest.raises(PosencError, match="--floater-dissipation 1.0: --position-encoding rnn has no ODE"):
        build_model("transformer_posenc", "--position-encoding", "rnn", "--floater-dissipation", "1.0")


def _items(model, side="encoder"):
    return scheme_items(getattr(model, side).position_encoding)


def test_the_stability_limits_are_the_runge_kutta_methods_intervals():
    # |R(z)| <= 1 on z in [-x, 0], R the truncated exponential: the textbook intervals
    assert [round(stability_limit(order), 4) for order in (1, 2, 3, 4)] == [2.0, 2.0, 2.5127, 2.7853]


def test_a_dissipation_past_the_solvers_stability_limit_is_refused_in_one_line():
    """LAMBDA 50 at step 0.1 ended in fairseq's NaN detector, LAMBDA 30 gave |p| = 3.5e27 where the
    help promises max(|p(0)|, 1 / LAMBDA): rk4 amplifies -LAMBDA p once LAMBDA x step > 2.785."""
    with pytest.raises(PosencError) as refused:
        floater("--floater-step", "0.1", "--floater-dissipation", "30")
    assert str(refused.value) == (
        "--floater-dissipation 30: with --floater-step 0.1 (rk4) LAMBDA x step = 3 is past rk4's stability limit "
        "2.785, where the solve grows without bound instead of decaying; the largest stable LAMBDA for this step is "
        "27.85 (or take a smaller --floater-step)")
    with pytest.raises(PosencError, match=r"\(euler\) LAMBDA x step = 2.2 is past euler's stability limit 2.000"):
        floater("--floater-solver", "euler", "--floater-step", "0.1", "--floater-dissipation", "22")
    # just inside the limit it builds; with h = 0 the solve is p(0) R(-LAMBDA step)^k, which decays
    # there and grows past it (the solver itself, which the refusal keeps from such a LAMBDA)
    ode = floater("--floater-step", "0.1", "--floater-dissipation", "27.8").encoder.position_encoding.ode
    with torch.no_grad():
        ode.reset_to_vanilla()
        ode.dynamics.fc1.bias.zero_()
        field, p0 = ode.dynamics.float32(), torch.ones(2, 32)
        times = torch.arange(60, dtype=torch.float32) * ode.dt  # 59 steps of 0.1
        inside = rk4(field.weights, p0, times, 0.1, 27.8)
        past = rk4(field.weights, p0, times, 0.1, 30.0)
    assert inside.abs().max() == 1 and inside[-1].abs().max() < 0.7  # R(-2.78) = 0.992: 0.62 after 59 steps
    assert past[-1].abs().min() > 1e6  # R(-3) = 1.375: 1.4e8 after 59 steps
    # adaptive solvers choose their own steps: no limit
    floater("--floater-solver", "dopri5", "--floater-dissipation", "300")


def test_a_step_with_an_adaptive_solver_is_refused_in_one_line():
    with pytest.raises(PosencError) as refused:
        floater("--floater-solver", "dopri5", "--floater-step", "0.1")
    assert str(refused.value) == (
        "--floater-step 0.1 would change nothing: --floater-solver dopri5 is adaptive (it chooses its own steps); "
        "the step is for the fixed-step solvers, euler, midpoint, heun2, heun3, rk4, explicit_adams, implicit_adams")


def test_the_label_names_what_differs_from_the_paper():
    assert _items(floater()) == []
    assert _items(floater("--floater-solve-every", "10")) == ["solve every 10"]  # C = N
    assert _items(floater("--floater-solve-every", "10", "--floater-lr-scale", "1"), "decoder") == [
        "solve every 10", "lr scale 1"]
    assert _items(floater("--floater-lr-scale", "3")) == ["lr scale 3"]
    assert _items(floater("--floater-step", "0.1", "--floater-dissipation", "1.0")) == ["step 0.1", "dissipation 1"]
    assert _items(floater("--floater-solver", "dopri5", "--floater-cross-attention")) == [
        "solver dopri5", "cross-attention"]
    assert _items(build_model("transformer_posenc", "--position-encoding", "rnn")) == []


def test_the_label_reads_n_and_c_from_the_checkpoint_not_the_flags():
    """A model rebuilt with other flags (a decode with --model-overrides, a study) labels the weights
    by the N and C they were trained with, stored with them; once it trains, by its own."""
    trained = floater("--floater-solve-every", "10", "--floater-lr-scale", "1")
    state = trained.state_dict()
    assert state["encoder.position_encoding.ode._extra_state"].tolist() == [10.0, 0.0]  # N, not warm-started
    decoding = floater(seed=2)
    decoding.load_state_dict(state)
    assert _items(decoding) == ["solve every 10", "lr scale 1"]
    decoding.encoder.position_encoding.ode.begin_update(1)  # it trains on at N = 1, C = 1
    assert _items(decoding) == []
    # earlier forms of the plugin's checkpoints: without N, with N alone, with the fingerprint of
    # 2 float64 sums; each refused in one line, not loaded with the model's own settings
    ode = "encoder.position_encoding.ode."
    earlier = {"has no": lambda s: s.pop(ode + "_extra_state"),
               "holds (1,) for": lambda s: s.update({ode + "_extra_state": torch.tensor([4.0], dtype=torch.float64)}),
               "holds (2,) for": lambda s: s.update({ode + "fingerprint": torch.zeros(2, dtype=torch.float64)})}
    for held, change in earlier.items():
        old = floater().state_dict()
        change(old)
        with pytest.raises(PosencError, match=rf"^the checkpoint {re.escape(held)} {ode}\w+: it was saved by an "
                           "earlier version of fairseq_posenc, whose checkpoints this one does not load; train the "
                           "model again$"):
            floater("--floater-solve-every", "4", seed=3).load_state_dict(old)
