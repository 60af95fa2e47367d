"""FLOATER (Liu et al., 2020): positions as the solution of a learned ODE.

dp/dt = h(t, p(t)), p_i = p(i * dt); with ``--floater-dissipation LAMBDA`` (not in the paper)
dp/dt = -LAMBDA p + tanh(h(t, p)), whose every coordinate stays within max(|p(0)|, 1 / LAMBDA).
Every attention block has its own initial states (one per projection: q, k, v in
self-attention, k, v in encoder-decoder attention); the dynamics h are
shared by all blocks. The solution is a bias added to the projections, in the paper's
warm-start form: the sinusoidal input embedding stays, and with h = 0 and zero initial states
the model is exactly the vanilla Transformer.

``--position-blocks input`` (Table 2's "only at input block" rows, p^(n) = 0 for n >= 2): the
biases of the first block of the encoder and of the decoder only, with initial states for those
blocks only. Through Eq. 12 FLOATER's p^(1) reaches block 1 as biases on its projections; the
residual stream keeps the sinusoidal input embedding, as at every block in the default form.

Cost: the biases do not depend on the input, so one solve covers every block and every sentence
of a forward, for the longest length needed; a longer length extends the solution from where it
ended rather than solving again from 0. Without gradients the solution is kept, stored in the
checkpoint (``solution``), and reused while the parameters and the ODE's settings (dt, step,
solver, --floater-lr-scale, --rnn-dt, ...), device and dtype are those it was solved with (decided
as for every kept table, :mod:`.kept`; the checkpoint also stores a ``fingerprint`` of them all, so
that a loaded solution is trusted only for the parameters and settings loaded with it).
"""
import hashlib
import math
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from ..compat import PosencError
from . import floater_schedule
from .base import MIN_TABLE, PositionBlocksConfig, PositionEncoding, at_least_float32, cast
from .kept import ForgetsKeptOnCopy, KeptFrom, kept_key, saving
from .values import Values

FIXED_STEP_SOLVERS = ("euler", "midpoint", "heun2", "heun3", "rk4", "explicit_adams", "implicit_adams")
ADAPTIVE_SOLVERS = ("dopri5", "dopri8", "bosh3", "fehlberg2", "adaptive_heun")


def default_step(dt: float) -> float:
    """The paper's step of the fixed-step solvers: dt / 5."""
    return dt / 5


#: the order of torchdiffeq's explicit Runge-Kutta methods among the fixed-step solvers: a step of
#: size s multiplies the solution of dp/dt = -LAMBDA p by R(-LAMBDA s), R(z) = sum_{k <= order} z^k / k!
RUNGE_KUTTA_ORDERS = {"euler": 1, "midpoint": 2, "heun2": 2, "heun3": 3, "rk4": 4}


def stability_limit(order: int) -> float:
    """The largest x with |R(-y)| <= 1 for every y in [0, x] (the stability interval of the
    explicit Runge-Kutta method of ``order`` stages and order on the negative real axis: 2 for
    euler and midpoint, 2.51 for heun3, 2.79 for rk4). Past it a step amplifies the decaying mode
    of --floater-dissipation's -LAMBDA p, and the solution grows without bound."""
    def unstable(y):
        return abs(sum((-y) ** k / math.factorial(k) for k in range(order + 1))) > 1

    low = 1e-6
    while not unstable(low + 1e-3):  # the first crossing, then bisection
        low += 1e-3
    high = low + 1e-3
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (low, mid) if unstable(mid) else (mid, high)
    return low


