"""FLOATER's rk4 with the hand-written backward computes what torchdiffeq's rk4 computes, with its
step loops in C++ and in Python."""
import shutil

import pytest
import torch
from torchdiffeq import odeint

from fairseq_posenc.positions import floater_solver
from fairseq_posenc.positions.floater import FloaterODE
from fairseq_posenc.positions.floater_solver import _RK4, _RK4Hidden, rk4

H = ("fc1.weight", "fc1.bias", "time1", "fc2.weight", "fc2.bias", "time2")


#: h's hidden size: 12 is solved in hidden space (_RK4Hidden, its loops in C++ where `make
#: install` built them, else in Python), 40 >= 2 x 16 in y's (_RK4, Python)
HIDDEN = {"hidden space": 12, "hidden space, Python loops": 12, "state space": 40}


@pytest.fixture(autouse=True)
def loops(request, monkeypatch):
    """Runs the "Python loops" forms with the C++ loops switched off."""
    form = request.node.callspec.params.get("form", "") if hasattr(request.node, "callspec") else ""
    monkeypatch.setattr(floater_solver, "USE_COMPILED", "Python loops" not in form)


def _ode(step=None, seed=3, hidden=12):
    torch.manual_seed(seed)
    ode = FloaterODE(num_states=6, dim=16, hidden=hidden, dt=0.1, solver="rk4", step=step, adjoint=False)
    with torch.no_grad():  # initial states large enough that the trajectory is not flat
        ode.initial.normal_(std=0.5)
    return ode


def _solve_and_grads(ode, y0, start, end, solve):
    """The solution from ``y0`` at positions start .. end - 1 and the gradients of a random
    weighting of it with respect to y0 and every parameter of h."""
    field = ode.dynamics.float32()
    times = torch.arange(start, end, dtype=torch.float32) * ode.dt
    solution = solve(field, y0, times)
    weights = torch.randn(solution.shape, generator=torch.Generator().manual_seed(end))
    params = [y0] + [dict(ode.dynamics.named_parameters())[name] for name in H]
    grads = torch.autograd.grad((solution * weights).sum(), params)
    return solution.detach(), dict(zip(("y0",) + H, grads))


def assert_equal_to_float32_rounding(got, expected, msg=None):
    """Equal to 1e-5 relative to the largest entry: float32 keeps 7 digits of a gradient of size
    100 (measured: 1.2e-6 at most between the two solvers, 0 between the solutions of _RK4)."""
    assert got.shape == expected.shape, msg
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max(), msg


def _torchdiffeq(ode):
    return lambda field, y0, times: odeint(field, y0, times, method="rk4", options={"step_size": ode.step})


def _fast(ode):
    return lambda field, y0, times: rk4(field.weights, y0, times, ode.step)


@pytest.mark.parametrize("form", HIDDEN)
@pytest.mark.parametrize("step", [None, 0.03])  # dt / 5, and a step the positions fall inside of
@pytest.mark.parametrize("start, end", [(0, 40), (13, 31), (0, 2)])  # from 0, an extension, one step
def test_fast_rk4_gives_torchdiffeqs_solution_and_gradients(form, step, start, end):
    ode = _ode(step, hidden=HIDDEN[form])
    y0 = (ode.initial.detach() + 0.1 * start).requires_grad_()
    expected, expected_grads = _solve_and_grads(ode, y0, start, end, _torchdiffeq(ode))
    got, got_grads = _solve_and_grads(ode, y0, start, end, _fast(ode))
    assert got.shape == expected.shape == (end - start, 6, 16)
    assert expected.abs().max() > 0.5 and (expected[-1] - expected[0]).abs().max() > 0.05  # the state moves
    assert_equal_to_float32_rounding(got, expected)
    for name in expected_grads:
        assert expected_grads[name].abs().max() > 1e-3, name  # every gradient is live
        assert_equal_to_float32_rounding(got_grads[name], expected_grads[name], msg=name)


def test_the_c_plus_plus_loops_are_built_where_a_compiler_is_found():
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler here: FLOATER runs its Python loops")
    assert floater_solver._floater_rk4 is not None, "`make install` should have built fairseq_posenc/_floater_rk4"
    assert floater_solver.compiled_loops(torch.zeros(1)) is floater_solver._floater_rk4
    assert floater_solver.compiled_loops(torch.zeros(1, dtype=torch.float64)) is None  # float32 only


@pytest.mark.skipif(floater_solver._floater_rk4 is None, reason="the C++ loops are not built")
@pytest.mark.parametrize("dim, states, length", [(64, 6, 130), (32, 4, 2)])
def test_c_plus_plus_loops_equal_the_python_loops(monkeypatch, dim, states, length):
    """The same operations in the same order; only the rounding of the loops and of the matmul's
    bias term differs (measured: 4e-7 of the largest entry at d = 64 .. 256)."""
    results = []
    for compiled in (True, False):
        monkeypatch.setattr(floater_solver, "USE_COMPILED", compiled)
        torch.manual_seed(1)
        ode = FloaterODE(states, dim, dim, dt=0.1, solver="rk4", step=None, adjoint=False)
        with torch.no_grad():
            for p in ode.parameters():
                p.normal_(std=dim**-0.5)
        solution = ode._solve(ode.initial, 0, length)
        assert type(solution.grad_fn).__name__ == "_RK4HiddenBackward"
        (solution * torch.linspace(-1, 1, solution.numel()).view_as(solution)).sum().backward()
        results.append([solution.detach()] + [p.grad for p in ode.parameters()])
    for got, expected in zip(*results):
        assert expected.abs().max() > 1e-3
        assert_equal_to_float32_rounding(got, expected)


