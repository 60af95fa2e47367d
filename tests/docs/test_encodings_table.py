"""docs/encodings.md's table of position encodings is the registry's: a row per registered
encoding, in its order, each with its parameter count and whether it extrapolates as the class
says, and flags of its own. A registry line without a row (or a row left after its line) fails
here: the row is the one edit outside the new file and its registry line, and it is the docs'."""
import dataclasses
import os
import re

import pytest

from fairseq_posenc.models import from_flags
from fairseq_posenc.positions import POSITION_ENCODINGS
from helpers.doc_commands import REPO
from helpers.toy import ToyTask

PAGE = os.path.join(REPO, "docs", "encodings.md")
HEADER = "| `--position-encoding` | what it adds | flags (default) | parameters | extrapolates |"


def rows():
    """{name: (flags, parameters, extrapolates)} of the table, in its order."""
    text = open(PAGE, encoding="utf-8").read()
    lines = text[text.index(HEADER):].splitlines()[2:]
    table = {}
    for line in lines:
        if not line.startswith("| `"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        table[cells[0].strip("`")] = (cells[2], cells[3], cells[4])
    return table


def test_the_table_has_a_row_per_registered_encoding_in_its_order():
    registered = list(POSITION_ENCODINGS)
    assert list(rows()) == registered, f"docs/encodings.md: the table's rows are not the registry's {registered}"


@pytest.mark.parametrize("name", list(POSITION_ENCODINGS))
def test_a_row_says_what_its_class_does(name):
    flags, parameters, extrapolates = rows()[name]
    scheme = POSITION_ENCODINGS[name]
    assert extrapolates == ("yes" if scheme.extrapolates else "no")
    declared = {"--" + f.name.replace("_", "-") for f in dataclasses.fields(scheme.config)} if scheme.config else set()
    # each flag the row names is one of the class's (`--floater-*`: a prefix of some)
    for flag in re.findall(r"`(--[\w-]+\*?)`", flags):
        assert any(d.startswith(flag[:-1]) for d in declared) if flag.endswith("*") else flag in declared, flag
    # a base model (d 512, 8 heads, 6 + 6 layers, 1024 positions), encoder and decoder together
    model = from_flags.build_from_flags("transformer_posenc_wmt_en_de", ["--position-encoding", name], ToyTask(),
                                        max_positions=1024)
    count = sum(p.numel() for key, p in model.named_parameters() if "position" in key)
    assert parameters == f"{count:,}"
