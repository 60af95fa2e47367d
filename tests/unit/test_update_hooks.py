"""fairseq_posenc/update_hooks.py's calls for a loop of one's own (scripts/benchmark.py): which
modules they reach, with what. (Through fairseq's trainer: tests/fairseq/test_floater_schedule.py.)"""
import pathlib
import re
import types

import torch

import fairseq_posenc
from fairseq_posenc.update_hooks import _check_trainer, announce_update, finish_update


class Recorder(torch.nn.Module):
    def __init__(self, wants=True):
        super().__init__()
        self.calls = []
        self.wants_finish_update = wants

    def begin_update(self, passes):
        self.calls.append(("begin", passes))

    def finish_update(self, scale, trainer=None):
        self.calls.append(("finish", scale, trainer))


def test_every_module_that_asks_is_told_and_no_other():
    wants, declines = Recorder(), Recorder(wants=False)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(wants, declines))
    announce_update(model, 3)
    finish_update(model)  # a loop of one's own: its gradients are already the update's (scale 1)
    finish_update(model, 0.25)
    assert wants.calls == [("begin", 3), ("finish", 1.0, None), ("finish", 0.25, None)]
    # wants_finish_update False: nothing to add, so not finished (begin_update still reaches it)
    assert declines.calls == [("begin", 3)]


def test_a_trainer_is_checked_once():
    """``check_trainer`` runs once a trainer: when it is built, not again at each update (fairseq's
    ``train_step`` checks as well, for a trainer built before the plugin was loaded)."""
    class Checked(Recorder):
        def check_trainer(self, trainer):
            self.calls.append(("check", trainer))

    module = Checked()
    trainer = types.SimpleNamespace(_model=torch.nn.Sequential(module))
    _check_trainer(trainer)
    _check_trainer(trainer)
    assert module.calls == [("check", trainer)]


def test_the_plugin_runs_no_code_of_its_own_making():
    """fairseq's code is wrapped, never rewritten: no ``exec(`` nor builtin ``eval(`` in the package
    (``model.eval()`` runs no code)."""
    package = pathlib.Path(fairseq_posenc.__file__).parent
    sources = sorted(package.rglob("*.py"))
    assert len(sources) > 20  # the package itself, not an empty folder
    found = [f"{path.relative_to(package)}:{n}" for path in sources
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"(?<![\w.])(exec|eval)\(", line)]
    assert found == []
