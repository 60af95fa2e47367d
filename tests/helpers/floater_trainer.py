"""FLOATER's --floater-solve-every through fairseq's own ``Trainer`` in this process: the
``Trainer.train_step`` fairseq-train runs (with the plugin's wrapper, fairseq's optimizer wrappers,
its loss scaler), on batches of a toy corpus, with a record of what each update did.

What is recorded, per call of ``train_step``: the raw gradient every training pass left on the
kept solution (a hook beside the schedule's own), the factor fairseq's trainer normalised the
update by (``multiply_grads``), the loss scale the passes' backward used, whether fairseq took the
update, and what the innermost torch optimizer (fairseq's Adam) was handed for the flow model's
parameters at its step (for fairseq's FP16Optimizer: its fp32 master copies). From these a test
computes, independently of the schedule, what the flow update must be: the mean over the cycle's
taken updates of each one's normalised, unscaled gradient, backpropagated through one float32 solve.
"""
import copy
import math

import torch
from fairseq import options, tasks, utils
from fairseq.data import iterators
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq.optim.amp_optimizer import AMPOptimizer
from fairseq.optim.fp16_optimizer import FP16Optimizer, _FP16OptimizerMixin
from fairseq.trainer import Trainer

from posenc_workflow import pipeline
from fairseq_posenc.positions.floater import FloaterODE
from fairseq_posenc.positions.floater.schedule import SolveSchedule

#: the flow model's parameters in the ODE module (floater/schedule.py's FLOW, spelled out here so that
#: the tests run against code from before it)
FLOW = ("initial", "dynamics.fc1.weight", "dynamics.fc1.bias", "dynamics.time1", "dynamics.fc2.weight",
        "dynamics.fc2.bias", "dynamics.time2")

MODEL = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
         "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "4"]


def config(data_bin, *flags):
    """fairseq-train's config for these flags, as ``main`` receives it (compat's bf16 fix applied)."""
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[
        data_bin, "--user-dir", pipeline.USER_DIR, "--arch", "transformer_posenc", "--position-encoding", "floater",
        "--cpu", *MODEL, "--dropout", "0", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "200",
        "--distributed-world-size", "1", "--seed", "1", "--num-workers", "0", *flags])
    received = []
    distributed_utils.call_main(convert_namespace_to_omegaconf(args), received.append)
    return received[0]


def build_trainer(cfg):
    """The trainer fairseq-train's ``main`` builds (same seed before the model)."""
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    return Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))


def ode_of(trainer) -> FloaterODE:
    return trainer.get_model().encoder.position_encoding.ode


def batches(trainer, passes=2):
    """Updates of ``passes`` batches each, from the first epoch, longest batches first: every later
    update of a cycle is then no longer than an earlier one, the order in which a cycle's total
    modified in place shows (fairseq's unshuffled order, by increasing length, hid it)."""
    epoch = trainer.get_train_iterator(epoch=1, load_dataset=True)
    return iterators.GroupedIterator(list(epoch.next_epoch_itr(shuffle=False))[::-1], passes)


def innermost(optimizer):
    """The torch optimizer that steps (fairseq's Adam), through fairseq's wrappers."""
    return optimizer.optimizer


def loss_scale(optimizer) -> float:
    if isinstance(optimizer, AMPOptimizer):
        return float(optimizer.scaler.get_scale())
    scaler = getattr(optimizer, "scaler", None)
    return float(scaler.loss_scale) if scaler is not None else 1.0