@dataclass
class FloaterConfig(PositionBlocksConfig):
    floater_init_from: Optional[str] = field(
        default=None,
        metadata={"label": "warm start", "values": Values(file=True),
                  "help": "floater: warm start from this sinusoidal transformer_posenc or fairseq transformer "
                  "checkpoint of the same size, h's output layer and the initial states at 0 (the vanilla model)"},
    )
    floater_solve_every: int = field(
        default=1,
        metadata={"label": "solve every {}", "values": Values(low=1),
                  "help": "floater: update the flow model (h and the initial states) once per N updates with the mean "
                  "of their gradients, solving once per N updates (Sec. 4.4; docs/floater.md)"},
    )
    floater_lr_scale: Optional[float] = field(
        default=None,
        metadata={"label": "lr scale {}", "values": Values(low=0, above=True),
                  "help": "floater: h and the initial states learn C times faster under Adam (stored as V, W = C V). "
                  "Default: min(N, 10), N of --floater-solve-every; 1 with --floater-init-from. Saved with the weights"},
    )
    floater_solver: str = field(
        default="rk4", metadata={"label": "solver {}",
                                 "values": Values(choices=FIXED_STEP_SOLVERS + ADAPTIVE_SOLVERS,
                                                  noun="a torchdiffeq method"),
                                 "help": "floater: torchdiffeq method, fixed-step " + ", ".join(FIXED_STEP_SOLVERS)
                                 + " or adaptive " + ", ".join(ADAPTIVE_SOLVERS)}
    )
    floater_step: Optional[float] = field(
        default=None, metadata={"label": "step {}", "values": Values(low=0, above=True),
                                "help": "floater: step of the fixed-step solvers (default dt / 5; "
                                "refused with an adaptive solver, which chooses its own)"}
    )
    floater_dt: float = field(default=0.1, metadata={"label": "dt {}", "values": Values(low=0, above=True),
                                                     "help": "floater: time between two positions"})
    floater_dissipation: float = field(
        default=0.0,
        metadata={"label": "dissipation {}", "values": Values(low=0, why="0: the paper's FLOATER"),
                  "help": "floater, not in the paper: LAMBDA > 0 solves dp/dt = -LAMBDA p + tanh(h(t, p)), whose "
                  "biases stay within max(|p(0)|, 1 / LAMBDA) per coordinate. 0: the paper's FLOATER"},
    )
    floater_cross_attention: bool = field(
        default=False,
        metadata={"label": "cross-attention",
                  "help": "floater: also bias the keys and values of encoder-decoder attention (the paper, "
                  "Eq. 12, biases self-attention only)"},
    )
    floater_hidden: Optional[int] = field(
        default=None, metadata={"values": Values(low=1),
                                "help": "floater: hidden size of the dynamics h (default: the attention width)"}
    )
    floater_adjoint: bool = field(
        default=False, metadata={"help": "floater: backpropagate with the adjoint method (less memory, more time)"}
    )


class Dynamics(nn.Module):
    """h(t, p) = W2 [t; relu(W1 [t; p])]: two linear layers, each seeing the time.

    The time column of each weight is its own parameter (``time1``, ``time2``), so that the
    solver's inner loop needs no concatenation and no slicing of weights, whose backward would
    materialise a full-size gradient at every step.
    """

    def __init__(self, dim: int, hidden: int, lr_scale: float = 1.0, dissipation: float = 0.0):
        super().__init__()
        # --floater-dissipation: dp/dt = -dissipation p + tanh(h(t, p)) (Float32Field)
        self.dissipation = float(dissipation)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        # initialised as nn.Linear(dim + 1, hidden) and nn.Linear(hidden + 1, dim) would be
        self.time1 = nn.Parameter(torch.empty(hidden).uniform_(-1, 1) / (dim + 1) ** 0.5)
        self.time2 = nn.Parameter(torch.empty(dim).uniform_(-1, 1) / (hidden + 1) ** 0.5)
        # --floater-lr-scale C: the parameters hold W / C. Adam's step does not depend on the
        # gradient's scale, so V moves as far as W would and W = C V C times as far (fairseq's
        # set_lr overwrites every parameter group's lr, so a group of its own would not last)
        self.lr_scale = lr_scale
        if lr_scale != 1:
            with torch.no_grad():
                for p in self.parameters():
                    p.div_(lr_scale)

    def float32(self, stored: Optional[List[Tensor]] = None) -> "Float32Field":
        """h with its weights in float32, cast once per solve (no copy when they already are).
        ``stored``: other tensors in place of fc1.weight, fc1.bias, time1, fc2.weight, fc2.bias,
        time2 (FLOATER's flow update differentiates float32 copies of them)."""
        fc1, b1, time1, fc2, b2, time2 = stored if stored is not None else (
            self.fc1.weight, self.fc1.bias, self.time1, self.fc2.weight, self.fc2.bias, self.time2)
        dtype = at_least_float32(fc1.dtype)
        weights = tuple(w.to(dtype) for w in (fc1.t(), b1, time1, fc2.t(), b2, time2))
        if self.lr_scale != 1:
            weights = tuple(w * self.lr_scale for w in weights)
        return Float32Field(weights, self.dissipation)

    def forward(self, t: Tensor, p: Tensor) -> Tensor:
        return self.float32()(t, p)

    def get_extra_state(self):
        """C, saved with the weights (a float64 tensor: ``model.half()`` would round a buffer); a
        state dict of another C is rescaled on load (:func:`.floater_schedule.rescale_on_load`)."""
        return torch.tensor(self.lr_scale, dtype=torch.float64)

    def set_extra_state(self, state):
        """Nothing: the ODE's load pre-hook has already read and applied it (and kept the C the
        weights were trained with, ``_trained_scale``, for the model's label)."""


