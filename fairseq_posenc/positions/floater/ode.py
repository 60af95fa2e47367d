"""FLOATER's ODE: every block's initial states and the shared dynamics h, solved into the position
biases, and the solution kept while its parameters and settings are unchanged.

Cost: the biases do not depend on the input, so one solve covers every block and every sentence
of a forward, for the longest length needed; a longer length extends the solution from where it
ended rather than solving again from 0. Without gradients the solution is kept, stored in the
checkpoint (``solution``), and reused while the parameters and the ODE's settings (dt, step,
solver, --floater-lr-scale, --rnn-dt, ...), device and dtype are those it was solved with (decided
as for every kept table, :mod:`..kept`; the checkpoint also stores a ``fingerprint`` of them all, so
that a loaded solution is trusted only for the parameters and settings loaded with it).
"""
import hashlib
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from ..base import MIN_TABLE, at_least_float32
from ..kept import ForgetsKeptOnCopy, KeptFrom, kept_key, saving
from . import schedule
from .config import solver_step
from .dynamics import Dynamics, Float32Field
from .loading import rescale_on_load
from .solver import solve
from .update import _Update


class FloaterODE(ForgetsKeptOnCopy, nn.Module):
    """All blocks' position biases: ``positions(n)`` -> (>= n, states, dim)."""

    #: state, not settings: left out of the kept solution's key (:func:`..kept.configuration`)
    running_state = ("solved_length",)
    #: state-dict entries that are kept results, not parameters (:func:`..kept.kept_result_keys`)
    kept_results = ("solution", "fingerprint", schedule.PENDING, schedule.PENDING_UPDATES)

    def __init__(self, num_states: int, dim: int, hidden: int, dt: float, solver: str,
                 step: Optional[float], adjoint: bool, solve_every: int = 1, lr_scale: Optional[float] = None,
                 dissipation: float = 0.0, warm_start: bool = False, from_checkpoint: bool = False):
        super().__init__()
        self.dt, self.solver, self.adjoint = dt, solver, adjoint
        self.step = solver_step(dt, solver, step, dissipation)
        #: whether the weights were warm-started from a vanilla model (--floater-init-from), saved with
        #: them (get_extra_state): a run resumed without the flag is still the warm-started model
        self._warm_started = bool(warm_start)
        #: whether --floater-lr-scale was given: if not, weights loaded with another C keep theirs
        #: (:func:`.loading.rescale_on_load`)
        self._lr_scale_given = lr_scale is not None
        #: whether the model is rebuilt from a checkpoint's saved configuration (a decode): there
        #: weights of another C are rescaled, where a training run refuses them (:func:`.loading.rescale_on_load`)
        self._from_checkpoint = bool(from_checkpoint)
        lr_scale = schedule.lr_scale(solve_every, lr_scale, warm_start)
        self.dynamics = Dynamics(dim, hidden, lr_scale, dissipation)
        # the N it was trained with, saved with the weights (get_extra_state; the flags of a decode may
        # differ): the current N once it trains (begin_update), the checkpoint's once loaded
        self._trained_every = int(solve_every)
        # --floater-lr-scale C covers the initial states too: stored as p(0) / C (initial_state)
        self.lr_scale = lr_scale
        self.initial = nn.Parameter(torch.empty(num_states, dim))
        nn.init.normal_(self.initial, std=0.02 / lr_scale)
        self.register_load_state_dict_pre_hook(
            lambda module, state_dict, prefix, *args: rescale_on_load(module, state_dict, prefix))
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
        #: (N, update count, updates pending) of a checkpoint loaded in the middle of a cycle, until
        #: training goes on
        #: (:func:`.schedule.resume_cycle`)
        self._loaded_cycle = None
        self.register_state_dict_pre_hook(lambda module, prefix, keep_vars: module._refresh_for_saving())
        # --floater-solve-every N > 1 (schedule.py)
        self.schedule = schedule.SolveSchedule(int(solve_every)) if solve_every > 1 else None
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
        the cycle (:func:`.schedule.resume_cycle`)."""
        if self._loaded_cycle is not None:
            loaded, self._loaded_cycle = self._loaded_cycle, None
            schedule.resume_cycle(self, *loaded, num_updates)

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
            schedule.configure_trainer(self, trainer)

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
        step-by-step decode, whose parameters are those of its first step (:mod:`..kept`)."""
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
        y0 = y0.to(at_least_float32(y0.dtype))
        if end - start <= 1:
            return y0[None]
        times = torch.arange(start, end, device=y0.device, dtype=torch.float32) * self.dt
        field = self.dynamics.float32() if field is None else field
        return solve(field, y0, times, self.solver, self.step, self.adjoint)

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
        pending = state_dict.pop(prefix + schedule.PENDING, None)
        saved_every = int(round(float(torch.as_tensor(state_dict[prefix + "_extra_state"]).reshape(-1)[0])))
        count = schedule.pending_count(state_dict.pop(prefix + schedule.PENDING_UPDATES, None), self._updates_seen,
                                       saved_every)
        if self.schedule is not None:
            self.schedule.load(pending, count, self.initial.device)
        mid_cycle = pending is not None and bool(pending.ne(0).any())
        self._loaded_cycle = (saved_every, self._updates_seen, count) if mid_cycle else None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
