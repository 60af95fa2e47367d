"""Whether something computed from parameters (a position table, FLOATER's ODE solution) and
kept across forwards is still theirs.

No single signal is enough, so two are checked:

- each tensor's identity, device, dtype and version counter: ``.to()``, ``.half()``,
  ``load_state_dict`` and in-place writes under ``no_grad`` change one of them;
- the values themselves, compared with a copy taken when the result was computed. Code that
  writes through ``p.data`` bumps no version counter: fairseq's optimizers write that way, and
  so may EMA or checkpoint averaging done in memory. Version counters alone let validation
  during ``fairseq-train`` run with the tables of the first validation.

The value comparison costs one pass over the parameters (docs/encodings.md says how long), once
per forward of a stack. During one step-by-step decode the whole check is made at the first step
only: fairseq's cached keys and values are of the parameters of that first step as well, so
nothing can change them in between without breaking the decode anyway.

Beside the tensors, every kept result has a key: the configuration of the module that built it
(:func:`configuration`: its settings, derived from its attributes, not listed by hand: dt, the
solver, --rnn-dt, RoPE's theta, ...), the device and the dtype it was computed for. A result is
reused only under the same key, so that a module without parameters (RoPE) does not reuse a CPU
table after ``.cuda()``, and a solution loaded from a checkpoint is not reused under another dt.

What is kept belongs to one module: a deep copy (fairseq's EMA copies the model right after an
update, when kept tensors still carry autograd history) starts with nothing kept
(:class:`ForgetsKeptOnCopy`), and fairseq's EMA neither averages nor copies kept results
(:func:`kept_result_keys`, ``compat.ema_averages_parameters``).
"""
import contextlib
import copy
import enum
from typing import Hashable, Iterable, Iterator, List, Optional, Set, Tuple

import torch
import torch.nn as nn
from torch import Tensor


def _identity(tensors: List[Tensor]) -> Tuple:
    return tuple((t._version, t.data_ptr(), t.device, t.dtype, t.shape) for t in tensors)


def _plain(value) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str, enum.Enum))


def configuration(module: nn.Module) -> Tuple:
    """The settings of ``module`` and of its submodules, as (name, value) pairs with each module's
    class: every public attribute that holds a plain value (a number, string, bool, None, enum, or
    a tuple or list of them). Excluded are ``training`` and the attributes a class names in
    ``running_state`` (what the module accumulates as it runs, not how it computes).

    Derived, not listed, so that a setting added later is in the key without anyone adding it: an
    attribute that is state, not a setting, costs a recomputation, never a wrong reuse. Objects
    that are not plain values (FLOATER's training schedule) are left out."""
    items = []
    for prefix, m in module.named_modules():
        items.append((prefix, type(m).__qualname__))
        skip = {"training", *getattr(type(m), "running_state", ())}
        for name, value in sorted(vars(m).items()):
            if not name.startswith("_") and name not in skip and _plain(value):
                items.append((f"{prefix}.{name}", tuple(value) if isinstance(value, list) else value))
    return tuple(items)


def kept_key(module: nn.Module, device: torch.device, dtype: torch.dtype) -> Tuple:
    """What a kept result of ``module`` is valid for besides its tensors: the module's
    :func:`configuration`, and the device and dtype the result is computed for."""
    return configuration(module), torch.device(device), dtype


class KeptFrom:
    """The key and the tensors a kept result was computed from: :meth:`remember` them when
    computing it, ask :meth:`still_current` before reusing it."""

    def __init__(self):
        self.key: Optional[Hashable] = None
        self._identity: Optional[Tuple] = None
        self._values: Optional[List[Tensor]] = None

    def remember(self, key: Hashable, tensors: Iterable[Tensor]):
        tensors = list(tensors)
        self.key = key
        self._identity = _identity(tensors)
        self._values = [t.detach().clone() for t in tensors]

    def forget(self):
        self.key = self._identity = self._values = None

    @property
    def empty(self) -> bool:
        return self._values is None

    def still_current(self, key: Hashable, tensors: Iterable[Tensor], contents: bool = True) -> bool:
        """True when ``key`` and ``tensors`` are those remembered, unchanged. ``contents=False``
        skips the comparison of values (see the module doc for the one place where that is safe)."""
        if self._values is None or key != self.key:
            return False
        tensors = list(tensors)
        if _identity(tensors) != self._identity:
            return False
        if contents and not all(torch.equal(t.detach(), v) for t, v in zip(tensors, self._values)):
            return False
        return True


class ForgetsKeptOnCopy:
    """Mixin for a module that keeps results across forwards: ``_forget_kept`` (re)binds the
    attributes that hold them to empty values (assigning new objects, never clearing the old
    ones: the original keeps what it kept), and a deep copy starts from those, with everything
    else copied. A copy made right after a training forward would otherwise meet tensors with autograd
    history, which torch refuses to deep-copy."""

    def _forget_kept(self):
        raise NotImplementedError

    def __deepcopy__(self, memo):
        cls = type(self)
        shallow = cls.__new__(cls)
        shallow.__dict__.update(vars(self))
        shallow._forget_kept()  # rebinds the kept attributes of the shallow copy only
        result = cls.__new__(cls)
        memo[id(self)] = result
        for name, value in vars(shallow).items():
            result.__dict__[name] = copy.deepcopy(value, memo)
        return result


def kept_result_keys(model: nn.Module) -> Set[str]:
    """The state-dict entries of ``model`` that hold kept results, not parameters (FLOATER's
    solution): the names each module's class lists in ``kept_results``."""
    return {f"{prefix}.{name}" if prefix else name
            for prefix, m in model.named_modules() for name in getattr(type(m), "kept_results", ())}


_not_saving = 0


@contextlib.contextmanager
def not_saving() -> Iterator[None]:
    """State dicts taken inside are read for their parameters (fairseq's EMA takes two every
    update), not saved: modules need not bring their kept results up to date for them."""
    global _not_saving
    _not_saving += 1
    try:
        yield
    finally:
        _not_saving -= 1


def saving() -> bool:
    """False inside :func:`not_saving`."""
    return _not_saving == 0
