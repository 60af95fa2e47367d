"""FLOATER's rk4 solve with a hand-written backward: torchdiffeq's fixed-step rk4, the same
arithmetic, without an autograd graph.

torchdiffeq's ``odeint(method="rk4", options={"step_size": s})`` takes steps of ``s`` from the
first output time (the last step ends exactly on the last one), evaluates h four times per step
(the 3/8 rule, ``rk4_alt_step_func``) and reads the outputs off the steps by linear
interpolation. At step dt / 5 that is 20 evaluations of h per position, each two small matmuls on
a state of (block states, width): the cost is per-operation overhead, and the backward through
autograd's graph of thousands of nodes costs more than the solve. Here:

- the forward runs the same steps (``_RK4``: the same operations in the same order, the same
  solution bit for bit; ``_RK4Hidden``, the default at h's usual sizes: the same steps carried in
  h's hidden space, half the matmuls, the same solution to float32 rounding) and stores what the
  backward needs of each evaluation;
- the backward is the discrete adjoint of those steps: it runs them backwards with the
  vector-Jacobian products of h written out (one or two matmuls and one relu mask per
  evaluation), and h's weight gradients come from one large matmul per chunk of steps rather
  than small ones per evaluation.

The hidden-space loops also exist in C++ (``fairseq_posenc/csrc/floater_rk4.cpp``, built by
``make install``; :mod:`.loops`), the same operations without Python's cost per
operation; everything around the loops stays here. Timings of torchdiffeq, the Python loops and
the C++ loops (``scripts/benchmark.py --floater-solve``): docs/floater_results.md.

h(t, z) = relu(z W1 + b1 + t time1) W2 + b2 + t time2 (:class:`~.dynamics.Float32Field`). With
--floater-dissipation LAMBDA the field is tanh(h(t, z)) - LAMBDA z, which is not linear in h's
hidden layer: it runs in :class:`_RK4`'s loops (state space, Python), whose backward carries the
tanh's slope and the decay.
"""
from typing import Sequence

import torch
from torch import Tensor

from .config import FIXED_STEP_SOLVERS
from .loops import _WEIGHTS, loops_for

#: steps whose weight gradients are gathered into one matmul (bounds the backward's buffers)
CHUNK = 64


def step_grid(times: Tensor, step: float) -> Tensor:
    """torchdiffeq's grid for a fixed step (``_grid_constructor_from_step_size``), op for op."""
    start, end = times[0], times[-1]
    count = torch.ceil((end - start) / step + 1).item()
    grid = torch.arange(0, count, dtype=times.dtype, device=times.device) * step + start
    grid[-1] = times[-1]
    return grid


def _interpolation(times: Tensor, grid: Tensor):
    """Where torchdiffeq reads output j > 0: in the first step whose end is >= times[j], as
    y0 + slope (y1 - y0), or exactly y0 / y1 when the time is the step's start / end."""
    ends = grid[1:]
    steps = torch.searchsorted(ends, times[1:], side="left")
    t0, t1 = grid[steps], ends[steps]
    slope = (times[1:] - t0) / (t1 - t0)
    return steps, slope, times[1:] == t0, times[1:] == t1


def _read(y_start: Tensor, y_end: Tensor, slope: Tensor, at_start: Tensor, at_end: Tensor) -> Tensor:
    """The outputs read off the steps that hold them (:func:`_interpolation`)."""
    inside = y_start + slope[:, None, None] * (y_end - y_start)
    return torch.where(at_start[:, None, None], y_start, torch.where(at_end[:, None, None], y_end, inside))


def _read_backward(grad_out: Tensor, n: int, steps: Tensor, slope: Tensor, at_start: Tensor,
                   at_end: Tensor) -> Tensor:
    """The backward of reading the outputs (the first is y0, then :func:`_read`): the gradient on y at
    each of the n + 1 grid points, (n + 1, states, dim)."""
    grad_ys = grad_out.new_zeros(n + 1, *grad_out.shape[1:])
    grad_ys[0] += grad_out[0]
    g = grad_out[1:]
    w_start = torch.where(at_start, 1.0, torch.where(at_end, 0.0, 1 - slope))
    w_end = torch.where(at_end, 1.0, torch.where(at_start, 0.0, slope))
    grad_ys.index_add_(0, steps, g * w_start[:, None, None])
    grad_ys.index_add_(0, steps + 1, g * w_end[:, None, None])
    return grad_ys