class Float32Field:
    """The right-hand side h(t, p) of one solve, in float32 (or the model's dtype if wider).

    Under --fp16/--bf16 a solve in half precision loses the positions: the time t = i dt
    rounds (bf16 keeps 8 bits: from position 640 on, t moves in steps of 0.5, so 5 positions
    share it), and each solver step adds an increment far below the state's precision.
    """

    def __init__(self, weights, dissipation: float = 0.0):
        self.weights = weights
        #: --floater-dissipation LAMBDA > 0: the field is -LAMBDA p + tanh(h(t, p)) (docs/floater.md)
        self.dissipation = dissipation

    def __call__(self, t: Tensor, p: Tensor) -> Tensor:
        w1, b1, time1, w2, b2, time2 = self.weights
        # under --amp/--bf16 autocast would run addmm in half precision (torchdiffeq's solvers,
        # the adjoint's backward solve included, call this inside the model's forward)
        with torch.autocast(device_type=p.device.type, enabled=False):
            t = t.to(p.dtype)
            hidden = torch.relu(torch.addmm(b1 + t * time1, p, w1))
            out = torch.addmm(b2 + t * time2, hidden, w2)
            if self.dissipation:
                # each coordinate: dp/dt <= -LAMBDA p + 1 < 0 wherever p > 1 / LAMBDA (and the mirror
                # image below -1 / LAMBDA), so |p_j| never exceeds max(|p_j(0)|, 1 / LAMBDA)
                out = torch.tanh(out) - self.dissipation * p
            return out


class _Update:
    """The passes of one optimizer update: one solution with autograd history for all of them,
    and the gradient the passes before the last left on it."""

    def __init__(self, passes: int):
        self.passes_left = passes  # after the current pass
        self.solution: Optional[Tensor] = None
        self.grad: Optional[Tensor] = None

    def for_this_pass(self) -> Tensor:
        if self.passes_left > 0:  # the backward of this pass stops at a detached copy
            copy = self.solution.detach().requires_grad_()
            copy.register_hook(self._accumulate)
            return copy
        if self.grad is None:
            return self.solution
        grad, self.grad = self.grad, None  # added once, however many stacks use the solution
        grad = torch.cat([grad, grad.new_zeros(self.solution.size(0) - grad.size(0), *grad.shape[1:])])
        return _AddToGradient.apply(self.solution, grad)

    def _accumulate(self, grad: Tensor):
        if self.grad is None:
            self.grad = grad.clone()
            return
        if grad.size(0) > self.grad.size(0):  # a longer pass extended the solution
            grad, self.grad = self.grad, grad.clone()
        self.grad[: grad.size(0)] += grad


class _AddToGradient(torch.autograd.Function):
    """The identity, whose backward adds ``extra`` to the gradient that passes through it."""

    @staticmethod
    def forward(ctx, x: Tensor, extra: Tensor) -> Tensor:
        ctx.save_for_backward(extra)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (extra,) = ctx.saved_tensors
        return grad + extra, None


