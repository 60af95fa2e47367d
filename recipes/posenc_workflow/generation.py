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


class RepeatedIdError(ValueError):
    """One source sentence id twice in one file: two outputs joined, of which one would be lost."""


_LINE = re.compile(r"^([STH])-(\d+)\t(.*)$")


def parse_generate_output(text: str, name: str = "the generation") -> Generation:
    """Hypotheses, references and sources of ``fairseq-generate`` output, in corpus order. A
    sentence id whose S- line repeats is refused (:class:`RepeatedIdError`, naming ``name``): two
    outputs concatenated count their ids from 0 each, and keeping one sentence of an id would drop
    the other without a word. H- lines may repeat (``--nbest``): the first is the best."""
    rows: Dict[str, Dict[int, str]] = {"S": {}, "T": {}, "H": {}}
    for line in text.split("\n"):  # not splitlines: a hypothesis may hold U+2028
        m = _LINE.match(line)
        if m:
            kind, idx, rest = m.group(1), int(m.group(2)), m.group(3)
            if kind == "S" and idx in rows["S"]:
                raise RepeatedIdError(f"{name}: source sentence id {idx} repeats (fairseq-generate outputs joined "
                                      "into one file? give each of them as a file of its own)")
            if kind == "H":
                rest = rest.split("\t", 1)[1]  # drop the score
            rows[kind].setdefault(idx, rest)  # first (best) hypothesis only
    ids = sorted(rows["H"])
    return Generation([rows["H"][i] for i in ids], [rows["T"].get(i, "") for i in ids], [rows["S"][i] for i in ids],
                      ids)


def join(generations: List[Generation]) -> Generation:
    """Several test sets' generations as one, in the order given, each one's ids moved past the
    previous one's largest, so that no two sentences share an id."""
    out = Generation([], [], [], [])
    for generation in generations:
        offset = max(out.ids) + 1 if out.ids else 0
        out.hypotheses += generation.hypotheses
        out.references += generation.references
        out.sources += generation.sources
        out.ids += [offset + i for i in generation.ids]
    return out
