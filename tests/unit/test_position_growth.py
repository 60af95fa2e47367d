"""scripts/plot_positions.py's view of the biases past the training lengths (issue 32, item 4): the
norm curve beside each heatmap, and the growth diagnostic for FLOATER and the RNN encoders, checked
against models whose growth and Jacobian are known in closed form."""
import math
import os

import numpy as np
import pytest
import torch

from helpers.scripts import script
from helpers.toy import build_model

plot_positions = script("plot_positions")

DIM = 32  # the toy models' attention width


def _rotation_plus(a: float, b: float) -> torch.Tensor:
    """A = a I + b S, S the block-diagonal rotation generator [[0, 1], [-1, 0]]: S is skew, so
    ||p exp(A t)|| = exp(a t) ||p|| exactly, and A's eigenvalues are a +- i b."""
    s = torch.zeros(DIM, DIM)
    for i in range(0, DIM, 2):
        s[i, i + 1], s[i + 1, i] = 1.0, -1.0
    return a * torch.eye(DIM) + b * s


def linear_floater(a: float, b: float = 0.7, longest: int = 10, *flags):
    """A FLOATER model whose h is exactly p -> p A: hidden = 2 d, relu(p [I, -I]) [A; -A] = p A
    (relu(p) - relu(-p) = p), every bias and time term 0."""
    model = build_model("transformer_posenc", "--position-encoding", "floater", "--floater-hidden", str(2 * DIM),
                        *flags, seed=3)
    ode = model.encoder.position_encoding.ode
    dyn = ode.dynamics
    a_matrix = _rotation_plus(a, b)
    with torch.no_grad():
        eye = torch.eye(DIM)
        dyn.fc1.weight.copy_(torch.cat([eye, -eye]))  # (2d, d): h's input layer, p -> [p, -p]
        dyn.fc2.weight.copy_(torch.cat([a_matrix, -a_matrix]).t())  # (d, 2d): [r+, r-] -> (r+ - r-) A
        for p in (dyn.fc1.bias, dyn.fc2.bias, dyn.time1, dyn.time2):
            p.zero_()
        ode.initial.copy_(torch.randn(ode.initial.shape, generator=torch.Generator().manual_seed(0)))
    for stack in (model.encoder, model.decoder):
        stack.longest_trained.fill_(longest)
    return model


@pytest.mark.parametrize("a", [0.5, -0.3])
def test_floater_growth_and_eigenvalue_of_a_known_linear_flow(a):
    """dp/dt = p A: ||p(t)|| = exp(a t) ||p(0)||, so log ||p_i|| rises by a dt per position, and the
    top real part of A's eigenvalues a +- 0.7 i is a."""
    model = linear_floater(a)
    d = plot_positions.growth_diagnostic(model, 60)
    dt = 0.1
    assert d["kind"] == "flow" and d["longest"] == 10 and d["recorded"]
    assert d["slope"] == pytest.approx(a * dt, rel=1e-4)
    assert d["factor_per_position"] == pytest.approx(math.exp(a * dt), rel=1e-5)
    assert d["ratio"] == pytest.approx(math.exp(a * dt * (59 - 9)), rel=1e-3)
    assert d["top_eigenvalue"] == pytest.approx(a, abs=1e-5)
    line = plot_positions.describe_growth(d)
    assert f"x{math.exp(a * dt):.3g} per position" in line and f"{a:.3g}" in line


def test_floater_eigenvalue_sees_the_relu_and_the_lr_scale():
    """Only the active half of the hidden layer counts: with fc2 = [A; 0] h is relu(p) A, whose
    Jacobian at p is diag(p > 0) A (column convention: A^T diag(p > 0)); W = C V under
    --floater-lr-scale C (the stored V times C is the map)."""
    model = linear_floater(0.2, 0.0, 10, "--floater-lr-scale", "2")
    dyn = model.encoder.position_encoding.ode.dynamics
    rng = torch.Generator().manual_seed(4)
    a_matrix = torch.randn(DIM, DIM, generator=rng) * 0.3
    with torch.no_grad():
        dyn.fc1.weight.copy_(torch.cat([torch.eye(DIM), -torch.eye(DIM)]) / 2)  # stored V = W / 2
        dyn.fc2.weight.copy_(torch.cat([a_matrix, torch.zeros(DIM, DIM)]).t() / 2)
    d = plot_positions.growth_diagnostic(model, 40)
    ode = model.encoder.position_encoding.ode
    with torch.no_grad():
        p = ode.positions(40)[9].double()  # p at the end of the trained range, every state
    expected = max(float(np.linalg.eigvals((np.diag((row > 0).numpy().astype(float)) @ a_matrix.double().numpy())).real.max())
                   for row in p)
    assert d["top_eigenvalue"] == pytest.approx(expected, abs=1e-5)


