"""Which of a warm-started run's model flags belong to its second stage only.

FLOATER's protocol (the workflow's warm_start) trains a sinusoidal model, then the warm-started
encoding (floater, rnn) from it. A study's flags hold both kinds: sizes, which both stages share,
and the warm-started encoding's own flags (``--rnn-layers``, ``--floater-dt``), which the
sinusoidal model refuses. The split is read off the encodings' config dataclasses, so a new flag
of either encoding lands on the right side without a list here (commands.py's commands of the
vanilla stage and the control).
"""
import dataclasses
from typing import List, Tuple


def _own_options(encoding: str) -> set:
    """The options of ``encoding``'s config that the sinusoidal encoding's config does not have."""
    from fairseq_posenc.positions import POSITION_ENCODINGS  # the plugin's registry: torch, fairseq (seconds)

    def options(name):
        config = POSITION_ENCODINGS[name].config
        return {"--" + f.name.replace("_", "-") for f in dataclasses.fields(config)} if config else set()

    return options(encoding) - options("sinusoidal")


def split(encoding: str, flags: List[str]) -> Tuple[List[str], List[str]]:
    """(both stages' flags, the second stage's own), each option with the values after it."""
    own = _own_options(encoding)
    shared, second, target = [], [], None
    for item in flags:
        if item.startswith("--"):
            target = second if item.split("=", 1)[0] in own else shared
        (target if target is not None else shared).append(item)
    return shared, second
