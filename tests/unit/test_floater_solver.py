"""FLOATER's rk4 with the hand-written backward computes what torchdiffeq's rk4 computes, with its
step loops in C++ and in Python."""
import re
import shutil

import pytest
import torch
from torchdiffeq import odeint

from fairseq_posenc.positions.floater import loops as floater_loops, solver
from fairseq_posenc.positions.floater import FloaterODE
from fairseq_posenc.positions.floater.solver import _RK4, _RK4Hidden, rk4
from helpers.tolerances import assert_within, float32_tolerance, magnitude

H = ("fc1.weight", "fc1.bias", "time1", "fc2.weight", "fc2.bias", "time2")


#: h's hidden size: 12 is solved in hidden space (_RK4Hidden, its loops in C++ where `make
#: install` built them, else in Python), 40 >= 2 x 16 in y's (_RK4, Python)
HIDDEN = {"hidden space": 12, "hidden space, Python loops": 12, "state space": 40}


@pytest.fixture(autouse=True)
def loops(request, monkeypatch):
    """Runs the "Python loops" forms with the C++ loops switched off."""
    form = request.node.callspec.params.get("form", "") if hasattr(request.node, "callspec") else ""
    monkeypatch.setattr(floater_loops, "USE_COMPILED", "Python loops" not in form)


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


def _steps(ode, start: int, end: int) -> int:
    """The rk4 steps of a solve over positions start .. end - 1 (torchdiffeq's grid)."""
    times = torch.arange(start, end, dtype=torch.float32) * ode.dt
    return solver.step_grid(times, ode.step).numel() - 1


def solve_terms(ode, steps: int, gradient: bool) -> int:
    """The terms summed along the way from h's weights and y0 to a result of a solve of ``steps``
    rk4 steps, counted as tests/helpers/tolerances.py counts them (each term at most EPS32 of the values
    it passes through, errors adding at most linearly):

    - forward, each evaluation of h (4 a step) adds its result into what the solve carries along
      the trajectory (the state y; in hidden space u and the running total of rho): 4 a step;
    - backward, each evaluation adds its term to the adjoint and to h's gradients, and these
      also sum over the states (torchdiffeq per evaluation; the hand-written backward in one
      matmul over a chunk's evaluations and states): 4 x states a step;
    - within one evaluation a value passes through two dot products, of dim terms (z W1, W2 W1)
      and of hidden terms (relu(p) W2, relu(p) M).

    Which operations a computation fuses (torch's vector kernels use FMA where the CPU has it,
    per ATEN_CPU_CAPABILITY) or how a BLAS splits a sum over threads changes the roundings, not
    their count.
    """
    states, dim, hidden = ode.initial.size(0), ode.dynamics.fc1.in_features, ode.dynamics.fc1.out_features
    return 4 * steps * (states if gradient else 1) + dim + hidden


def solve_tolerance(ode, steps: int, expected, gradient: bool, sides: int = 2) -> float:
    """float32_tolerance for a result of a solve (``gradient``: for a gradient through one) on
    values up to the largest entry of ``expected``. That the values summed stay below it holds
    for trajectories that change by a few times at most over a solve, as here (the drift test
    takes one growing a thousandfold, against float64). A gradient summed over many evaluations
    of either sign can be smaller than its terms: a sum of n terms of either sign is about
    sqrt(n) times their size, and so are its rounding errors (sqrt(n) EPS32 of the sum), within
    the count's n EPS32 of the sum."""
    return float32_tolerance(solve_terms(ode, steps, gradient), magnitude(expected), sides)


def _torchdiffeq(ode):
    return lambda field, y0, times: odeint(field, y0, times, method="rk4", options={"step_size": ode.step})


def _fast(ode):
    return lambda field, y0, times: rk4(field.weights, y0, times, ode.step)


@pytest.mark.numerics
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
    steps = _steps(ode, start, end)
    assert_within(got, expected, solve_tolerance(ode, steps, expected, gradient=False), "solution")
    for name in expected_grads:
        assert expected_grads[name].abs().max() > 1e-3, name  # every gradient is live
        assert_within(got_grads[name], expected_grads[name], solve_tolerance(ode, steps, expected_grads[name], True),
                      name)


