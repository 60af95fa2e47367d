#!/usr/bin/env python
"""Pick each sentence's hypothesis from a fairseq-generate n-best list by a length penalty of your choice.

    fairseq-generate DATA --path model.pt --beam 4 --nbest 4 --unnormalized ... > gen.nbest.txt
    python recipes/posenc_workflow/rerank.py --generation gen.nbest.txt --form gnmt --alpha 0.6 --beam 4 \\
        --out gen.txt

Two forms of length penalty, both dividing a hypothesis' summed log-probability log P(Y|X):

* ``fairseq``: |Y|^alpha, what ``fairseq-generate --lenpen alpha`` does;
* ``gnmt``: lp(Y) = ((5 + |Y|) / 6)^alpha, Wu et al. 2016 (GNMT), which Vaswani et al.'s alpha = 0.6
  and DIET's tensor2tensor decoding use (GNMT's coverage penalty is not used there: beta = 0).

|Y| counts the output tokens with the end-of-sentence token, as both fairseq (``(step + 1)``,
``step`` being the index of the EOS) and tensor2tensor (``i + 1`` at the step that emits EOS) count
it: the number of values on the P- line.

Why reranking an n-best list gives what fairseq's generator would give with GNMT's penalty
(fairseq 0.12, ``fairseq/sequence_generator.py``): the beam is advanced on raw summed
log-probabilities (``search.step`` is given the raw cumulative ``scores``); an EOS candidate is
finalized when it is among the top ``beam`` candidates of its step, and a sentence is done when
``beam`` hypotheses are finalized or the maximum length is reached (``is_finished``). The length
penalty is applied only to the score stored with a finalized hypothesis
(``eos_scores /= (step + 1) ** len_penalty``, when scores are normalized), and that score serves
only to sort the finished list at the end. So the set of finalized hypotheses does not depend on
``--lenpen``, only their order does; ``--nbest BEAM`` prints all of them, ``--unnormalized`` (or
``--lenpen 0``) with their raw scores, and the best of them by raw / lp(Y) is the hypothesis that
generator would pick with lp(Y) in place of |Y|^alpha. It is not necessarily what tensor2tensor's
own beam search picks: that one keeps searching after ``beam`` hypotheses have finished, keeps the
best ``beam`` finished ones by penalized score, and stops early by a bound that depends on alpha.

Input: ``fairseq-generate`` output with ``--nbest`` > 1 (all of ``--beam``) and raw scores
(``--unnormalized`` or ``--lenpen 0``; scores normalized by another length penalty are refused:
each H- score must equal the sum of its P- line). H- scores and P- values are in base 2, as fairseq
prints them. Output: one hypothesis per sentence, in the input's sentence order: its S- and T-
lines, then the chosen hypothesis' H-, D-, P- lines (and A-, I-, E- lines when present) as
fairseq wrote them, the H- and D- scores replaced by the penalized score (raw / lp(Y), base 2),
as ``--lenpen`` output holds its normalized score. Other lines (fairseq's log, and its final
"Generate ... BLEU" line, which scored the raw-score best) are dropped. Ties go to the hypothesis
listed first (the higher raw score). A summary goes to stderr.
"""
import argparse
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import List, Optional

from posenc_workflow.text import read_file  # lines split at "\n" only, as fairseq wrote them

FORMS = ("fairseq", "gnmt")
# printed P- values are rounded to 4 decimals; float32 machine epsilon for the sums fairseq kept
_P_ROUNDING = 0.5e-4
_EPS32 = 2.0 ** -23
_LINE = re.compile(r"^([A-Z])-(\d+)(?:_\d+)?\t")