def test_rnn_step_jacobian_against_its_closed_form():
    """p_{i+1} = tanh(s p_i): dp_{i+1}/dp_i = s diag(1 - p_{i+1}^2), whose largest modulus is
    s max(1 - p_L^2) over the coordinates (and over the states)."""
    model = build_model("transformer_posenc", "--position-encoding", "rnn", seed=2)
    ode = model.encoder.position_encoding.ode
    s = 1.3
    with torch.no_grad():
        layer = ode.layers[0]
        layer.fc.weight.copy_(s * torch.eye(DIM))
        layer.fc.bias.zero_()
        layer.z.weight.zero_()
        ode.initial.copy_(torch.randn(ode.initial.shape, generator=torch.Generator().manual_seed(1)))
    for stack in (model.encoder, model.decoder):
        stack.longest_trained.fill_(12)
    d = plot_positions.growth_diagnostic(model, 30)
    with torch.no_grad():
        p = ode.positions(30)[:30].double().numpy()
    assert d["kind"] == "map"
    assert d["top_eigenvalue"] == pytest.approx(float((s * (1 - p[12] ** 2)).max()), rel=1e-5)
    # the growth fit: numpy's least squares on the same norms, the fastest-growing state
    slopes = [np.polyfit(np.arange(11, 30), np.log(np.linalg.norm(p[11:, k], axis=-1)), 1)[0] for k in range(p.shape[1])]
    assert d["slope"] == pytest.approx(max(slopes), rel=1e-6, abs=1e-12)
    assert abs(d["slope"]) < 0.05  # tanh keeps the recurrence bounded: no growth to speak of


def test_other_encodings_have_no_growth_diagnostic():
    assert plot_positions.growth_diagnostic(build_model("transformer_posenc", "--position-encoding", "rope")) is None


def test_norm_curve_is_each_panels_norm_by_position():
    model = linear_floater(0.5)
    arrays = plot_positions.position_arrays(model, 40)
    checked = 0
    for name, entry in arrays.items():
        for title, image, extent, limit, marks, (ylabel, xlabel) in plot_positions._panels(name, entry):
            x, norms = plot_positions.norm_curve(image, extent, ylabel)
            assert np.allclose(norms, np.linalg.norm(entry.array, axis=1), rtol=1e-6), title
            assert list(x) == list(range(entry.array.shape[0]))
            checked += 1
    assert checked >= 12  # q, k, v of 4 self-attention blocks
    # the curve's axis is the offsets in a by-offset bias (head x offset)
    image = np.array([[3.0, 0.0, 1.0], [4.0, 0.0, np.nan]])
    x, norms = plot_positions.norm_curve(image, (-1.5, 1.5, 1.5, -0.5), "head")
    assert list(x) == [-1, 0, 1] and np.allclose(norms, [5.0, 0.0, 1.0])


@pytest.mark.slow  # matplotlib
def test_plot_draws_a_log_scale_norm_curve_beside_each_heatmap(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))
    model = linear_floater(0.5, 0.7, 10, "--position-blocks", "input")  # 7 panels, not 13: a quicker figure
    arrays = plot_positions.position_arrays(model, 40)
    panels = plot_positions.plot(arrays, str(tmp_path / "p.png"), "floater")
    assert os.path.getsize(tmp_path / "p.png") > 0
    (fig,) = figures
    curves = [ax for ax in fig.axes if ax.get_yscale() == "log"]
    assert len(curves) == panels
    growing = 0
    for ax in curves:  # the longest trained length (10) marked on each curve
        assert any(list(line.get_xdata()) == [9.5, 9.5] for line in ax.get_lines())
        plotted = ax.get_lines()[0].get_ydata()
        # the biases' norms, not fitted to the trained rows: exp(a dt) per position past them too
        growing += plotted[-1] / plotted[9] == pytest.approx(math.exp(0.05 * 30), rel=1e-3)
    assert growing == 6  # the q, k, v biases of the 2 input blocks (the input embedding's norm is flat)