def _stages(times: Tensor, step: float, b1: Tensor, time1: Tensor, b2: Tensor, time2: Tensor):
    """The grid, its steps dt (N,), the times of the four evaluations of each step computed as
    torchdiffeq does (N, 4), and h's time terms for every evaluation at once: (N, 4, hidden) and
    (N, 4, dim)."""
    grid = step_grid(times, step)
    t0, t1 = grid[:-1], grid[1:]
    dt = t1 - t0
    stage_times = torch.stack([t0, t0 + dt * (1 / 3), t0 + dt * (2 / 3), t1], dim=1)
    return grid, dt, stage_times, b1 + stage_times[..., None] * time1, b2 + stage_times[..., None] * time2


class _RK4(torch.autograd.Function):
    @staticmethod
    def forward(ctx, times: Tensor, step: float, dissipation: float, y0: Tensor, w1: Tensor, b1: Tensor,
                time1: Tensor, w2: Tensor, b2: Tensor, time2: Tensor) -> Tensor:
        store = any(ctx.needs_input_grad[3:])
        grid, dt, stage_times, bias1, bias2 = _stages(times, step, b1, time1, b2, time2)
        n, (states, dim), hidden = dt.numel(), y0.shape, w1.size(1)
        ys = y0.new_empty(n + 1, states, dim)
        ys[0] = y0
        if store:  # each evaluation's input and hidden activation, for the backward
            zs = y0.new_empty(n, 4, states, dim)
            hs = y0.new_empty(n, 4, states, hidden)
        else:
            zs, hs = y0.new_empty(1, 4, states, dim), y0.new_empty(1, 4, states, hidden)
        # --floater-dissipation LAMBDA: k = tanh(h) - LAMBDA z; each evaluation's tanh(h), for the backward
        squashed = y0.new_empty(n if store else 1, 4, states, dim) if dissipation else None

        for i, h in enumerate(dt.tolist()):
            s = i if store else 0
            z, hid = zs[s], hs[s]
            y = ys[i]

            def f(stage: int, x: Tensor) -> Tensor:
                torch.addmm(bias1[i, stage], x, w1, out=hid[stage]).relu_()
                out = torch.addmm(bias2[i, stage], hid[stage], w2)
                if not dissipation:
                    return out
                torch.tanh(out, out=squashed[s, stage])
                return squashed[s, stage] - dissipation * x

            z[0] = y
            k1 = f(0, y)
            torch.add(y, k1 * h * (1 / 3), out=z[1])
            k2 = f(1, z[1])
            torch.add(y, (k2 - k1 * (1 / 3)) * h, out=z[2])
            k3 = f(2, z[2])
            torch.add(y, (k1 - k2 + k3) * h, out=z[3])
            k4 = f(3, z[3])
            torch.add(y, (k1 + 3 * (k2 + k3) + k4) * h * 0.125, out=ys[i + 1])

        steps, slope, at_start, at_end = _interpolation(times, grid)
        out = torch.cat([y0[None], _read(ys[steps], ys[steps + 1], slope, at_start, at_end)])
        if store:
            ctx.dissipation = dissipation
            ctx.save_for_backward(stage_times, dt, ys, zs, hs, steps, slope, at_start, at_end, w1, w2,
                                  squashed if dissipation else None)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        stage_times, dt, ys, zs, hs, steps, slope, at_start, at_end, w1, w2, squashed = ctx.saved_tensors
        dissipation = ctx.dissipation
        n, _, states, dim = zs.shape
        hidden = hs.size(-1)
        grad_ys = _read_backward(grad_out, n, steps, slope, at_start, at_end)

        gw1, gw2 = w1.new_zeros(w1.shape), w2.new_zeros(w2.shape)
        gb1_t = w1.new_zeros(n, 4, hidden)  # per evaluation, summed over states
        gb2_t = w1.new_zeros(n, 4, dim)
        w1t, w2t = w1.t(), w2.t()
        chunk = min(CHUNK, n)
        g_out = ys.new_empty(chunk, 4, states, dim)  # gradient on h's output
        g_pre = ys.new_empty(chunk, 4, states, hidden)  # on its pre-activation

        adjoint = grad_ys[n].clone()
        dts = dt.tolist()
        for i in range(n - 1, -1, -1):
            c, h = i % chunk, dts[i]  # chunks are steps [k chunk, (k + 1) chunk)
            go, gp, hid = g_out[c], g_pre[c], hs[i]

            def vjp(stage: int, grad: Tensor) -> Tensor:
                """z's gradient from the field's output gradient; keeps h's output and pre-activation
                gradients for the weight gradients."""
                if dissipation:  # k = tanh(h) - LAMBDA z
                    torch.mul(grad, 1 - squashed[i, stage] ** 2, out=go[stage])
                else:
                    go[stage] = grad
                torch.ops.aten.threshold_backward.grad_input(go[stage].mm(w2t), hid[stage], 0, grad_input=gp[stage])
                gz = gp[stage].mm(w1t)
                return gz - dissipation * grad if dissipation else gz

            # the step y1 = y0 + (k1 + 3 (k2 + k3) + k4) h / 8 backwards, k4 first:
            # z2 = y0 + h k1 / 3, z3 = y0 + h (k2 - k1 / 3), z4 = y0 + h (k1 - k2 + k3)
            a = adjoint
            gk4 = a * (h * 0.125)
            gz4 = vjp(3, gk4)
            gk3 = a * (3 * h * 0.125) + gz4 * h
            gz3 = vjp(2, gk3)
            gk2 = a * (3 * h * 0.125) + (gz3 - gz4) * h
            gz2 = vjp(1, gk2)
            gk1 = gk4 + (gz4 + (gz2 - gz3) * (1 / 3)) * h
            gz1 = vjp(0, gk1)
            adjoint = a + gz1 + gz2 + gz3 + gz4 + grad_ys[i]

            if c == 0:  # the chunk is done: its weight gradients in one matmul each
                count = min(chunk, n - i)
                done = slice(i, i + count)
                gw2.addmm_(hs[done].reshape(-1, hidden).t(), g_out[:count].reshape(-1, dim))
                gw1.addmm_(zs[done].reshape(-1, dim).t(), g_pre[:count].reshape(-1, hidden))
                gb2_t[done] = g_out[:count].sum(2)
                gb1_t[done] = g_pre[:count].sum(2)

        gb1, gb2 = gb1_t.sum((0, 1)), gb2_t.sum((0, 1))
        gtime1 = (stage_times[..., None] * gb1_t).sum((0, 1))
        gtime2 = (stage_times[..., None] * gb2_t).sum((0, 1))
        return None, None, None, adjoint, gw1, gb1, gtime1, gw2, gb2, gtime2