def write_text_atomically(path: str, text: str):
    """As length_bins' (a copy: importing that module would make an edit of the length split rerun
    every rerank, sources.py)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def length_penalty(length: int, alpha: float, form: str) -> float:
    """The divisor of a hypothesis' summed log-probability: ``|Y|**alpha`` (fairseq) or
    ``((5 + |Y|) / 6)**alpha`` (GNMT), ``length`` = |Y| with the end-of-sentence token."""
    if length < 1:
        raise ValueError(f"a hypothesis has at least one token (its end of sentence), not {length}")
    if form == "fairseq":
        return float(length) ** alpha
    if form == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    raise ValueError(f"unknown length penalty form {form!r}; choose from {', '.join(FORMS)}")


@dataclass
class Hypothesis:
    score: float  # raw summed log-probability, base 2, as the H- line holds it
    text: str
    positional: List[float]
    lines: List[str] = field(default_factory=list)  # H-, D-, P-, ... as fairseq wrote them

    @property
    def length(self) -> int:
        return len(self.positional)


@dataclass
class Sentence:
    id: int
    head: List[str] = field(default_factory=list)  # S-, T-
    hypotheses: List[Hypothesis] = field(default_factory=list)


def _float(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a number") from None


def parse_nbest(lines: List[str], path: str = "generation") -> List[Sentence]:
    """The sentences of fairseq-generate output, in the order it printed them, each with every
    hypothesis printed for it (in fairseq's order)."""
    sentences = {}
    for number, line in enumerate(lines, 1):
        m = _LINE.match(line)
        if not m:
            continue  # fairseq's log lines and its final BLEU line
        kind, sid = m.group(1), int(m.group(2))
        sentence = sentences.setdefault(sid, Sentence(sid))
        rest = line[m.end():]
        if kind in "ST":
            sentence.head.append(line)
        elif kind == "H":
            score, _, text = rest.partition("\t")
            sentence.hypotheses.append(Hypothesis(_float(score, f"{path} line {number}"), text, [], [line]))
        else:
            if not sentence.hypotheses:
                raise ValueError(f"{path} line {number}: {kind}-{sid} comes before any H-{sid} line")
            hypothesis = sentence.hypotheses[-1]
            if kind == "P":
                if hypothesis.positional:
                    raise ValueError(f"{path} line {number}: a second P-{sid} line for one hypothesis")
                hypothesis.positional = [_float(v, f"{path} line {number}") for v in rest.split()]
            hypothesis.lines.append(line)
    if not sentences or not any(s.hypotheses for s in sentences.values()):
        raise ValueError(f"{path} has no H- lines: is it fairseq-generate output?")
    for s in sentences.values():
        if not s.hypotheses:
            raise ValueError(f"{path}: sentence {s.id} has no H- line")
        for h in s.hypotheses:
            if not h.positional:
                raise ValueError(f"{path}: a hypothesis of sentence {s.id} has no P- line "
                                 "(fairseq-generate prints them unless --quiet)")
    return list(sentences.values())


def check_unnormalized(sentences: List[Sentence], path: str = "generation"):
    """Each H- score must be the sum of its P- values (within their 4-decimal rounding and
    float32's): scores normalized by a length penalty cannot be reranked by another."""
    for s in sentences:
        for h in s.hypotheses:
            if not (math.isfinite(h.score) and all(math.isfinite(p) for p in h.positional)):
                continue  # a hypothesis fairseq scored -inf (e.g. --match-source-len)
            total = sum(h.positional)
            tolerance = h.length * _P_ROUNDING + 2 * (h.length + 1) * _EPS32 * max(abs(h.score), abs(total))
            if abs(h.score - total) > tolerance:
                raise ValueError(
                    f"{path}: sentence {s.id}: the H- score {h.score} is not the sum of its P- line ({total:.4f}): "
                    "the scores are normalized; decode with --unnormalized (or --lenpen 0)")


def choose(hypotheses: List[Hypothesis], alpha: float, form: str) -> int:
    """Index of the hypothesis with the highest raw score / lp(|Y|); the first on a tie."""
    scores = [h.score / length_penalty(h.length, alpha, form) for h in hypotheses]
    return max(range(len(scores)), key=lambda j: scores[j])


def with_score(line: str, score: float) -> str:
    """An H- or D- line with its score replaced."""
    kind, _, rest = line.partition("\t")
    _, _, text = rest.partition("\t")
    return f"{kind}\t{score!r}\t{text}"


def rerank(sentences: List[Sentence], alpha: float, form: str) -> List[str]:
    out = []
    for s in sentences:
        best = s.hypotheses[choose(s.hypotheses, alpha, form)]
        score = best.score / length_penalty(best.length, alpha, form)
        out += s.head
        out += [with_score(line, score) if line[:1] in "HD" else line for line in best.lines]
    return out


def main(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="See the module docstring (python -m pydoc recipes/posenc_workflow/rerank.py) "
                                            "for why this equals decoding with that penalty.")
    parser.add_argument("--generation", required=True,
                        help="fairseq-generate output decoded with --nbest BEAM and --unnormalized (or --lenpen 0)")
    parser.add_argument("--out", required=True, help="where to write the one-best output ('-': stdout)")
    parser.add_argument("--form", choices=FORMS, default="gnmt",
                        help="gnmt: ((5+|Y|)/6)^alpha (Wu et al. 2016; Vaswani et al., tensor2tensor); "
                             "fairseq: |Y|^alpha (fairseq-generate --lenpen). Default: gnmt")
    parser.add_argument("--alpha", type=float, default=0.6, help="the length penalty's exponent (default 0.6)")
    parser.add_argument("--beam", type=int,
                        help="the beam it was decoded with: every sentence must then have this many hypotheses "
                             "(a shorter n-best list would leave some of the beam's hypotheses out)")
    args = parser.parse_args(argv)
    try:
        sentences = parse_nbest(read_file(args.generation), args.generation)
        counts = [len(s.hypotheses) for s in sentences]
        wrong = [s for s in sentences if len(s.hypotheses) != args.beam] if args.beam is not None else []
        if wrong:
            raise ValueError(f"{args.generation}: {len(wrong)} sentence(s) do not have {args.beam} hypotheses "
                             f"(sentence {wrong[0].id} has {len(wrong[0].hypotheses)}): "
                             f"decode with --nbest {args.beam}")
        if args.beam is None and max(counts) == 1:
            raise ValueError(f"{args.generation} has one hypothesis per sentence: nothing to rerank; "
                             "decode with --nbest BEAM --unnormalized")
        check_unnormalized(sentences, args.generation)
        out = rerank(sentences, args.alpha, args.form)
        text = "".join(line + "\n" for line in out)
        if args.out == "-":
            sys.stdout.write(text)
        else:
            write_text_atomically(args.out, text)
    except (ValueError, OSError) as e:
        parser.exit(2, f"rerank.py: error: {e}\n")
    chosen = [choose(s.hypotheses, args.alpha, args.form) for s in sentences]
    other = "gnmt" if args.form == "fairseq" else "fairseq"
    differs = sum(c != choose(s.hypotheses, args.alpha, other) for c, s in zip(chosen, sentences))
    print(f"rerank.py: {len(sentences)} sentences, {min(counts)}-{max(counts)} hypotheses each; "
          f"{args.form} length penalty, alpha {args.alpha}: the best by raw score replaced in "
          f"{sum(c != 0 for c in chosen)}, {other}'s form would pick another in {differs}", file=sys.stderr)


if __name__ == "__main__":
    main()