class FloaterODE(ForgetsKeptOnCopy, nn.Module):
    """All blocks' position biases: ``positions(n)`` -> (>= n, states, dim)."""

    #: state, not settings: left out of the kept solution's key (:func:`.kept.configuration`)
    running_state = ("solved_length",)
    #: state-dict entries that are kept results, not parameters (:func:`.kept.kept_result_keys`)
    kept_results = ("solution", "fingerprint", floater_schedule.PENDING)

    def __init__(self, num_states: int, dim: int, hidden: int, dt: float, solver: str,
                 step: Optional[float], adjoint: bool, solve_every: int = 1, lr_scale: Optional[float] = None,
                 dissipation: float = 0.0, warm_start: bool = False):
        super().__init__()
        self.dt, self.solver, self.adjoint = dt, solver, adjoint
        self.step = step if step is not None else default_step(dt)
        #: whether the weights were warm-started from a vanilla model (--floater-init-from), saved with
        #: them (get_extra_state): a run resumed without the flag is still the warm-started model
        self._warm_started = bool(warm_start)
        #: whether --floater-lr-scale was given: if not, weights loaded with another C keep theirs
        #: (:func:`.floater_schedule.rescale_on_load`)
        self._lr_scale_given = lr_scale is not None
        lr_scale = floater_schedule.lr_scale(solve_every, lr_scale, warm_start)
        if solver in ADAPTIVE_SOLVERS and step is not None:
            raise PosencError(f"--floater-step {step:g} would change nothing: --floater-solver {solver} is adaptive "
                              "(it chooses its own steps); the step is for the fixed-step solvers, "
                              + ", ".join(FIXED_STEP_SOLVERS))
        if dissipation and solver in RUNGE_KUTTA_ORDERS:
            limit = stability_limit(RUNGE_KUTTA_ORDERS[solver])
            if dissipation * self.step > limit:
                raise PosencError(
                    f"--floater-dissipation {dissipation:g}: with --floater-step {self.step:g} ({solver}) LAMBDA x step "
                    f"= {dissipation * self.step:.3g} is past {solver}'s stability limit {limit:.3f}, where the solve "
                    f"grows without bound instead of decaying; the largest stable LAMBDA for this step is "
                    f"{limit / self.step:.4g} (or take a smaller --floater-step)")
        self.dynamics = Dynamics(dim, hidden, lr_scale, dissipation)
        # the N it was trained with, saved with the weights (get_extra_state; the flags of a decode may
        # differ): the current N once it trains (begin_update), the checkpoint's once loaded
        self._trained_every = int(solve_every)
        # --floater-lr-scale C covers the initial states too: stored as p(0) / C (initial_state)
        self.lr_scale = lr_scale
        self.initial = nn.Parameter(torch.empty(num_states, dim))
        nn.init.normal_(self.initial, std=0.02 / lr_scale)
        self.register_load_state_dict_pre_hook(
            lambda module, state_dict, prefix, *args: floater_schedule.rescale_on_load(module, state_dict, prefix))
        # The solution for the current parameters, kept in the checkpoint, and a fingerprint of
        # the parameters it was solved with.
        self.register_buffer("solution", torch.zeros(0, num_states, dim))
        self.register_buffer("fingerprint", torch.zeros(4, dtype=torch.int64))
        self.solved_length = 0
        self._checked_in_decode = False
        self._solved_from = KeptFrom()
        self._generation = 0
        self._graph = None  # (generation, solution with autograd history) while training
        self._update = None  # the update fairseq's trainer runs, when it announced one
        #: fairseq's count of finished updates, as last set (before a load: the checkpoint's)
        self._updates_seen = 0
        #: (N, update count) of a checkpoint loaded in the middle of a cycle, until training goes on
        #: (:func:`.floater_schedule.resume_cycle`)
        self._loaded_cycle = None
        self.register_state_dict_pre_hook(lambda module, prefix, keep_vars: module._refresh_for_saving())
        # --floater-solve-every N > 1 (floater_schedule.py)
        self.schedule = floater_schedule.SolveSchedule(int(solve_every)) if solve_every > 1 else None
        if self.schedule is not None:
            self.register_state_dict_post_hook(
                lambda module, state, prefix, meta: module.schedule.save(
                    state, prefix, module.solution.size(0), module.initial.shape))

    def reset_to_vanilla(self):
        """h = 0 and zero initial states: every bias is 0, the model is the vanilla one.

        Only h's output layer is zeroed (fc2, its bias and its time column). Zeroing the hidden
        layer too would leave relu(0) = 0 there: fc2 would get no gradient, fc1 none through
        fc2 = 0, and h would stay a constant plus a term in t for ever. With fc1 random the
        hidden layer is non-zero, fc2 learns from the first step and fc1 from the next; the
        paper initialises the dynamics "with small values" for the same reason.
        """
        with torch.no_grad():
            for p in (self.dynamics.fc2.weight, self.dynamics.fc2.bias, self.dynamics.time2, self.initial):
                p.zero_()

    def new_forward(self):
        """A new model forward begins: solutions with autograd history are not reused, except
        by the passes of one update (:meth:`begin_update`)."""
        self._generation += 1
        if self._update is not None and torch.is_grad_enabled():
            self._update.passes_left -= 1

    def start_update(self, num_updates: int):
        """fairseq's trainer starts an update, ``num_updates`` finished (:mod:`fairseq_posenc.update_hooks`,
        before fairseq's ``train_step``): the first after a load mid-cycle decides what becomes of
        the cycle (:func:`.floater_schedule.resume_cycle`)."""
        if self._loaded_cycle is not None:
            loaded, self._loaded_cycle = self._loaded_cycle, None
            floater_schedule.resume_cycle(self, *loaded, num_updates)

    def begin_update(self, passes: int):
        """fairseq's trainer starts an update of ``passes`` forward/backward passes
        (``--update-freq``; see :mod:`fairseq_posenc.update_hooks`). The parameters stay fixed
        until its optimizer step, so the ODE is solved once for all passes, and its backward runs
        once, in the last pass, with the gradients that the earlier passes left on their detached
        copies of the solution added in (the backward is linear in them): the same gradients
        as a solve per pass, for the cost of one."""
        self._update = _Update(passes)
        self._trained_every = self.schedule.every if self.schedule is not None else 1
        if getattr(self, "dynamics", None) is not None:
            self.dynamics._trained_scale = self.lr_scale
        if self.schedule is not None:
            self.schedule.begin_update()

    def set_num_updates(self, num_updates: int):
        """fairseq's count of finished updates, set before each training pass (and by fairseq's
        ``load_checkpoint`` to the checkpoint's, before its weights are loaded)."""
        self._updates_seen = num_updates
        if self.schedule is not None:
            self.schedule.num_updates = num_updates

    @property
    def wants_finish_update(self) -> bool:
        return self.schedule is not None

    def check_trainer(self, trainer):
        """fairseq's trainer is built: refuse what --floater-solve-every cannot run under and set
        fairseq up for it, before the first update (:mod:`fairseq_posenc.update_hooks`)."""
        if self.schedule is not None:
            floater_schedule.configure_trainer(self, trainer)

    def finish_update(self, scale, trainer=None):
        """fairseq's trainer scaled the update's gradients by ``scale`` and has not yet clipped
        them or stepped (:mod:`fairseq_posenc.update_hooks`); ``trainer`` None: a loop of one's own."""
        if self.schedule is not None:
            self.schedule.finish_update(self, scale, trainer)

    def end_update(self, applied: bool):
        """fairseq's trainer ended the update: ``applied``, or skipped (a loss-scale overflow)."""
        if self.schedule is not None:
            self.schedule.end_update(applied)

    def initial_state(self, stored: Optional[Tensor] = None) -> Tensor:
        """p(0) of every block: the initial states are stored as p(0) / C (--floater-lr-scale);
        ``stored`` in place of the parameter (the flow update's float32 copy)."""
        stored = self.initial if stored is None else stored
        return stored if self.lr_scale == 1 else stored.to(at_least_float32(stored.dtype)) * self.lr_scale

    def positions(self, length: int, continues: bool = False) -> Tensor:
        """The solution over at least ``length`` positions. ``continues``: a later step of a
        step-by-step decode, whose parameters are those of its first step (:mod:`.kept`)."""
        if torch.is_grad_enabled() and self.initial.requires_grad:
            generation, solution = self._graph if self._graph is not None else (None, None)
            if generation == self._generation and solution.size(0) >= length:
                return solution  # the other stack of this forward
            update = self._update
            if update is None or update.passes_left < 0:  # a forward outside the trainer's updates
                solution = self._extend(solution if generation == self._generation else None, length)
            elif self.schedule is not None:
                solution = self.schedule.for_this_pass(self, length)
            else:
                update.solution = self._extend(update.solution, length)
                solution = update.for_this_pass()
            self._graph = (self._generation, solution)
            self.solved_length = max(self.solved_length, length)
            return solution
        with torch.no_grad():
            # a later step of a decode keeps the check of its first step (.kept)
            checked = continues and self._checked_in_decode
            if not checked and not self._solution_is_current(contents=not continues):
                self._set_solution(self._solve(self.initial_state(), 0, max(length, MIN_TABLE)))
            elif self.solution.size(0) < length:
                start = self.solution.size(0) - 1
                more = self._solve(self.solution[-1], start, max(length, 2 * self.solution.size(0)))
                self._set_solution(torch.cat([self.solution, more[1:]]))
            self._checked_in_decode = True
        return self.solution

    def _extend(self, solution: Optional[Tensor], length: int) -> Tensor:
        """``solution`` (with its autograd history) covering at least ``length`` positions."""
        if solution is None:
            return self._solve(self.initial_state(), 0, length)
        if solution.size(0) < length:
            return torch.cat([solution, self._solve(solution[-1], solution.size(0) - 1, length)[1:]])
        return solution

    def _solve(self, y0: Tensor, start: int, end: int, field: Optional["Float32Field"] = None) -> Tensor:
        """p at positions start .. end - 1 from p(start * dt) = y0: (end - start, states, dim),
        in float32 whatever the parameters' dtype (the attention casts what it uses)."""
        from torchdiffeq import odeint, odeint_adjoint

        from .floater_solver import rk4

        y0 = y0.to(at_least_float32(y0.dtype))
        if end - start <= 1:
            return y0[None]
        times = torch.arange(start, end, device=y0.device, dtype=torch.float32) * self.dt
        options = {"step_size": self.step} if self.solver in FIXED_STEP_SOLVERS else None
        field = self.dynamics.float32() if field is None else field
        if self.solver == "rk4" and not (self.adjoint and torch.is_grad_enabled()):
            # torchdiffeq's rk4 op for op, with a hand-written backward (floater_solver.py)
            return rk4(field.weights, y0, times, self.step, field.dissipation)
        if self.adjoint and torch.is_grad_enabled():
            # the solve differentiates the float32 weights; their casts carry the gradients on
            return odeint_adjoint(field, y0, times, method=self.solver, options=options,
                                  adjoint_params=tuple(w for w in field.weights if w.requires_grad))
        return odeint(field, y0, times, method=self.solver, options=options)

    def _forget_kept(self):
        self._solved_from = KeptFrom()
        self._checked_in_decode = False
        self._graph = None
        self._update = None

    def _kept_key(self):
        """The solution's key besides the parameters: the ODE's settings (dt, step, solver, h's
        --floater-lr-scale, the RNN's --rnn-dt, ...), its device and the dtype it is solved in."""
        return kept_key(self, self.initial.device, at_least_float32(self.initial.dtype))

    def _inputs(self) -> List[Tuple[str, Tensor]]:
        """(name, tensor) of what the solution is solved from: every parameter and buffer but the
        kept results."""
        return [(name, t) for name, t in (*self.named_parameters(), *self.named_buffers())
                if name not in self.kept_results]

    def _fingerprint(self) -> Tensor:
        """A SHA-256 digest of the key (the device by its type) and of every tensor the solution is
        solved from (name, dtype, shape, bytes), as 4 int64: an integer buffer, which
        ``model.half()`` leaves as it is."""
        config, device, dtype = self._kept_key()
        digest = hashlib.sha256(repr((config, device.type, str(dtype))).encode())
        for name, t in self._inputs():
            digest.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
            digest.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return torch.frombuffer(bytearray(digest.digest()), dtype=torch.int64).clone()

    def _solution_is_current(self, contents: bool = True) -> bool:
        if self.solution.size(0) == 0:
            return False
        key, inputs = self._kept_key(), [t for _, t in self._inputs()]
        if self._solved_from.still_current(key, inputs, contents):
            return True
        # a solution loaded from a checkpoint (or copied with the module): its fingerprint tells
        # whether the parameters and settings it comes with are those it was solved with
        if self._solved_from.empty and torch.equal(self._fingerprint(), self.fingerprint.cpu()):
            self._solved_from.remember(key, inputs)
            return True
        return False

    def _set_solution(self, solution: Tensor):
        # kept in float32 even in a half-precision model (a longer input extends it)
        self.solution = solution.detach()
        self.fingerprint = self._fingerprint().to(self.fingerprint.device)
        self._solved_from.remember(self._kept_key(), [t for _, t in self._inputs()])

    def _refresh_for_saving(self):
        """A checkpoint stores the solution of its own parameters, for the longest length
        trained on, so that decoding from it needs no ODE solve."""
        if not saving():  # a state dict read for its parameters (fairseq's EMA, every update)
            return
        length = max(self.solved_length, self.solution.size(0))
        if length > 0 and not self._solution_is_current():
            with torch.no_grad():
                self._set_solution(self._solve(self.initial_state(), 0, max(length, MIN_TABLE)))

    def get_extra_state(self):
        """(N of --floater-solve-every, 1 if warm-started else 0) as the weights were trained (a
        float64 tensor, as the dynamics' C: averaging checkpoints keeps equal values), for the
        model's label (:mod:`fairseq_posenc.labels`) and the lr scale's default: a resume, a decode
        or a study reads them from the checkpoint, whatever flags rebuilt the model."""
        return torch.tensor([float(self._trained_every), float(self._warm_started)], dtype=torch.float64)

    def set_extra_state(self, state):
        every, warm_started = torch.as_tensor(state, dtype=torch.float64).reshape(-1).tolist()
        self._trained_every, self._warm_started = int(round(every)), warm_started > 0.5

    def set_lr_scale(self, scale: float):
        """Use C = ``scale`` with the stored weights as they are (W = C V)."""
        self.lr_scale = self.dynamics.lr_scale = float(scale)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        stored = state_dict.get(prefix + "solution")
        if stored is not None:  # its length is whatever the saver had solved
            self.solution = torch.zeros(stored.shape, dtype=at_least_float32(stored.dtype), device=self.solution.device)
            self._solved_from.forget()
        # a cycle's pending gradient (--floater-solve-every); dropped by a model without the schedule
        pending = state_dict.pop(prefix + floater_schedule.PENDING, None)
        if self.schedule is not None:
            self.schedule.load(pending, self.initial.device)
        saved_every = int(round(float(torch.as_tensor(state_dict[prefix + "_extra_state"]).reshape(-1)[0])))
        mid_cycle = pending is not None and bool(pending.ne(0).any())
        self._loaded_cycle = (saved_every, self._updates_seen) if mid_cycle else None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class FloaterPositionEncoding(PositionEncoding):
    """Per-block biases on the q, k, v projections from one shared ODE (see the module doc).

    The encoder's scheme owns the ODE with the initial states of every block of the model; the
    decoder's uses it through :meth:`tie`.
    """

    input_embedding = "sinusoidal"
    config = FloaterConfig
    default_blocks = "all"

    def __init__(self, cfg, side, num_layers, num_heads, head_dim):
        super().__init__(cfg, side, num_layers, num_heads, head_dim)
        self.width = num_heads * head_dim
        # the blocks with biases in each stack
        only_input = self.position_blocks == "input"
        self.encoder_blocks, self.decoder_blocks = (1, 1) if only_input else (cfg.encoder.layers, cfg.decoder.layers)
        self.cross_attention = bool(getattr(cfg, "floater_cross_attention", False))
        self._ode = None
        if side == "encoder":
            # q, k, v of every self-attention block, and k, v of every encoder-decoder one if asked
            states = 3 * (self.encoder_blocks + self.decoder_blocks) + 2 * self.decoder_blocks * self.cross_attention
            hidden = self.width if cfg.floater_hidden is None else cfg.floater_hidden  # values.py refuses < 1
            self.ode = FloaterODE(states, self.width, hidden, cfg.floater_dt,
                                  cfg.floater_solver, cfg.floater_step, cfg.floater_adjoint,
                                  getattr(cfg, "floater_solve_every", 1), getattr(cfg, "floater_lr_scale", None),
                                  getattr(cfg, "floater_dissipation", 0.0),
                                  warm_start=bool(getattr(cfg, "floater_init_from", None)))

    @classmethod
    def finish_model(cls, model, args):
        super().finish_model(model, args)
        if args.floater_init_from:
            warm_start(model, args.floater_init_from)
            # the warm start is done: a checkpoint of this model must not redo it when reloaded
            args.floater_init_from = None

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        stored = state_dict.get(prefix + "ode.initial")
        if self.side == "encoder" and stored is not None and stored.size(0) != self.ode.initial.size(0):
            crossed = 3 * (self.encoder_blocks + self.decoder_blocks) + 2 * self.decoder_blocks
            if stored.size(0) == crossed and not self.cross_attention:
                # checkpoints of before --floater-cross-attention biased encoder-decoder attention too
                raise PosencError(
                    "this FLOATER checkpoint also biases encoder-decoder attention (5 states per decoder "
                    "layer, the default before --floater-cross-attention existed): load it with "
                    "--model-overrides \"{'floater_cross_attention': True}\"")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def published_options(self):
        """The paper's step dt / 5 of the model's dt, h as wide as attention, no warm start (the
        flag's default; the paper warm-starts, which the label names), and the lr scale's default
        for the N and the start the weights were trained with (:func:`.floater_schedule.lr_scale`)."""
        ode = self.solver
        published = {**super().published_options(), "floater_hidden": self.width, "floater_init_from": False}
        if getattr(ode, "dynamics", None) is not None:  # the RNN's subclass has no ODE
            published["floater_step"] = default_step(ode.dt)
            published["floater_lr_scale"] = floater_schedule.lr_scale(ode._trained_every, None, ode._warm_started)
        return published

    def carried_options(self):
        """N, C and the warm start as the weights were trained with them (the ODE's and the
        dynamics' extra state), and h's width as its weights have it, whatever flags rebuilt the model."""
        ode = self.solver
        carried = {**super().carried_options(), "floater_init_from": ode._warm_started}
        if getattr(ode, "dynamics", None) is not None:
            carried["floater_hidden"] = ode.dynamics.fc1.out_features
            carried["floater_solve_every"] = ode._trained_every
            carried["floater_lr_scale"] = getattr(ode.dynamics, "_trained_scale", ode.lr_scale)
        return carried

    def tie(self, encoder_scheme):
        if self.side == "decoder":
            if encoder_scheme.width != self.width:
                raise PosencError(f"floater needs the same attention width in encoder and decoder, got "
                                 f"{encoder_scheme.width} and {self.width}")
            # a reference, not a submodule: the ODE's parameters belong to the encoder
            self._ode = (encoder_scheme.ode,)

    @property
    def solver(self) -> FloaterODE:
        return self.ode if self.side == "encoder" else self._ode[0]

    def begin_forward(self, tokens, continues=False):
        super().begin_forward(tokens, continues)
        if self.side == "encoder":
            self.solver.new_forward()

    def _span(self, role: str) -> Tuple[int, int]:
        """The states of this stack's ``role`` attention in the ODE's state: [first, end)."""
        encoder, decoder = 3 * self.encoder_blocks, 3 * self.decoder_blocks
        if self.side == "encoder":
            return 0, encoder
        if role == "self":
            return encoder, encoder + decoder
        return encoder + decoder, encoder + decoder + 2 * self.decoder_blocks

    def _state(self, layer: int, role: str, projection: int) -> int:
        """The state of a layer's projection (0, 1, 2: q, k, v), counted within :meth:`_span`."""
        if role == "self":
            return 3 * layer + projection
        return 2 * layer + projection - 1

    def _rows(self, role: str, positions: Tensor, pos, like: Tensor) -> Tuple[Tensor, ...]:
        """This stack's biases for ``role`` attention at ``positions``, one (B or 1, T, H * D)
        tensor per state of :meth:`_span`, gathered once per forward and shared by the layers.
        Unpadded, the positions are a slice of the solution (views, no copy); a padded batch
        gathers (states, B, T, H * D) once. Either way the backward builds one gradient of the
        solution, not one per state."""
        def gather():
            first, end = self._span(role)
            # (L, all states, H * D) -> (states of this span, L, H * D): a view
            solution = self.solver.positions(pos.k_frame.numel(), self._continues)[:, first:end].transpose(0, 1)
            if pos.padded:
                rows = solution[:, positions]  # (states, B, T, H * D)
            else:  # the frame: queries are the last T of the keys, encoder-decoder keys all of them
                start = pos.key[0] if role == "self" else 0
                rows = solution[:, start:start + positions.size(-1)].unsqueeze(1)  # (states, 1, T, H * D)
            return cast(rows, like.dtype).unbind(0)

        return self.shared(("floater", role, pos.padded) + pos.key, gather)

    def _bias(self, rows: Tuple[Tensor, ...], state: int) -> Tensor:
        # (B or 1, T, H * D) -> (B or 1, H, T, D)
        bias = rows[state]
        return bias.view(*bias.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)

    def acts_through(self, hook, role):
        # encoder-decoder attention's keys and values with --floater-cross-attention only
        return super().acts_through(hook, role) and (role == "self" or self.cross_attention)

    def transform_qkv(self, layer, role, q, k, v, pos):
        if layer >= (self.encoder_blocks if self.side == "encoder" else self.decoder_blocks):
            return q, k, v
        if role == "self":
            rows = self._rows(role, pos.q, pos, q)
            return tuple(x + self._bias(rows, self._state(layer, role, i)) for i, x in enumerate((q, k, v)))
        if not self.cross_attention or k is None:  # cached keys and values carry their biases
            return q, k, v
        rows = self._rows(role, pos.k, pos, k)
        return (q,) + tuple(x + self._bias(rows, self._state(layer, role, i)) for i, x in ((1, k), (2, v)))