class _RK4Hidden(torch.autograd.Function):
    """The same steps carried in h's hidden space: half the matmuls.

    With k = relu(p) W2 + b2(t), the next pre-activation p = z W1 + b1(t) only ever needs z W1,
    and z is y plus a combination of the k's. Carrying u = y W1 (and q = k W1 = relu(p) M + b2(t) W1
    with M = W2 W1) costs one (states x hidden x hidden) matmul per evaluation instead of two of
    (states x dim x hidden). y itself is y0 + (the weighted sum of the relu(p)'s) W2 + the b2
    terms, computed with one matmul at the end for the positions read. The steps are those of
    torchdiffeq's rk4 in exact arithmetic; in float32 the sums are associated differently
    (``tests/unit/test_floater_solver.py``: the same solution and gradients to float32 rounding, a bound
    derived from the terms each result sums).
    """

    @staticmethod
    def forward(ctx, times: Tensor, step: float, y0: Tensor, w1: Tensor, b1: Tensor, time1: Tensor,
                w2: Tensor, b2: Tensor, time2: Tensor) -> Tensor:
        store = any(ctx.needs_input_grad[2:])
        grid, dt, stage_times, bias1, bias2 = _stages(times, step, b1, time1, b2, time2)
        n, (states, dim), hidden = dt.numel(), y0.shape, w1.size(1)
        m = w2.mm(w1)  # (hidden, hidden)
        c = bias2.view(-1, dim).mm(w1).view(n, 4, hidden)  # b2(t) W1
        u = y0.mm(w1)
        # each evaluation's relu(p), which is all the backward needs: (N, 4, states, hidden)
        rs = y0.new_empty(n if store else 1, 4, states, hidden)
        # the steps' weighted sums of relu(p), whose running total times W2 moves y
        rho = y0.new_empty(n, states, hidden)
        loops = loops_for(u)
        loops.forward_steps(u.contiguous(), bias1.contiguous(), c.contiguous(), m.contiguous(), dt.tolist(), rs, rho)
        weights = dt[:, None] * dt.new_tensor(_WEIGHTS)  # (N, 4)
        beta = (weights[..., None] * bias2).sum(1)  # (N, dim): the b2 terms of each step
        zero = y0.new_zeros(1, states, hidden)
        totals = torch.cat([zero, loops.running_sums(rho, False)])  # (N + 1, states, hidden)
        beta_totals = torch.cat([beta.new_zeros(1, dim), beta.cumsum(0)])  # (N + 1, dim)

        steps, slope, at_start, at_end = _interpolation(times, grid)
        read = torch.cat([steps, steps + 1])
        ys = y0 + totals[read].matmul(w2) + beta_totals[read][:, None]
        out = _read(*ys.chunk(2), slope, at_start, at_end)
        if store:
            ctx.save_for_backward(stage_times, dt, rs, rho, y0, m, c, bias2, steps, slope, at_start, at_end,
                                  w1, w2)
        return torch.cat([y0[None], out])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        (stage_times, dt, rs, rho, y0, m, c, bias2, steps, slope, at_start, at_end, w1, w2) = ctx.saved_tensors
        n, _, states, hidden = rs.shape
        dim = y0.size(1)
        grad_ys = _read_backward(grad_out, n, steps, slope, at_start, at_end)
        # y_j = y0 + (rho_0 + ... + rho_{j-1}) W2 + (beta_0 + ... + beta_{j-1}): step i's sums reach
        # every y after it
        loops = loops_for(grad_ys)
        later = loops.running_sums(grad_ys, True)[1:]
        grad_y0 = grad_ys.sum(0)
        grad_w2 = rho.reshape(-1, hidden).t().mm(later.reshape(-1, dim))
        grad_rho = later.matmul(w2.t())  # (N, states, hidden)
        grad_beta = later.sum(1)  # (N, dim)

        grad_m = m.new_zeros(m.shape)
        grad_c = c.new_zeros(c.shape)  # summed over states: (N, 4, hidden)
        grad_b1_t = c.new_zeros(c.shape)
        chunk = min(CHUNK, n)
        adjoint = loops.backward_steps(rs, grad_rho.contiguous(), m.contiguous(), dt.tolist(), chunk, grad_m, grad_c,
                                       grad_b1_t)

        # u0 = y0 W1, M = W2 W1, c = b2(t) W1
        grad_y0 = grad_y0 + adjoint.mm(w1.t())
        grad_w1 = y0.t().mm(adjoint) + w2.t().mm(grad_m) + bias2.reshape(-1, dim).t().mm(grad_c.reshape(-1, hidden))
        grad_w2 = grad_w2 + grad_m.mm(w1.t())
        weights = dt[:, None] * dt.new_tensor(_WEIGHTS)
        grad_b2_t = grad_c.matmul(w1.t()) + weights[..., None] * grad_beta[:, None]  # (N, 4, dim)
        grad_b1, grad_b2 = grad_b1_t.sum((0, 1)), grad_b2_t.sum((0, 1))
        grad_time1 = (stage_times[..., None] * grad_b1_t).sum((0, 1))
        grad_time2 = (stage_times[..., None] * grad_b2_t).sum((0, 1))
        return None, None, grad_y0, grad_w1, grad_b1, grad_time1, grad_w2, grad_b2, grad_time2


