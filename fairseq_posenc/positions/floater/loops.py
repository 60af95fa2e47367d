"""The step loops of FLOATER's hidden-space rk4 (:class:`~.solver._RK4Hidden`): in C++ where the
extension is built (``fairseq_posenc/csrc/floater_rk4.cpp``, by ``make install``), else in Python
with the same signatures."""
from typing import Sequence

import torch
from torch import Tensor

try:  # the step loops in C++, built by `make install` (setup.py) where a C++ compiler is found
    from ... import _floater_rk4
except ImportError:
    _floater_rk4 = None

#: False runs the Python loops even where the C++ ones are built (tests compare the two)
USE_COMPILED = True

#: the rk4 weights of a step's four evaluations: y1 = y0 + h / 8 (k1 + 3 k2 + 3 k3 + k4)
_WEIGHTS = (0.125, 0.375, 0.375, 0.125)


def compiled_loops(like: Tensor):
    """The C++ step loops for tensors like ``like``, or None: they run float32 on the CPU."""
    if USE_COMPILED and _floater_rk4 is not None and like.device.type == "cpu" and like.dtype == torch.float32:
        return _floater_rk4
    return None


def loops_for(like: Tensor):
    """The C++ loops where they run for ``like``, else the Python ones."""
    return compiled_loops(like) or PythonLoops


class PythonLoops:
    """The step loops of :class:`~.solver._RK4Hidden` in Python, with the C++ loops' signatures: they run
    where those are not built, on a GPU, and for float64."""

    @staticmethod
    def forward_steps(u: Tensor, bias1: Tensor, c: Tensor, m: Tensor, dts: Sequence[float], rs: Tensor,
                      rho: Tensor):
        """Steps forward from u = y W1; each evaluation's relu(p) into ``rs`` (N or 1 of them),
        each step's weighted sum of them into ``rho``."""
        store = rs.size(0) == len(dts)
        for i, h in enumerate(dts):
            r = rs[i if store else 0]
            torch.add(u, bias1[i, 0], out=r[0]).relu_()
            q1 = torch.addmm(c[i, 0], r[0], m)
            torch.add(u, q1, alpha=h / 3, out=r[1]).add_(bias1[i, 1]).relu_()
            q2 = torch.addmm(c[i, 1], r[1], m)
            torch.add(u, q2 - q1 * (1 / 3), alpha=h, out=r[2]).add_(bias1[i, 2]).relu_()
            q3 = torch.addmm(c[i, 2], r[2], m)
            torch.add(u, q1 - q2 + q3, alpha=h, out=r[3]).add_(bias1[i, 3]).relu_()
            q4 = torch.addmm(c[i, 3], r[3], m)
            u = u + (q1 + 3 * (q2 + q3) + q4) * (h * 0.125)
            torch.add(r[0] + r[3], r[1] + r[2], alpha=3, out=rho[i]).mul_(h * 0.125)

    @staticmethod
    def backward_steps(rs: Tensor, grad_rho: Tensor, m: Tensor, dts: Sequence[float], chunk: int, grad_m: Tensor,
                       grad_c: Tensor, grad_b1: Tensor) -> Tensor:
        """The discrete adjoint of :meth:`forward_steps`: accumulates into ``grad_m``, fills
        ``grad_c`` and ``grad_b1`` (summed over the states) and returns the gradient on u."""
        n, _, states, hidden = rs.shape
        g_q = rs.new_empty(chunk, 4, states, hidden)  # the gradient on each q
        g_p = rs.new_empty(chunk, 4, states, hidden)  # on each pre-activation p
        mt = m.t()
        adjoint = rs.new_zeros(states, hidden)  # on u after the last step: u is not an output
        for i in range(n - 1, -1, -1):
            k, h = i % chunk, dts[i]
            gq, gp, r, g_rho = g_q[k], g_p[k], rs[i], grad_rho[i]

            def vjp(stage: int, grad: Tensor) -> Tensor:
                """p's gradient from q's, and from rho's through relu(p)."""
                gq[stage] = grad
                g_r = torch.addmm(g_rho, grad, mt, beta=h * _WEIGHTS[stage])
                return torch.ops.aten.threshold_backward.grad_input(g_r, r[stage], 0, grad_input=gp[stage])

            # p2 = u + h q1 / 3, p3 = u + h (q2 - q1 / 3), p4 = u + h (q1 - q2 + q3), p_i += b1(t_i)
            a = adjoint
            gq4 = a * (h * 0.125)
            gp4 = vjp(3, gq4)
            gp3 = vjp(2, a * (h * 0.375) + gp4 * h)
            gp2 = vjp(1, a * (h * 0.375) + (gp3 - gp4) * h)
            gp1 = vjp(0, gq4 + (gp4 + (gp2 - gp3) * (1 / 3)) * h)
            adjoint = a + gp1 + gp2 + gp3 + gp4

            if k == 0:  # the chunk is done: its weight gradients in one matmul
                count = min(chunk, n - i)
                done = slice(i, i + count)
                grad_m.addmm_(rs[done].reshape(-1, hidden).t(), g_q[:count].reshape(-1, hidden))
                grad_c[done] = g_q[:count].sum(2)
                grad_b1[done] = g_p[:count].sum(2)
        return adjoint

    @staticmethod
    def running_sums(x: Tensor, reverse: bool) -> Tensor:
        """Cumulative sums along the first dimension, from the end with ``reverse``."""
        return x.flip(0).cumsum(0).flip(0) if reverse else x.cumsum(0)
