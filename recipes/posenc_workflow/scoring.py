#!/usr/bin/env python
"""BLEU of a fairseq-generate output, both ways the papers report it, appended to a results file.

    python recipes/posenc_workflow/scoring.py score --generation gen.txt --lang de --ref test.raw.de \\
        --label "wmt14_en_de en-de enc=sinusoidal arch=base newstest2014" --results results.txt

``gen.txt`` is ``fairseq-generate --remove-bpe`` output over Moses-tokenized text (or its n-best
list reranked to one hypothesis per sentence by ``recipes/posenc_workflow/rerank.py``). Two lines are
appended to ``--results`` (atomically, under a lock, so parallel runs do not interleave):

* SacreBLEU (default 13a tokenisation) of the detokenized hypotheses against the raw reference,
  with its signature;
* tokenized BLEU: BLEU on the tokens as they are (sacrebleu with ``--tokenize none``, as
  multi-bleu.perl) of the hypotheses against the tokenized references (the T- lines). For a
  German target the tokens are first compound-split as fairseq's
  ``scripts/compound_split_bleu.sh`` (a-b -> a ##AT##-##AT## b on both sides), the En-De
  convention of Vaswani et al. and fairseq's "Scaling NMT" recipe; for every other target
  language (En-Fr, and WMT18's en-cs and cs-en) they are not: none of the papers splits there,
  and splitting usually raises the score (a matched compound counts as three matched tokens, a
  compound with one part wrong is no longer a whole miss). The target language decides, so
  WMT18 en-de is split and de-en, en-cs, cs-en are not. The results line says which was done:
  "(compound split, tokenize none)" or "(no compound split, tokenize none)".

``--bpe subword_nmt|sentencepiece`` removes the subword segmentation of an output decoded without
``--remove-bpe`` (the short-to-long study's split in subwords) from its H- and T- lines first.
Without ``--ref`` the references are the T- lines, detokenized for SacreBLEU (the split's test
pairs are training pairs: no raw reference is kept for them).

``--lowercase`` scores as IWSLT'14 is reported, where fairseq's prepare-iwslt14.sh lowercases
everything: SacreBLEU case-insensitive (``-lc``, signature ``case:lc``) against the raw,
mixed-case references, and tokenized BLEU on the lowercased tokens against the lowercased
tokenized references (the T- lines; what fairseq-generate's own BLEU prints on that corpus).

    python recipes/posenc_workflow/scoring.py detok-generation --generation gen.txt --lang de \\
        --bpe subword_nmt --out gen.detok.txt

keeps the S- lines as they are (for binning by source length in subwords) and rewrites the H-
and T- lines as detokenized words, for ``bleu_by_length.py``.
"""
import argparse
import datetime
import fcntl
import json
import logging
import os
import re
from typing import List, Optional

logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
from posenc_workflow.generation import parse_generate_output  # noqa: E402
from posenc_workflow.length_bins import write_text_atomically  # noqa: E402
from posenc_workflow.text import detokenize_line, read_file  # noqa: E402


# target languages whose tokenized BLEU is computed on compound-split tokens (the En-De convention)
COMPOUND_SPLIT_LANGUAGES = frozenset({"de"})


def splits_compounds(lang: str) -> bool:
    """Whether tokenized BLEU into ``lang`` (the target language) splits compounds: German only."""
    return lang.lower() in COMPOUND_SPLIT_LANGUAGES


def compound_split(line: str) -> str:
    """fairseq's compound_split_bleu.sh: ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``."""
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", line)


def remove_bpe(line: str, bpe: str) -> str:
    if bpe == "sentencepiece":
        return "".join(line.split()).replace("\u2581", " ").strip()
    if bpe == "subword_nmt":
        return re.sub(r"@@( |$)", "", line).rstrip()
    return line


