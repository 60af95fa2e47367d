"""Tell modules when parameters are about to change: fairseq's updates.

With ``--update-freq N`` fairseq's ``Trainer.train_step`` runs N forward/backward passes and then
one optimizer step, but no module learns that the parameters stay fixed across those N passes.
A module that can share work between them (FLOATER solves its ODE once per update instead of once
per pass) defines ``begin_update(passes)``; the wrapper installed here calls it at the start of
every ``train_step``. Modules without the method never notice.

A module that needs fairseq's count of finished updates before an update begins (FLOATER's
``--floater-solve-every``, to tell a resumed cycle from a restarted count) defines
``start_update(num_updates)``: the wrapper calls it first, before fairseq's ``train_step`` runs.

A module that adds gradients of its own once the update's are complete (FLOATER's
``--floater-solve-every``: the gradient of several updates, backpropagated once) defines
``finish_update(scale, trainer)``: the wrapper calls it right after the trainer's
``multiply_grads(scale)`` (1 / sample size, after all passes' backward and the workers'
all-reduce, before clipping and the optimizer step), so the module sees the factor every gradient
of the update was normalised by, and the trainer (its optimizer, its loss scale, its workers).
After the update the wrapper calls ``end_update(applied)``: False when the trainer skipped it (a
loss-scale overflow). Such a module may define ``check_trainer(trainer)``, called when fairseq's
``Trainer`` is built, before its optimizer, its DDP wrapper and the first update: to refuse what it
cannot run under, or to set fairseq up for it. A loop of one's own calls :func:`finish_update`
before its optimizer step.

Optimizer steps are not counted: position tables kept for decoding compare the parameters' values
themselves (:mod:`fairseq_posenc.positions.kept`).

The same wrapper lets fairseq's fp16 overflow path run on a CPU trainer (:func:`_overflow_on_cpu`).
"""
import contextlib
import functools

import torch
from torch import nn
from torch.overrides import TorchFunctionMode


def start_update(trainer):
    """Call ``start_update(num_updates)`` on every submodule of the trainer's model that defines it,
    with the trainer's count of finished updates."""
    starters = [m for m in trainer.model.modules() if callable(getattr(m, "start_update", None))]
    for module in starters:
        module.start_update(trainer.get_num_updates())


def announce_update(model: nn.Module, passes: int):
    """Call ``begin_update(passes)`` on every submodule of ``model`` that defines it."""
    for module in model.modules():
        begin = getattr(module, "begin_update", None)
        if callable(begin):
            begin(passes)


def finish_update(model: nn.Module, scale=1.0):
    """Call ``finish_update(scale)`` on every submodule of ``model`` that defines it."""
    for module in _finishers(model):
        module.finish_update(scale)


def _finishers(model: nn.Module):
    # (``wants_finish_update`` False: the module has nothing to add, the trainer runs untouched)
    return [m for m in model.modules()
            if callable(getattr(m, "finish_update", None)) and getattr(m, "wants_finish_update", True)]


def _check_trainer(trainer):
    """Every module's ``check_trainer``, once per trainer."""
    if getattr(trainer, "_posenc_checked", False):
        return
    for module in _finishers(trainer._model):
        check = getattr(module, "check_trainer", None)
        if callable(check):
            check(trainer)
    trainer._posenc_checked = True


class _CudaCallsStayOnCpu(TorchFunctionMode):
    """``Tensor.cuda()`` returns the tensor where it is, every other call runs unchanged."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.cuda:
            return args[0]
        return func(*args, **(kwargs or {}))


def _overflow_on_cpu(trainer):
    """fairseq's ``train_step`` skips an update whose fp16 gradients overflowed and logs its gradient
    norm as ``torch.tensor(0.0).cuda()``, which raises on a CPU trainer: ``fairseq-train --cpu --fp16``
    (or ``--memory-efficient-fp16``) would stop at its first overflow instead of lowering the loss
    scale. On such a trainer the step runs with that tensor left on the CPU; fairseq's code is not
    changed, and a CUDA trainer runs as it is."""
    common = trainer.cfg.common
    if trainer.device.type == "cpu" and (common.fp16 or common.memory_efficient_fp16):
        return _CudaCallsStayOnCpu()
    return contextlib.nullcontext()


def install():
    """Wrap ``fairseq.trainer.Trainer.__init__`` and ``train_step``; safe to call more than once."""
    from fairseq.trainer import Trainer

    original = Trainer.train_step
    if getattr(original, "announces_updates", False):
        return
    original_init = Trainer.__init__

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        _check_trainer(self)  # before the optimizer, the DDP wrapper and the first update exist

    @functools.wraps(original)
    def train_step(self, samples, *args, **kwargs):
        with _overflow_on_cpu(self):
            return _train_step(self, samples, *args, **kwargs)

    def _train_step(self, samples, *args, **kwargs):
        # outside fairseq's train_step, whose failures write a crash.pt checkpoint
        start_update(self)
        announce_update(self.model, len(samples))
        finishers = _finishers(self.model)
        if not finishers:
            return original(self, samples, *args, **kwargs)
        _check_trainer(self)
        optimizer = self.optimizer
        if getattr(optimizer.multiply_grads, "finishes_update", False):
            # fairseq's AMP retries an overflowed update by calling train_step again, inside this one
            return original(self, samples, *args, **kwargs)
        multiply, own = optimizer.multiply_grads, "multiply_grads" in vars(optimizer)

        def multiply_then_finish(c):
            multiply(c)
            for module in finishers:
                module.finish_update(c, self)

        multiply_then_finish.finishes_update = True
        optimizer.multiply_grads = multiply_then_finish  # on this instance, for this update only
        before, applied = self.get_num_updates(), False
        try:
            result = original(self, samples, *args, **kwargs)
            applied = self.get_num_updates() > before
            return result
        finally:
            if own:
                optimizer.multiply_grads = multiply
            else:
                del optimizer.multiply_grads
            for module in finishers:
                end = getattr(module, "end_update", None)
                if callable(end):
                    end(applied)

    train_step.announces_updates = True
    Trainer.__init__ = __init__
    Trainer.train_step = train_step
