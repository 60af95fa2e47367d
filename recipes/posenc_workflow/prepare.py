#!/usr/bin/env python
"""Preparing a corpus as fairseq's examples/translation/prepare-*.sh make it, one step per rule of
recipes/rules/prepare.smk, each step's settings a JSON object (the rule's params):

    python recipes/posenc_workflow/prepare.py gather   --data data/files_de_en --settings JSON
    python recipes/posenc_workflow/prepare.py tokenize --data data/wmt14_en_de --settings JSON
    python recipes/posenc_workflow/prepare.py segment  --data data/wmt14_en_de --settings JSON
    python recipes/posenc_workflow/prepare.py binarize --data data/wmt14_en_de --settings JSON
    python recipes/posenc_workflow/prepare.py test     --data data/files_de_en --out OUT/tests/NAME/data --settings JSON

WMT (prepare-wmt14en2*.sh): Moses' punctuation normalisation, non-printing characters to spaces
and the tokenizer with -a on training and validation text (the test set only has its curly
apostrophes straightened, so that tokenized BLEU's references are fairseq's); every Nth training
pair validates (``valid: split``) or the official set does; joint BPE learned on the training
part; training pairs cleaned to 1-250 BPE tokens with ratio 1.5; the test set kept whole.

Your own files (``corpus.name: files``): ``gather`` copies them (and reads a sacrebleu test set
by name from sacrebleu's cache, downloading it there if missing) into DATA/raw/, UTF-8 lines ended
by \n (Windows' \r\n taken; a \r inside a line refused, naming the file and line), then the WMT
steps run on them; each named test set is prepared apart (``test``: under the study,
OUT/tests/NAME/data, with the corpus's BPE and dictionaries); ``tokenize: none`` keeps text that
is already tokenized as it is.

IWSLT'14 (prepare-iwslt14.sh): the tokenizer without -a nor normalisation, training pairs cleaned
to 1-175 tokens with ratio 1.5 before lowercasing, every 23rd pair validates, 10k BPE merges
learned on both training sides concatenated, a dictionary per language.

Besides DATA/{train,valid,test}.{src,tgt} (segmented) a step leaves DATA/train.tok.* (the training
pairs before BPE, for counting words) and DATA/test.raw.* (the references SacreBLEU scores against).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = os.path.join(HERE, "text.py")
ROOT = os.path.dirname(os.path.dirname(HERE))


class PrepareError(Exception):
    pass


def _bin(name: str) -> str:
    """A command of this Python environment (the venv's bin/), else from PATH."""
    local = os.path.join(os.path.dirname(sys.executable), name)
    return local if os.path.exists(local) else name


def _run(cmd: List[str], stdin=None, stdout=None, log: str = ""):
    out = open(log, "w") if log else None
    try:
        proc = subprocess.run(cmd, stdin=stdin, stdout=stdout if stdout is not None else out,
                              stderr=out if out else None)
    finally:
        if out:
            out.close()
    if proc.returncode:
        tail = open(log).read()[-2000:] if log else ""
        raise PrepareError(f"{os.path.basename(cmd[0])} {' '.join(cmd[1:3])} ... failed (exit {proc.returncode})"
                           + (f" (log: {log})\n{tail}" if log else ""))


def _filter(cmd: List[str], src: str, dst: str):
    """cmd < src > dst, dst replaced whole."""
    with open(src, "rb") as fin, open(dst + ".tmp", "wb") as fout:
        _run(cmd, stdin=fin, stdout=fout)
    os.replace(dst + ".tmp", dst)


def count_lines(path: str) -> int:
    """Lines as fairseq and wc count them, a last line without its newline included."""
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


# ------------------------------------------------------------------------------------------------
def _sacrebleu_pair(name: str, src: str, tgt: str):
    """(source file, first reference file) of sacrebleu's test set ``name`` for SRC-TGT, from
    sacrebleu's cache ($SACREBLEU, else ~/.sacrebleu), which sacrebleu downloads to if missing."""
    import urllib.error

    import sacrebleu.utils

    try:
        return sacrebleu.utils.get_source_file(name, f"{src}-{tgt}"), \
            sacrebleu.utils.get_reference_files(name, f"{src}-{tgt}")[0]
    except (urllib.error.URLError, OSError) as e:  # offline, and not in the cache
        raise PrepareError(f"sacrebleu test set {name} {src}-{tgt}: not in sacrebleu's cache "
                           f"({sacrebleu.utils.SACREBLEU_DIR}, $SACREBLEU) and not downloaded ({e}): run "
                           f"`sacrebleu -t {name} -l {src}-{tgt} --echo src > /dev/null` where there is internet "
                           "and copy that directory here, or point $SACREBLEU at such a copy") from None
    except Exception as e:  # sacrebleu raises Exception for an unknown set or pair
        raise PrepareError(f"sacrebleu test set {name} {src}-{tgt}: {e}") from None


def _setting(split: str, side: str) -> str:
    """The study's setting a gathered file came from: corpus.train.src, corpus.test.NAME.tgt."""
    return f"corpus.{split}.{side}"


def _copy_text(path: str, dst: str, where: str) -> int:
    """PATH copied to DST line by line, its lines ending in \n (CRLF's \r dropped, a last line
    ended): the line count of ``wc -l``, subword-nmt and fairseq-preprocess (whose readers split
    at a lone \r too) is the same; its count of lines. A line that is not UTF-8, or holds a
    \r before its end, is refused naming PATH and the line (WHERE: the setting it came from)."""
    with open(path, "rb") as f, open(dst, "wb") as out:
        number = 0
        for number, line in enumerate(f, 1):
            line = line[:-2] if line.endswith(b"\r\n") else line.rstrip(b"\n")
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise PrepareError(f"{where} {path} line {number}: not UTF-8 at byte {e.start + 1} of the line "
                                   f"(0x{line[e.start]:02x}: {e.reason}): convert the file to UTF-8 "
                                   "(iconv -f ITS-ENCODING -t UTF-8)") from None
            if b"\r" in line:
                raise PrepareError(f"{where} {path} line {number}: a carriage return (\\r) inside the line, where "
                                   "some tools split lines and others do not (the pairs would shift): remove it "
                                   "(or, where \\r ends lines, convert them: tr '\\r' '\\n')")
            out.write(line + b"\n")
    return number


def gather(data: str, s: Dict):
    """DATA/raw/SPLIT.{src,tgt} of a files corpus: each split's pair of files (or sacrebleu's test
    set) as UTF-8 lines ended by \n, refused when its two sides differ in lines."""
    raw = os.path.join(data, "raw")
    os.makedirs(raw, exist_ok=True)
    for split, where in s["splits"].items():
        pair = _sacrebleu_pair(where["sacrebleu"], s["src"], s["tgt"]) if "sacrebleu" in where else \
            (where["src"], where["tgt"])
        outs = [os.path.join(raw, f"{split}.{lang}") for lang in (s["src"], s["tgt"])]
        try:
            counts = [_copy_text(path, out + ".tmp", _setting(s.get("setting", {}).get(split, split), side))
                      for path, out, side in zip(pair, outs, ("src", "tgt"))]
        except PrepareError:
            for out in outs:
                if os.path.exists(out + ".tmp"):
                    os.remove(out + ".tmp")
            raise
        if counts[0] != counts[1] or not counts[0]:
            for out in outs:
                os.remove(out + ".tmp")
            raise PrepareError(f"{split}: {pair[0]} has {counts[0]} lines, {pair[1]} {counts[1]}: a pair is a "
                               "line of each, and there must be one")
        for out in outs:
            os.replace(out + ".tmp", out)
        print(f"| {split}: {counts[0]} pairs ({pair[0]}, {pair[1]})", flush=True)


def tokenize(data: str, s: Dict, workers: int):
    os.makedirs(os.path.join(data, "tok"), exist_ok=True)
    for split in s["splits"]:
        for lang in (s["src"], s["tgt"]):
            raw = os.path.join(data, "raw", f"{split}.{lang}")
            print(f"| {split}.{lang}: {count_lines(raw)} lines", flush=True)
            if s.get("tokenize") == "none":  # a files corpus already tokenized
                shutil.copyfile(raw, os.path.join(data, "tok", f"{split}.{lang}"))
                continue
            cmd = [sys.executable, TEXT, "tokenize", "--lang", lang, "--workers", str(workers)]
            cmd += ["--plain"] if s["style"] == "iwslt" else []
            cmd += ["--test-set"] if split.startswith("test") else []
            _filter(cmd, raw, os.path.join(data, "tok", f"{split}.{lang}"))


def _every(src: str, out_keep: str, out_take: str, n: int):
    """Every nth line (1-based: line n, 2n, ...) to out_take, the others to out_keep."""
    with open(src, encoding="utf-8") as f, open(out_keep, "w", encoding="utf-8") as keep, \
            open(out_take, "w", encoding="utf-8") as take:
        for number, line in enumerate(f, 1):
            (take if number % n == 0 else keep).write(line)


def _apply(data: str, s: Dict, src: str, dst: str):
    if s["bpe"] == "sentencepiece":
        _filter([sys.executable, TEXT, "spm-encode", "--model", os.path.join(data, "bpe", "spm.model")], src, dst)
    else:
        _filter([_bin("subword-nmt"), "apply-bpe", "-c", os.path.join(data, "bpe", "code")], src, dst)


def _learn(data: str, s: Dict, train: List[str], workers: int, joint_vocab: bool):
    os.makedirs(os.path.join(data, "bpe"), exist_ok=True)
    if s["bpe"] == "sentencepiece":
        _run([sys.executable, TEXT, "spm-train", "--input", *train, "--model-prefix", os.path.join(data, "bpe", "spm"),
              "--vocab-size", str(s["bpe_size"])])
    elif joint_vocab:  # prepare-wmt14en2*.sh
        _run([_bin("subword-nmt"), "learn-joint-bpe-and-vocab", "--input", *train, "-s", str(s["bpe_size"]),
              "-o", os.path.join(data, "bpe", "code.tmp"), "--write-vocabulary",
              *[os.path.join(data, "bpe", f"vocab.{lang}") for lang in (s["src"], s["tgt"])],
              "--num-workers", str(workers)])
        os.replace(os.path.join(data, "bpe", "code.tmp"), os.path.join(data, "bpe", "code"))
    else:  # prepare-iwslt14.sh: learn_bpe.py on both training sides concatenated
        both = os.path.join(data, "bpe", "train.both")
        with open(both, "wb") as out:
            for path in train:
                with open(path, "rb") as f:
                    shutil.copyfileobj(f, out)
        _filter([_bin("subword-nmt"), "learn-bpe", "-s", str(s["bpe_size"])], both, os.path.join(data, "bpe", "code"))
        os.remove(both)


def _clean(src: str, tgt: str, out_src: str, out_tgt: str, s: Dict, also=(), also_out=()):
    """Moses' clean-corpus-n with corpus.clean's max_len and ratio (null: any; no ratio in the
    settings: fairseq's 1.5)."""
    off = lambda value: "none" if value is None else str(value)  # noqa: E731
    cmd = [sys.executable, TEXT, "clean", "--src", src, "--tgt", tgt, "--out-src", out_src, "--out-tgt", out_tgt,
           "--ratio", off(s.get("ratio", 1.5)), "--min-len", "1", "--max-len", off(s["max_len"])]
    if also:
        cmd += ["--also", *also, "--also-out", *also_out]
    _run(cmd)


def segment(data: str, s: Dict, workers: int):
    src, tgt = s["src"], s["tgt"]
    langs = (src, tgt)
    tests = s.get("tests", ["test"])
    p = lambda *parts: os.path.join(data, *parts)  # noqa: E731
    for d in ("split", "bpe"):
        os.makedirs(p(d), exist_ok=True)
    if s["style"] == "iwslt":
        os.makedirs(p("clean"), exist_ok=True)
        os.makedirs(p("lc"), exist_ok=True)
        # cleaned before lowercasing and before the split, on the tokens: the split counts cleaned pairs
        _clean(p("tok", f"train.{src}"), p("tok", f"train.{tgt}"), p("clean", f"train.{src}"),
               p("clean", f"train.{tgt}"), s)
        for lang in langs:
            _filter([sys.executable, TEXT, "lowercase"], p("clean", f"train.{lang}"), p("lc", f"train.{lang}"))
            _filter([sys.executable, TEXT, "lowercase"], p("tok", f"test.{lang}"), p("lc", f"test.{lang}"))
            _every(p("lc", f"train.{lang}"), p("split", f"train.{lang}"), p("split", f"valid.{lang}"), s["valid_every"])
        _learn(data, s, [p("split", f"train.{lang}") for lang in langs], workers, joint_vocab=False)
        for lang in langs:
            _apply(data, s, p("split", f"train.{lang}"), p(f"train.{lang}"))
            _apply(data, s, p("split", f"valid.{lang}"), p(f"valid.{lang}"))
            _apply(data, s, p("lc", f"test.{lang}"), p(f"test.{lang}"))
            shutil.copyfile(p("split", f"train.{lang}"), p(f"train.tok.{lang}"))
            shutil.copyfile(p("raw", f"test.{lang}"), p(f"test.raw.{lang}"))
    else:
        for lang in langs:
            if s["valid"] == "split":
                _every(p("tok", f"train.{lang}"), p("split", f"train.{lang}"), p("split", f"valid.{lang}"),
                       s["valid_every"])
            else:
                shutil.copyfile(p("tok", f"train.{lang}"), p("split", f"train.{lang}"))
                shutil.copyfile(p("tok", f"valid.{lang}"), p("split", f"valid.{lang}"))
        _learn(data, s, [p("split", f"train.{lang}") for lang in langs], workers, joint_vocab=True)
        for lang in langs:
            for split, source in (("train", p("split", f"train.{lang}")), ("valid", p("split", f"valid.{lang}")),
                                  *((test, p("tok", f"{test}.{lang}")) for test in tests)):
                _apply(data, s, source, p("bpe", f"{split}.{lang}"))
        _clean(p("bpe", f"train.{src}"), p("bpe", f"train.{tgt}"), p(f"train.{src}"), p(f"train.{tgt}"),
               s, also=[p("split", f"train.{lang}") for lang in langs],
               also_out=[p(f"train.tok.{lang}") for lang in langs])
        if s["valid"] == "split":
            _clean(p("bpe", f"valid.{src}"), p("bpe", f"valid.{tgt}"), p(f"valid.{src}"), p(f"valid.{tgt}"),
                   s)
        for lang in langs:
            if s["valid"] != "split":
                shutil.copyfile(p("bpe", f"valid.{lang}"), p(f"valid.{lang}"))
            for test in tests:
                shutil.copyfile(p("bpe", f"{test}.{lang}"), p(f"{test}.{lang}"))
                shutil.copyfile(p("raw", f"{test}.{lang}"), p(f"{test}.raw.{lang}"))  # SacreBLEU's references
    for split in ("train", "valid", *tests):
        print(f"| {split}: {count_lines(p(f'{split}.{src}'))} sentence pairs ({data}/{split}.{{{src},{tgt}}})", flush=True)


def binarize(data: str, s: Dict, workers: int):
    tests = s.get("tests", ["test"])
    options = ["--trainpref", os.path.join(data, "train"), "--validpref", os.path.join(data, "valid")]
    options += ["--testpref", ",".join(os.path.join(data, t) for t in tests)] if tests else []
    options += ["--joined-dictionary"] if s["joined_dictionary"] else []
    _preprocess(data, s, options, workers)


def _preprocess(where: str, s: Dict, options: List[str], workers: int):
    """fairseq-preprocess of SRC-TGT with ``options`` into WHERE/data-bin, replaced whole (its log:
    WHERE/preprocess.log)."""
    dest = os.path.join(where, "data-bin")
    tmp = dest + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    _run([_bin("fairseq-preprocess"), "--source-lang", s["src"], "--target-lang", s["tgt"], *options,
          "--destdir", tmp, "--workers", str(workers)], log=os.path.join(where, "preprocess.log"))
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def test(data: str, out: str, s: Dict, workers: int):
    """A named test set of a files corpus, prepared apart from the corpus DATA with its BPE and
    dictionary (so that adding one prepares nothing else): OUT/raw/test.* (its files, or
    sacrebleu's set), OUT/tok/test.*, OUT/test.* (segmented), OUT/test.raw.* (SacreBLEU's
    references) and OUT/data-bin (fairseq-preprocess --srcdict/--tgtdict of DATA/data-bin)."""
    src, tgt = s["src"], s["tgt"]
    gather(out, {**s, "splits": {"test": s["files"]}, "setting": {"test": f"test.{s['name']}"}})
    tokenize(out, {**s, "splits": ["test"]}, workers)
    for lang in (src, tgt):
        _apply(data, s, os.path.join(out, "tok", f"test.{lang}"), os.path.join(out, f"test.{lang}"))
        shutil.copyfile(os.path.join(out, "raw", f"test.{lang}"), os.path.join(out, f"test.raw.{lang}"))
    _preprocess(out, s, ["--testpref", os.path.join(out, "test"),
                         *(f"--{side}dict={os.path.join(data, 'data-bin', f'dict.{lang}.txt')}"
                           for side, lang in (("src", src), ("tgt", tgt)))], workers)
    print(f"| test: {count_lines(os.path.join(out, f'test.{src}'))} sentence pairs ({out}/test.{{{src},{tgt}}}, "
          f"binarized with {data}/data-bin's dictionaries)", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("gather", "tokenize", "segment", "binarize", "test"):
        p = sub.add_parser(name)
        p.add_argument("--data", required=True, help="the corpus's directory")
        p.add_argument("--settings", required=True, help="the step's settings (JSON)")
        p.add_argument("--workers", type=int, default=1)
        if name == "test":
            p.add_argument("--out", required=True, help="where the test set is prepared (OUT/tests/NAME/data)")
    args = parser.parse_args(argv)
    settings = json.loads(args.settings)
    try:
        if args.command == "gather":
            gather(args.data, settings)
        elif args.command == "tokenize":
            tokenize(args.data, settings, args.workers)
        elif args.command == "segment":
            segment(args.data, settings, args.workers)
        elif args.command == "test":
            test(args.data, args.out, settings, args.workers)
        else:
            binarize(args.data, settings, args.workers)
    except (PrepareError, OSError, ValueError) as e:
        parser.exit(2, f"prepare.py {args.command}: error: {e}\n")


if __name__ == "__main__":
    main()