def test_the_ode_takes_the_fast_rk4_only_where_it_computes_the_same():
    for form, solver in (("hidden space", _RK4Hidden), ("state space", _RK4)):
        ode = _ode(hidden=HIDDEN[form])
        assert type(ode._solve(ode.initial, 0, 5).grad_fn).__name__ == solver.__name__ + "Backward"
    for kwargs in ({"adjoint": True}, {"solver": "midpoint"}):
        torch.manual_seed(0)
        ode = FloaterODE(**{"num_states": 2, "dim": 4, "hidden": 4, "dt": 0.1, "solver": "rk4", "step": None,
                            "adjoint": False, **kwargs})
        assert "_RK4" not in type(ode._solve(ode.initial, 0, 5).grad_fn).__name__, kwargs


def _plain_torchdiffeq_solve(ode):
    """FloaterODE._solve as it was before the fast path: torchdiffeq's odeint through autograd."""
    def solve(y0, start, end):
        times = torch.arange(start, end, dtype=torch.float32) * ode.dt
        return odeint(ode.dynamics.float32(), y0, times, method="rk4", options={"step_size": ode.step})
    return solve


@pytest.mark.parametrize("form", HIDDEN)
@pytest.mark.parametrize("warm", [False, True])  # h random; h's output layer at 0 (the warm start)
def test_ode_gradients_through_the_fast_rk4_equal_torchdiffeqs(warm, form):
    grads = []
    for fast in (True, False):
        ode = _ode(hidden=HIDDEN[form])
        if warm:
            ode.reset_to_vanilla()
            with torch.no_grad():
                ode.initial.normal_(std=0.5)
        if not fast:
            ode._solve = _plain_torchdiffeq_solve(ode)
        ode.positions(25).pow(2).sum().backward()
        grads.append({name: p.grad for name, p in ode.named_parameters()})
    assert grads[0].keys() == grads[1].keys() == {"initial"} | {"dynamics." + n for n in H}
    for name in grads[0]:
        if not warm or name in ("dynamics.fc2.weight", "dynamics.fc2.bias", "dynamics.time2", "initial"):
            assert grads[1][name].abs().max() > 1e-3, name
        assert_equal_to_float32_rounding(grads[0][name], grads[1][name], msg=name)


@pytest.mark.parametrize("form", HIDDEN)
def test_fast_rk4_solves_in_float32_under_autocast(form):
    ode = _ode(hidden=HIDDEN[form])
    with torch.no_grad():
        plain = ode._solve(ode.initial, 0, 30)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under_autocast = ode._solve(ode.initial, 0, 30)
    assert under_autocast.dtype == torch.float32
    torch.testing.assert_close(under_autocast, plain, atol=0, rtol=0)


@pytest.mark.parametrize("form", HIDDEN)
def test_fast_rk4_without_gradients_equals_the_solution_with_them(form):
    ode = _ode(hidden=HIDDEN[form])
    with torch.no_grad():
        kept = ode._solve(ode.initial, 0, 30)
    torch.testing.assert_close(ode._solve(ode.initial, 0, 30).detach(), kept, atol=0, rtol=0)


@pytest.mark.parametrize("form", HIDDEN)
@torch.no_grad()
def test_fast_rk4_does_not_drift_further_from_the_exact_steps_than_torchdiffeq_over_600_positions(form):
    """3,000 steps, with a state that grows by three orders of magnitude: the hidden-space form
    associates its sums differently, and its rounding could build up along the trajectory. Both
    float32 solves are held against torchdiffeq's steps in float64 (measured, relative to the
    largest entry: torchdiffeq 1.0e-5 / 1.7e-6, the fast form 2.8e-6 / 1.7e-6, hidden / state
    space)."""
    ode = _ode(hidden=HIDDEN[form])
    field = ode.dynamics.float32()
    times = torch.arange(600, dtype=torch.float32) * ode.dt
    exact = odeint(type(field)(tuple(w.double() for w in field.weights)), ode.initial.double(), times.double(),
                   method="rk4", options={"step_size": ode.step})
    scale = exact.abs().max()
    assert scale > 100 * ode.initial.abs().max()  # the trajectory moves far
    error = {name: ((solve(field, ode.initial, times).double() - exact).abs().max() / scale).item()
             for name, solve in (("torchdiffeq", _torchdiffeq(ode)), ("fast", _fast(ode)))}
    assert error["torchdiffeq"] < 1e-4
    assert error["fast"] <= 2 * error["torchdiffeq"] + 1e-6, error
