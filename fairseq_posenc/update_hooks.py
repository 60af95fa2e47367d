"""Tell modules when parameters are about to change: fairseq's updates, and every optimizer step.

With ``--update-freq N`` fairseq's ``Trainer.train_step`` runs N forward/backward passes and then
one optimizer step, but no module learns that the parameters stay fixed across those N passes.
A module that can share work between them (FLOATER solves its ODE once per update instead of once
per pass) defines ``begin_update(passes)``; the wrapper installed here calls it at the start of
every ``train_step``. Modules without the method never notice.

A module that adds gradients of its own once the update's are complete (FLOATER's
``--floater-solve-every``: the gradient of several updates, backpropagated once) defines
``finish_update(scale)``: the wrapper calls it right after the trainer's ``multiply_grads(scale)``
(1 / sample size, after all passes' backward, before clipping and the optimizer step), so the
module sees the factor every gradient of the update was normalised by. A loop of one's own calls
:func:`finish_update` before its optimizer step.

Every optimizer step is also counted (:func:`optimizer_steps`), through torch's global step hook
rather than the trainer: a bare ``optimizer.step()`` (a user's loop, a test) never passes through
``train_step``, and fairseq's optimizers write parameters through ``p.data``, which leaves no
trace on the parameters' version counters. Position tables kept for decoding use the count to
know they are stale (:mod:`fairseq_posenc.positions.kept`).
"""
import functools

from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

_optimizer_steps = 0
_step_hook = None


def optimizer_steps() -> int:
    """How many optimizer steps have run in this process, any optimizer."""
    return _optimizer_steps


def _count_step(optimizer, args, kwargs):
    global _optimizer_steps
    _optimizer_steps += 1


def count_optimizer_steps():
    """Register the global post-step hook; safe to call more than once. It fires for every
    subclass of ``torch.optim.Optimizer``: fairseq's Adam, Adafactor, NAG and the optimizer inside
    its fp16/bf16 wrappers are such subclasses (the wrappers copy the result into the half-precision
    parameters after the inner step; a kept table is only rebuilt at the next forward, after that)."""
    global _step_hook
    if _step_hook is None:
        _step_hook = register_optimizer_step_post_hook(_count_step)


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


def install():
    """Wrap ``fairseq.trainer.Trainer.train_step`` and count optimizer steps; safe to call more
    than once."""
    from fairseq.trainer import Trainer

    count_optimizer_steps()
    original = Trainer.train_step
    if getattr(original, "announces_updates", False):
        return

    @functools.wraps(original)
    def train_step(self, samples, *args, **kwargs):
        announce_update(self.model, len(samples))
        finishers = _finishers(self.model)
        if not finishers:
            return original(self, samples, *args, **kwargs)
        for module in finishers:
            check = getattr(module, "check_trainer", None)
            if callable(check):
                check(self)
        optimizer = self.optimizer
        multiply, own = optimizer.multiply_grads, "multiply_grads" in vars(optimizer)

        def multiply_then_finish(c):
            multiply(c)
            for module in finishers:
                module.finish_update(c)

        optimizer.multiply_grads = multiply_then_finish  # on this instance, for this update only
        try:
            return original(self, samples, *args, **kwargs)
        finally:
            if own:
                optimizer.multiply_grads = multiply
            else:
                del optimizer.multiply_grads

    train_step.announces_updates = True
    Trainer.train_step = train_step