def append_atomically(path: str, lines: List[str]):
    """Append ``lines`` to ``path``: the file is replaced whole, under an exclusive lock."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
        write_text_atomically(path, old + "".join(line + "\n" for line in lines))


def load_generation(path: str):
    generation = parse_generate_output("\n".join(read_file(path)), path)
    if not generation.hypotheses:
        raise ValueError(f"{path} has no H- lines: is it fairseq-generate output?")
    return generation


def cmd_score(args):
    from sacrebleu.metrics import BLEU

    generation = load_generation(args.generation)
    if args.bpe != "none":
        generation.hypotheses = [remove_bpe(h, args.bpe) for h in generation.hypotheses]
        generation.references = [remove_bpe(t, args.bpe) for t in generation.references]
    ids = generation.ids
    hyps_detok = [detokenize_line(args.lang, h) for h in generation.hypotheses]
    if args.ref:
        raw_refs = read_file(args.ref)
        if max(ids) >= len(raw_refs):
            raise ValueError(f"{args.generation} has sentence {max(ids)} but {args.ref} has {len(raw_refs)} lines")
        refs_detok = [raw_refs[i] for i in ids]
    else:
        refs_detok = [detokenize_line(args.lang, t) for t in generation.references]
    write_text_atomically(args.generation + ".detok", "".join(h + "\n" for h in hyps_detok))

    sacre = BLEU(lowercase=args.lowercase)
    sacre_score = sacre.corpus_score(hyps_detok, [refs_detok])
    split = splits_compounds(args.lang)
    prepare = compound_split if split else (lambda line: line)
    if args.lowercase:
        prepare = (lambda line: compound_split(line.lower())) if split else str.lower
    tok = BLEU(tokenize="none", force=True)
    tok_score = tok.corpus_score([prepare(h) for h in generation.hypotheses],
                                 [[prepare(t) for t in generation.references]])
    how = "compound split" if split else "no compound split"
    cased = ", lowercased" if args.lowercase else ""
    how += cased
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    head = f"{stamp} | {args.label} | {len(ids)} sentences"
    lines = [f"{head} | SacreBLEU {sacre_score.score:.2f} (detokenized{cased}) | {sacre.get_signature()}",
             f"{head} | tokenized BLEU {tok_score.score:.2f} ({how}, tokenize none) | "
             + str(tok_score).split("=", 1)[1].split(" ", 2)[2]]
    append_atomically(args.results, lines)
    if args.json:
        write_text_atomically(args.json, json.dumps(
            {"label": args.label, "sentences": len(ids), "sacrebleu": round(sacre_score.score, 2),
             "signature": str(sacre.get_signature()), "tokenized_bleu": round(tok_score.score, 2),
             "compound_split": split, "lowercase": args.lowercase}))
    print("\n".join(lines))


def cmd_detok_generation(args):
    out = []
    for line in read_file(args.generation):
        kind, _, rest = line.partition("\t")
        if kind.startswith("H-"):
            score, _, text = rest.partition("\t")
            line = f"{kind}\t{score}\t{detokenize_line(args.lang, remove_bpe(text, args.bpe))}"
        elif kind.startswith("T-"):
            line = f"{kind}\t{detokenize_line(args.lang, remove_bpe(rest, args.bpe))}"
        elif not kind.startswith("S-"):
            continue
        out.append(line)
    write_text_atomically(args.out, "".join(line + "\n" for line in out))


def main(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("score", help="SacreBLEU and tokenized BLEU, appended to --results")
    p.add_argument("--generation", required=True, help="fairseq-generate --remove-bpe output")
    p.add_argument("--lang", required=True, help="target language (for the detokenizer; tokenized BLEU "
                                                "splits compounds for de only)")
    p.add_argument("--ref", help="raw (untokenized) references, one per test sentence; "
                                 "default: the detokenized T- lines")
    p.add_argument("--label", required=True, help="what was scored, for the results line")
    p.add_argument("--results", required=True, help="file to append the two result lines to")
    p.add_argument("--json", help="also write the scores here")
    p.add_argument("--lowercase", action="store_true",
                   help="case-insensitive, as IWSLT'14 is reported: SacreBLEU -lc and lowercased tokenized BLEU")
    p.add_argument("--bpe", choices=["subword_nmt", "sentencepiece", "none"], default="none",
                   help="the subword segmentation left in the H- and T- lines (decoded without --remove-bpe), removed first")
    p.set_defaults(fn=cmd_score)
    p = sub.add_parser("detok-generation", help="S- lines kept, H-/T- lines BPE-removed and detokenized")
    p.add_argument("--generation", required=True)
    p.add_argument("--lang", required=True)
    p.add_argument("--bpe", choices=["subword_nmt", "sentencepiece", "none"], default="subword_nmt")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_detok_generation)
    args = parser.parse_args(argv)
    try:
        args.fn(args)
    except (ValueError, OSError) as e:
        parser.exit(2, f"scoring.py {args.command}: error: {e}\n")


if __name__ == "__main__":
    main()