def test_the_c_plus_plus_loops_are_built_where_a_compiler_is_found():
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler here: FLOATER runs its Python loops")
    assert floater_loops._floater_rk4 is not None, "`make install` should have built fairseq_posenc/_floater_rk4"
    assert floater_loops.compiled_loops(torch.zeros(1)) is floater_loops._floater_rk4
    assert floater_loops.compiled_loops(torch.zeros(1, dtype=torch.float64)) is None  # float32 only


@pytest.mark.numerics
@pytest.mark.skipif(floater_loops._floater_rk4 is None, reason="the C++ loops are not built")
@pytest.mark.parametrize("dim, states, length", [(64, 6, 130), (32, 4, 2)])
def test_c_plus_plus_loops_equal_the_python_loops(monkeypatch, dim, states, length):
    """The same operations in the same order; only the rounding of the loops and of the matmul's
    bias term differs. Once one rounding differs the two trajectories part like any two float32
    computations of the same steps: the same bound."""
    results = []
    for compiled in (True, False):
        monkeypatch.setattr(floater_loops, "USE_COMPILED", compiled)
        torch.manual_seed(1)
        ode = FloaterODE(states, dim, dim, dt=0.1, solver="rk4", step=None, adjoint=False)
        with torch.no_grad():
            for p in ode.parameters():
                p.normal_(std=dim**-0.5)
        solution = ode._solve(ode.initial, 0, length)
        assert type(solution.grad_fn).__name__ == "_RK4HiddenBackward"
        (solution * torch.linspace(-1, 1, solution.numel()).view_as(solution)).sum().backward()
        results.append([solution.detach()] + [p.grad for p in ode.parameters()])
    steps = _steps(ode, 0, length)
    names = ["solution"] + [name for name, _ in ode.named_parameters()]
    for name, got, expected in zip(names, *results):
        assert expected.abs().max() > 1e-3, name
        assert_within(got, expected, solve_tolerance(ode, steps, expected, gradient=name != "solution"), name)


@pytest.mark.numerics
@pytest.mark.parametrize("form", HIDDEN)
def test_a_nan_in_hs_hidden_layer_reaches_the_solution_and_gradients_as_through_torchdiffeq(form):
    """A relu that turned NaN into 0 would silently kill the unit, and fairseq's check of the
    gradients would not see it. torch's relu passes a NaN on, and so does its backward (it zeroes
    the gradient where the output is <= 0, which a NaN is not): the NaN fills the state after the
    first evaluation, and from there h's weight gradients, while the gradients that reach y0 and
    the biases only pass through the (finite) weights and keep finite values, those of torchdiffeq
    to float32 rounding."""
    ode = _ode(hidden=HIDDEN[form])
    with torch.no_grad():
        ode.dynamics.fc1.bias[2] = float("nan")
    y0 = ode.initial.detach().requires_grad_()
    expected, expected_grads = _solve_and_grads(ode, y0, 0, 10, _torchdiffeq(ode))
    got, got_grads = _solve_and_grads(ode, y0, 0, 10, _fast(ode))
    assert expected[1:].isnan().any() and expected_grads["fc1.weight"].isnan().any()
    assert not expected_grads["y0"].isnan().any()  # finite values to compare too
    steps = _steps(ode, 0, 10)
    for name, a, b in [("solution", got, expected)] + [(n, got_grads[n], expected_grads[n]) for n in expected_grads]:
        nan, expected_nan = a.isnan(), b.isnan()
        assert torch.equal(nan, expected_nan), f"{name}: {int(nan.sum())} NaN, torchdiffeq {int(expected_nan.sum())}"
        finite = ~expected_nan
        if finite.any():
            assert_within(a[finite], b[finite], solve_tolerance(ode, steps, b[finite], name != "solution"), name)


