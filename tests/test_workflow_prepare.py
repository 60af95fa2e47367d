"""The workflow's preparation of a WMT corpus, offline: miniature archives with the official names
and member paths (tests/toy_archives.py) in corpus.archives, downloading nothing; the rules
(extract, tokenize, segment, binarize) as fairseq's prepare-wmt14en2de.sh makes the corpus; an
edit of the sources file prepares it again."""
import os
import re
import shutil

from test_workflow import REPO, ok, snakemake
from toy_archives import PAIRS, write_archives

SOURCES = os.path.join(REPO, "recipes", "wmt14_en_de", "sources")


def lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def test_wmt14_en_de_is_prepared_offline_and_an_edited_sources_file_prepares_it_again(tmp_path):
    work = str(tmp_path)
    src, tgt = PAIRS["wmt14_en_de"]
    write_archives("wmt14_en_de", os.path.join(work, "archives"), src, tgt)
    sources = os.path.join(work, "sources")
    shutil.copyfile(SOURCES, sources)
    study = {"out": "study", "corpus": {"name": "wmt14_en_de", "pair": None, "data": "data", "sources": sources,
                                        "archives": "archives", "download": False, "verify_checksums": False,
                                        "bpe_size": 60, "workers": 1, "toy": {}},
             "models": {"arch": "base", "encodings": ["sinusoidal"]}, "train": {"recipe": "scaling_nmt"}}
    out = ok(snakemake(work, study, "data/data-bin"))
    # the archives are there: nothing fetched (corpus.download false would refuse to)
    assert "rule fetch" not in out and "rule binarize" in out
    data = os.path.join(work, "data")
    assert len(lines(f"{data}/raw/train.{src}")) == 360 and len(lines(f"{data}/raw/test.{tgt}")) == 40
    # fairseq's split: pairs 100, 200, 300 validate, the other 357 train
    tok = lines(f"{data}/tok/train.{src}")
    assert lines(f"{data}/split/valid.{src}") == [tok[99], tok[199], tok[299]]
    assert len(lines(f"{data}/split/train.{src}")) == 357 and len(lines(f"{data}/valid.{src}")) == 3
    # sacremoses: aggressive dash splitting and Moses escaping; the test references stay raw
    text = "\n".join(tok)
    assert " @-@ " in text and "&quot;" in text and "&amp;" in text
    assert any("-" in line and "@-@" not in line for line in lines(f"{data}/test.raw.{tgt}"))
    assert "@@ " in "\n".join(lines(f"{data}/train.{src}")) and os.path.exists(f"{data}/bpe/code")
    assert {"dict.de.txt", "dict.en.txt", "train.en-de.en.bin", "test.en-de.de.idx"} <= set(os.listdir(f"{data}/data-bin"))
    assert ok(snakemake(work, study, "data/data-bin", "-n")).count("rule ") == 0
    # Common Crawl's member dropped: the extraction and everything after it run again
    with open(sources) as f:
        text = f.read()
    with open(sources, "w") as f:
        f.write(re.sub(r"^train training-parallel-commoncrawl\.tgz.*\n", "", text, flags=re.M))
    dry = ok(snakemake(work, study, "data/data-bin", "-n"))
    assert re.search(r"rule extract:(.|\n)*?reason: Updated input files: \S*sources", dry)
    ok(snakemake(work, study, "data/data-bin"))
    assert len(lines(f"{data}/raw/train.{src}")) == 240
    # another BPE size redoes the subwords and the binarized corpus, not the tokens
    study["corpus"]["bpe_size"] = 80
    dry = ok(snakemake(work, study, "data/data-bin", "-n"))
    assert "rule segment:" in dry and "rule binarize:" in dry and "rule tokenize:" not in dry
    assert re.search(r"rule segment:(.|\n)*?Params have changed(.|\n)*?\"bpe_size\": 60(.|\n)*?\"bpe_size\": 80", dry)
