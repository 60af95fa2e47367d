"""Which of a warm-started run's model flags belong to its second stage only.

FLOATER's protocol (recipes/floater/protocol.sh) trains a sinusoidal model, then the warm-started
encoding (floater, rnn) from it. The user's MODEL_FLAGS hold both kinds: sizes, which both stages
share, and the warm-started encoding's own flags (``--rnn-layers``, ``--floater-dt``), which the
sinusoidal model refuses. The split is read off the encodings' config dataclasses, so a new flag
of either encoding lands on the right side without a list here.

    python -m fairseq_posenc.recipe.flags --encoding rnn -- --encoder-layers 2 --rnn-layers 2
    # prints two lines: "--encoder-layers 2" (both stages) and "--rnn-layers 2" (the second only)
"""
import argparse
import dataclasses
import sys
from typing import List, Optional, Tuple


def _own_options(encoding: str) -> set:
    """The options of ``encoding``'s config that the sinusoidal encoding's config does not have."""
    from ..positions import POSITION_ENCODINGS

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


def main(argv: Optional[List[str]] = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--encoding", required=True, help="the warm-started encoding (floater, rnn)")
    args = parser.parse_args(argv)
    shared, second = split(args.encoding, flags)
    # the recipes expand each line unquoted, as they expand MODEL_FLAGS itself
    print(" ".join(shared))
    print(" ".join(second))


if __name__ == "__main__":
    main()
