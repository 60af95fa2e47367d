"""Whether something computed from parameters (a position table, FLOATER's ODE solution) and
kept across forwards is still theirs.

No single signal is enough, so three are checked:

- the process's optimizer-step count (:func:`fairseq_posenc.update_hooks.optimizer_steps`,
  torch's global step hook): after any step of any ``torch.optim.Optimizer`` subclass, fairseq's
  own and the one inside its fp16/bf16 wrappers included, the values are compared even where
  they otherwise would not be (below), so a frozen model beside a trained one (a distillation
  teacher) keeps its tables;
- each tensor's identity, device, dtype and version counter: ``.to()``, ``.half()``,
  ``load_state_dict`` and in-place writes under ``no_grad`` change one of them;
- the values themselves, compared with a copy taken when the result was computed. Code that
  writes through ``p.data`` bumps no version counter, and outside an optimizer step nothing
  counts it: fairseq's optimizers write that way, and so may EMA or checkpoint averaging done in
  memory. Version counters alone let validation during ``fairseq-train`` run with the tables of
  the first validation (measured: a logged validation loss of 3.23 where the checkpoint gives
  0.99).

The value comparison costs one pass over the parameters (about 2 ms for a million floats on one
CPU core), once per forward of a stack. During one step-by-step decode it is skipped after the
first step (``contents=False``): fairseq's cached keys and values are of the parameters of that
first step as well, so nothing can change them in between without breaking the decode anyway.
"""
from typing import Iterable, List, Optional, Tuple

import torch
from torch import Tensor

from ..update_hooks import optimizer_steps


def _identity(tensors: List[Tensor]) -> Tuple:
    return tuple((t._version, t.data_ptr(), t.device, t.dtype, t.shape) for t in tensors)


class KeptFrom:
    """The tensors a kept result was computed from: :meth:`remember` them when computing it,
    ask :meth:`still_current` before reusing it."""

    def __init__(self):
        self._identity: Optional[Tuple] = None
        self._values: Optional[List[Tensor]] = None
        self._steps = -1

    def remember(self, tensors: Iterable[Tensor]):
        tensors = list(tensors)
        self._identity = _identity(tensors)
        self._values = [t.detach().clone() for t in tensors]
        self._steps = optimizer_steps()

    def forget(self):
        self._identity = self._values = None

    @property
    def empty(self) -> bool:
        return self._values is None

    def still_current(self, tensors: Iterable[Tensor], contents: bool = True) -> bool:
        """True when ``tensors`` are those remembered, unchanged. ``contents=False`` skips the
        comparison of values (see the module doc for the one place where that is safe), unless
        an optimizer stepped since it was last made."""
        if self._values is None:
            return False
        tensors = list(tensors)
        if _identity(tensors) != self._identity:
            return False
        steps = optimizer_steps()
        if (contents or steps != self._steps) and not all(
                torch.equal(t.detach(), v) for t, v in zip(tensors, self._values)):
            return False
        self._steps = steps
        return True
