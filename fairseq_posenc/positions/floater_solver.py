"""FLOATER's rk4 solve with a hand-written backward: torchdiffeq's fixed-step rk4, the same
arithmetic, without an autograd graph.

torchdiffeq's ``odeint(method="rk4", options={"step_size": s})`` takes steps of ``s`` from the
first output time (the last step ends exactly on the last one), evaluates h four times per step
(the 3/8 rule, ``rk4_alt_step_func``) and reads the outputs off the steps by linear
interpolation. At step dt / 5 that is 20 evaluations of h per position, each two small matmuls on
a state of (block states, width): the cost is per-operation overhead, and the backward through
autograd's graph of thousands of nodes costs more than the solve. Here:

- the forward runs the same steps with the same operations in the same order (same solution to
  float32 rounding) and stores each evaluation's input z and hidden activation relu(z W1 + ...);
- the backward is the discrete adjoint of those steps: it runs them backwards with the
  vector-Jacobian products of h written out (one matmul pair and one relu mask per evaluation),
  and h's weight gradients come from one large matmul per chunk of steps rather than two small
  ones per evaluation.

h(t, z) = relu(z W1 + b1 + t time1) W2 + b2 + t time2 (:class:`~.floater.Float32Field`).
"""
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

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


class _RK4(torch.autograd.Function):
    @staticmethod
    def forward(ctx, times: Tensor, step: float, y0: Tensor, w1: Tensor, b1: Tensor, time1: Tensor,
                w2: Tensor, b2: Tensor, time2: Tensor) -> Tensor:
        store = any(ctx.needs_input_grad[2:])
        grid = step_grid(times, step)
        t0, t1 = grid[:-1], grid[1:]
        dt = t1 - t0
        # the times of the four evaluations of each step, computed as torchdiffeq does: (N, 4)
        stage_times = torch.stack([t0, t0 + dt * (1 / 3), t0 + dt * (2 / 3), t1], dim=1)
        # h's time terms for every evaluation at once: (N, 4, hidden) and (N, 4, dim)
        bias1 = b1 + stage_times[..., None] * time1
        bias2 = b2 + stage_times[..., None] * time2
        n, (states, dim), hidden = dt.numel(), y0.shape, w1.size(1)
        ys = y0.new_empty(n + 1, states, dim)
        ys[0] = y0
        if store:  # each evaluation's input and hidden activation, for the backward
            zs = y0.new_empty(n, 4, states, dim)
            hs = y0.new_empty(n, 4, states, hidden)
        else:
            zs, hs = y0.new_empty(1, 4, states, dim), y0.new_empty(1, 4, states, hidden)

        for i, h in enumerate(dt.tolist()):
            s = i if store else 0
            z, hid = zs[s], hs[s]
            y = ys[i]

            def f(stage: int, x: Tensor) -> Tensor:
                torch.addmm(bias1[i, stage], x, w1, out=hid[stage]).relu_()
                return torch.addmm(bias2[i, stage], hid[stage], w2)

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
        y_start, y_end = ys[steps], ys[steps + 1]
        inside = y_start + slope[:, None, None] * (y_end - y_start)
        out = torch.where(at_start[:, None, None], y_start, torch.where(at_end[:, None, None], y_end, inside))
        out = torch.cat([y0[None], out])
        if store:
            ctx.save_for_backward(stage_times, dt, ys, zs, hs, steps, slope, at_start, at_end, w1, w2)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        stage_times, dt, ys, zs, hs, steps, slope, at_start, at_end, w1, w2 = ctx.saved_tensors
        n, _, states, dim = zs.shape
        hidden = hs.size(-1)
        # gradient arriving at each grid state from the interpolated outputs
        grad_ys = torch.zeros_like(ys)
        grad_ys[0] += grad_out[0]
        g = grad_out[1:]
        w_start = torch.where(at_start, 1.0, torch.where(at_end, 0.0, 1 - slope))
        w_end = torch.where(at_end, 1.0, torch.where(at_start, 0.0, slope))
        grad_ys.index_add_(0, steps, g * w_start[:, None, None])
        grad_ys.index_add_(0, steps + 1, g * w_end[:, None, None])

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
                """z's gradient from h's output gradient; keeps both for the weight gradients."""
                go[stage] = grad
                torch.ops.aten.threshold_backward.grad_input(grad.mm(w2t), hid[stage], 0, grad_input=gp[stage])
                return gp[stage].mm(w1t)

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
        return None, None, adjoint, gw1, gb1, gtime1, gw2, gb2, gtime2


def rk4(weights: Sequence[Tensor], y0: Tensor, times: Tensor, step: float) -> Tensor:
    """``odeint(Float32Field(weights), y0, times, method="rk4", options={"step_size": step})``:
    (len(times), *y0.shape), differentiable in ``y0`` and the weights."""
    with torch.autocast(device_type=y0.device.type, enabled=False):
        return _RK4.apply(times, step, y0, *weights)