@pytest.mark.skipif(floater_loops._floater_rk4 is None, reason="the C++ loops are not built")
def test_the_c_plus_plus_loops_refuse_arguments_whose_sizes_disagree():
    """The loops index raw memory with sizes taken from u (forward) or rs (backward) and the
    step count: any other argument of another size must be refused, not read out of bounds."""
    loops = floater_loops._floater_rk4
    n, states, hidden = 3, 2, 5
    dts = [0.1] * n

    def forward(**change):
        args = {"u": torch.zeros(states, hidden), "bias1": torch.zeros(n, 4, hidden), "c": torch.zeros(n, 4, hidden),
                "m": torch.zeros(hidden, hidden), "dts": dts, "rs": torch.zeros(n, 4, states, hidden),
                "rho": torch.zeros(n, states, hidden)}
        args.update(change)
        loops.forward_steps(*args.values())

    def backward(**change):
        args = {"rs": torch.zeros(n, 4, states, hidden), "grad_rho": torch.zeros(n, states, hidden),
                "m": torch.zeros(hidden, hidden), "dts": dts, "chunk": 2, "grad_m": torch.zeros(hidden, hidden),
                "grad_c": torch.zeros(n, 4, hidden), "grad_b1": torch.zeros(n, 4, hidden)}
        args.update(change)
        return loops.backward_steps(*args.values())

    forward()  # the sizes that agree pass
    forward(rs=torch.zeros(1, 4, states, hidden))  # one evaluation's buffer, when nothing is kept
    assert backward().shape == (states, hidden)
    for run, change, message in [
        (forward, {"u": torch.zeros(states * hidden)}, "u must be 2-D (states, hidden), got [10]"),
        (forward, {"bias1": torch.zeros(n - 1, 4, hidden)}, "bias1 has size [2, 4, 5] but must be [3, 4, 5]"),
        (forward, {"c": torch.zeros(n, 4, hidden + 1)}, "c has size [3, 4, 6] but must be [3, 4, 5]"),
        (forward, {"m": torch.zeros(hidden, hidden + 1)}, "m has size [5, 6] but must be [5, 5]"),
        (forward, {"dts": dts + [0.1]}, "bias1 has size [3, 4, 5] but must be [4, 4, 5]"),
        (forward, {"rs": torch.zeros(n, 4, states + 1, hidden)}, "rs has size [3, 4, 3, 5] but must be [3, 4, 2, 5]"),
        (forward, {"rs": torch.zeros(2, 4, states, hidden)}, "rs has size [2, 4, 2, 5] but must be [3, 4, 2, 5]"),
        (forward, {"rho": torch.zeros(n, states, hidden - 1)}, "rho has size [3, 2, 4] but must be [3, 2, 5]"),
        (backward, {"rs": torch.zeros(n, states, hidden)}, "rs must be 4-D (steps, 4, states, hidden), got [3, 2, 5]"),
        (backward, {"dts": dts[:-1]}, "rs has size [3, 4, 2, 5] but must be [2, 4, 2, 5]"),
        (backward, {"grad_rho": torch.zeros(n, states + 1, hidden)},
         "grad_rho has size [3, 3, 5] but must be [3, 2, 5]"),
        (backward, {"m": torch.zeros(hidden + 1, hidden + 1)}, "m has size [6, 6] but must be [5, 5]"),
        (backward, {"grad_m": torch.zeros(hidden, 1)}, "grad_m has size [5, 1] but must be [5, 5]"),
        (backward, {"grad_c": torch.zeros(n, 4, 1)}, "grad_c has size [3, 4, 1] but must be [3, 4, 5]"),
        (backward, {"grad_b1": torch.zeros(n + 1, 4, hidden)}, "grad_b1 has size [4, 4, 5] but must be [3, 4, 5]"),
        (backward, {"chunk": 0}, "chunk must be positive, got 0"),
    ]:
        with pytest.raises(RuntimeError, match=re.escape(message)):
            run(**change)


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