def rk4(weights: Sequence[Tensor], y0: Tensor, times: Tensor, step: float, dissipation: float = 0.0) -> Tensor:
    """``odeint(Float32Field(weights, dissipation), y0, times, method="rk4", options={"step_size": step})``:
    (len(times), *y0.shape), differentiable in ``y0`` and the weights, in the dtype of ``y0``
    whatever autocast asks for. With ``dissipation`` (--floater-dissipation) the field
    -LAMBDA p + tanh(h) is not linear in h's hidden layer: it runs in :class:`_RK4`'s loops."""
    dim, hidden = weights[0].shape
    with torch.autocast(device_type=y0.device.type, enabled=False):
        if dissipation:
            return _RK4.apply(times, step, float(dissipation), y0, *weights)
        # an evaluation costs (states x hidden x hidden) in hidden space, 2 (states x dim x hidden) in y's
        if hidden < 2 * dim:
            return _RK4Hidden.apply(times, step, y0, *weights)
        return _RK4.apply(times, step, 0.0, y0, *weights)


def solve(field, y0: Tensor, times: Tensor, method: str, step: float, adjoint: bool) -> Tensor:
    """p at ``times`` from p(times[0]) = y0 under ``field`` (:class:`~.dynamics.Float32Field`) with
    torchdiffeq's ``method``: FLOATER's own rk4 where it applies, torchdiffeq otherwise, with the
    adjoint method under autograd if ``adjoint``."""
    from torchdiffeq import odeint, odeint_adjoint

    options = {"step_size": step} if method in FIXED_STEP_SOLVERS else None
    if method == "rk4" and not (adjoint and torch.is_grad_enabled()):
        # torchdiffeq's rk4 op for op, with a hand-written backward
        return rk4(field.weights, y0, times, step, field.dissipation)
    if adjoint and torch.is_grad_enabled():
        # the solve differentiates the float32 weights; their casts carry the gradients on
        return odeint_adjoint(field, y0, times, method=method, options=options,
                              adjoint_params=tuple(w for w in field.weights if w.requires_grad))
    return odeint(field, y0, times, method=method, options=options)