def _saved_model_flags(state):
    """The model flags a fairseq checkpoint was trained with (``cfg.model``: a Namespace for
    architectures registered the legacy way, as here; ``args`` in older checkpoints), or None."""
    cfg = state.get("cfg")
    model = cfg.get("model") if cfg is not None else None
    return model if model is not None else state.get("args")


def _flag(flags, name, default):
    if flags is None:
        return default
    return flags.get(name, default) if isinstance(flags, dict) else getattr(flags, name, default)


def warm_start(model, path: str):
    """Load a vanilla (sinusoidal) model's parameters into a FLOATER model of the same size and
    start FLOATER at h = 0, zero initial states: the result computes exactly what the vanilla
    model computes (Liu et al.'s warm start), and every parameter of h can learn
    (:meth:`FloaterODE.reset_to_vanilla`)."""
    import os

    if not os.path.isfile(path):
        raise PosencError(f"--floater-init-from: no checkpoint at {path}")
    state = torch.load(path, map_location="cpu")
    vanilla = state.get("model") if isinstance(state, dict) else None
    if vanilla is None:
        raise PosencError(f"--floater-init-from: {path} is not a fairseq checkpoint (no 'model' entry)")
    # a sinusoidal model at every block (--position-blocks all) has the same parameters, no more:
    # only its saved flags tell that the warm start would drop its Eq. 7 terms
    saved = _saved_model_flags(state)
    encoding, blocks = _flag(saved, "position_encoding", "sinusoidal"), _flag(saved, "position_blocks", None)
    if encoding != "sinusoidal" or blocks not in (None, "input"):
        raise PosencError(f"--floater-init-from: {path} is a --position-encoding {encoding}"
                         f"{' --position-blocks ' + blocks if blocks else ''} model; the warm start needs the vanilla "
                         "Transformer (sinusoidal at the input block) for FLOATER to start as that model exactly")
    ode = model.encoder.position_encoding.ode
    ode_keys = {f"encoder.position_encoding.ode.{k}" for k in ode.state_dict()}
    own = model.state_dict()
    mismatched = [k for k, v in vanilla.items() if k in own and own[k].shape != v.shape]
    missing = sorted(set(own) - set(vanilla) - ode_keys)
    # the stacks' longest_trained is saved only once trained (models/transformer_stacks.py)
    unexpected = sorted(k for k in set(vanilla) - set(own) if not k.endswith(".longest_trained"))
    if mismatched or missing or unexpected:
        details = "; ".join(f"{name}: {', '.join(keys[:3])}" for name, keys in
                            (("different shape", mismatched), ("missing", missing), ("unexpected", unexpected)) if keys)
        raise PosencError(f"--floater-init-from: {path} is not a sinusoidal Transformer of this model's size "
                          f"({details})")
    model.load_state_dict({**own, **vanilla}, strict=True)
    ode.reset_to_vanilla()
