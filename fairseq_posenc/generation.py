"""fairseq-generate's output as hypotheses, references and sources in corpus order (a module of
its own, light: the scoring and report scripts read it without the rest of the pipeline)."""
import re
from dataclasses import dataclass
from typing import Dict, List


@dataclass
class Generation:
    hypotheses: List[str]
    references: List[str]
    sources: List[str]
    ids: List[int]  # the sentence ids of the test set, in the order above


_LINE = re.compile(r"^([STH])-(\d+)\t(.*)$")


def parse_generate_output(text: str) -> Generation:
    """Hypotheses, references and sources of ``fairseq-generate`` output, in corpus order."""
    rows: Dict[str, Dict[int, str]] = {"S": {}, "T": {}, "H": {}}
    for line in text.split("\n"):  # not splitlines: a hypothesis may hold U+2028
        m = _LINE.match(line)
        if m:
            kind, idx, rest = m.group(1), int(m.group(2)), m.group(3)
            if kind == "H":
                rest = rest.split("\t", 1)[1]  # drop the score
            rows[kind].setdefault(idx, rest)  # first (best) hypothesis only
    ids = sorted(rows["H"])
    return Generation([rows["H"][i] for i in ids], [rows["T"].get(i, "") for i in ids], [rows["S"][i] for i in ids],
                      ids)