@pytest.mark.numerics
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
        solution = ode.positions(25)
        solution.pow(2).sum().backward()
        grads.append({name: p.grad for name, p in ode.named_parameters()})
    assert grads[0].keys() == grads[1].keys() == {"initial"} | {"dynamics." + n for n in H}
    steps = _steps(ode, 0, solution.size(0))
    for name in grads[0]:
        if warm and name in ("dynamics.fc1.weight", "dynamics.fc1.bias", "dynamics.time1"):
            # with fc2 = 0 no gradient reaches fc1: exactly 0 either way, nothing rounded
            assert not grads[0][name].any() and not grads[1][name].any(), name
            continue
        assert grads[1][name].abs().max() > 1e-3, name
        assert_within(grads[0][name], grads[1][name], solve_tolerance(ode, steps, grads[1][name], True), name)


@pytest.mark.numerics
@pytest.mark.parametrize("form", HIDDEN)
def test_fast_rk4_solves_in_float32_under_autocast(form):
    ode = _ode(hidden=HIDDEN[form])
    with torch.no_grad():
        plain = ode._solve(ode.initial, 0, 30)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under_autocast = ode._solve(ode.initial, 0, 30)
    assert under_autocast.dtype == torch.float32
    # exact: autocast is switched off around the solve, so both run the same operations on the
    # same values (no tolerance for a rounding that cannot differ)
    torch.testing.assert_close(under_autocast, plain, atol=0, rtol=0)


@pytest.mark.numerics
@pytest.mark.parametrize("form", HIDDEN)
def test_fast_rk4_without_gradients_equals_the_solution_with_them(form):
    ode = _ode(hidden=HIDDEN[form])
    with torch.no_grad():
        kept = ode._solve(ode.initial, 0, 30)
    # exact: keeping each evaluation for the backward changes where relu(p) is written, not what
    # is computed (at these sizes each step's buffers start on a 64-byte boundary either way, so
    # the BLAS takes the same path)
    torch.testing.assert_close(ode._solve(ode.initial, 0, 30).detach(), kept, atol=0, rtol=0)


@pytest.mark.slow  # about 10 s each
@pytest.mark.numerics
@pytest.mark.parametrize("form", HIDDEN)
@torch.no_grad()
def test_fast_rk4_stays_within_float32_rounding_of_the_exact_steps_over_600_positions(form):
    """3,000 steps, with a state that grows by three orders of magnitude: the hidden-space form
    associates its sums differently, and its rounding could build up along the trajectory faster
    than linearly in the steps. Both float32 solves are held against torchdiffeq's steps in
    float64 (only the float32 side rounds: some 1e-12 of the scale in float64) to the bound of
    :func:`solve_tolerance` on the largest entry: errors made while the state was small and
    carried along as it grows stay within it."""
    ode = _ode(hidden=HIDDEN[form])
    field = ode.dynamics.float32()
    times = torch.arange(600, dtype=torch.float32) * ode.dt
    exact = odeint(type(field)(tuple(w.double() for w in field.weights)), ode.initial.double(), times.double(),
                   method="rk4", options={"step_size": ode.step})
    scale = exact.abs().max()
    assert scale > 100 * ode.initial.abs().max()  # the trajectory moves far
    tolerance = solve_tolerance(ode, _steps(ode, 0, 600), exact, gradient=False, sides=1)
    error = {}
    for name, solve in (("torchdiffeq", _torchdiffeq(ode)), ("fast", _fast(ode))):
        solution = solve(field, ode.initial, times).double()
        assert_within(solution, exact, tolerance, name)
        error[name] = (solution - exact).abs().max().item()
    # The worst-case bound above is loose (measured errors are ~1% of it); against torchdiffeq's
    # own float32 rounding of the same steps the fast form may differ by a factor, not build up:
    # at most twice its error, plus the rounding of one evaluation of h at the largest value.
    one_evaluation = float32_tolerance(terms=16 + HIDDEN[form], magnitude=scale, sides=1)
    assert error["fast"] <= 2 * error["torchdiffeq"] + one_evaluation, error