class Recorder:
    """Records every ``train_step`` of ``trainer`` (see the module doc). Use as a context."""

    def __init__(self, trainer, monkeypatch):
        self.trainer, self.steps = trainer, []
        self.ode = ode_of(trainer)
        recorder = self
        for_this_pass, finish, begin = SolveSchedule.for_this_pass, FloaterODE.finish_update, FloaterODE.begin_update

        def record_begin(ode, passes):
            # an attempt: fairseq's AMP retries an overflowed update inside the same train_step
            recorder.current["attempts"].append({"passes": [], "loss_scale": loss_scale(recorder.trainer.optimizer)})
            return begin(ode, passes)

        def record_pass(schedule, ode, length):
            leaf = for_this_pass(schedule, ode, length)
            attempt = recorder.current["attempts"][-1]
            leaf.register_hook(lambda grad: attempt["passes"].append(grad.detach().float().clone()))
            return leaf

        def record_finish(ode, scale, *trainer):
            recorder.current["attempts"][-1]["scale"] = float(scale)
            return finish(ode, scale, *trainer)

        monkeypatch.setattr(FloaterODE, "begin_update", record_begin)
        monkeypatch.setattr(SolveSchedule, "for_this_pass", record_pass)
        monkeypatch.setattr(FloaterODE, "finish_update", record_finish)

    def flow_masters(self):
        """The flow model's parameters as the innermost optimizer holds them."""
        optimizer = self.trainer.optimizer
        params = [self.ode.get_parameter(name) for name in FLOW]
        if isinstance(optimizer, _FP16OptimizerMixin):
            masters = {id(p): m for p, m in zip(optimizer.fp16_params, optimizer.fp32_params)}
            return [masters[id(p)] for p in params]
        return params

    def step(self, samples, overflow_in=None):
        """One ``train_step``; ``overflow_in``: a parameter whose gradient is made infinite in this
        call's first backward (an injected fp16 overflow: the rest of the model is untouched)."""
        optimizer = self.trainer.optimizer
        masters = self.flow_masters()
        self.current = {"attempts": [], "handed": None,
                        "ode": copy.deepcopy(self.ode).float()}  # the flow model this update starts from

        def at_step(opt, args, kwargs):
            self.current["handed"] = [None if m.grad is None else m.grad.detach().float().clone() for m in masters]
            self.current["adam_state"] = [bool(opt.state.get(m)) for m in masters]

        hooks = [innermost(optimizer).register_step_pre_hook(at_step)]
        if overflow_in is not None:
            fired = []

            def inf(grad):
                if fired:
                    return grad
                fired.append(True)
                return torch.full_like(grad, math.inf)
            hooks.append(overflow_in.register_hook(inf))
        before = self.trainer.get_num_updates()
        values = [p.detach().float().clone() for p in masters]
        try:
            self.trainer.train_step(samples)
        finally:
            for hook in hooks:
                hook.remove()
        self.current["taken"] = self.trainer.get_num_updates() > before
        self.current["moved"] = [not torch.equal(v, p.detach().float()) for v, p in zip(values, masters)]
        self.current["update"] = before
        self.steps.append(self.current)
        return self.current

    def expected_flow_gradient(self, steps):
        """What the flow update over ``steps`` (the cycle's ``train_step`` calls) must hand Adam:
        the mean over the taken ones of their passes' gradients, each normalised as fairseq did
        (``multiply_grads``) and unscaled, backpropagated through one float32 solve of a float32
        copy of the flow model of the cycle (as the last call started), all in float64."""
        taken = [s["attempts"][-1] for s in steps if s["taken"]]  # an update's last attempt is the one taken
        length = max(g.size(0) for s in taken for g in s["passes"])
        total = torch.zeros(length, *self.ode.initial.shape, dtype=torch.float64)
        for s in taken:
            for g in s["passes"]:
                total[: g.size(0)] += g.double() * s["scale"] / s["loss_scale"]
        mean = total / len(taken)
        ode = copy.deepcopy(steps[-1]["ode"]).double()
        params = [ode.get_parameter(name) for name in FLOW]
        with torch.enable_grad():
            # p(0) = C V (the parameter itself in code from before the initial states were scaled)
            initial = ode.initial_state() if hasattr(ode, "initial_state") else ode.initial
            solution = ode._solve(initial, 0, length)
            return list(torch.autograd.grad(solution, params, mean)), mean


def is_fp16_optimizer(trainer):
    return type(trainer.optimizer) is FP16Optimizer
