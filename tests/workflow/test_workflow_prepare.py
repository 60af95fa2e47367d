"""The workflow on miniature corpora, offline: archives with the official names and member paths
(tests/helpers/toy_archives.py) in corpus.archives, downloading nothing. WMT14 En-De's rules (extract,
tokenize, segment, binarize) as fairseq's prepare-wmt14en2de.sh makes the corpus, an edit of the
sources file preparing it again; IWSLT'14's as prepare-iwslt14.sh; and on the prepared WMT corpus
a short-to-long study with fairseq-train itself (tiny models, a few CPU updates), a teacher and a
distilled student, to its report."""
import json
import os
import re
import shutil

import pytest
import torch

from helpers.snakemake_runs import REPO, ok
# Snakemake in a process kept warm (its imports paid once)
from helpers.snakemake_server import snakemake
from helpers.toy_archives import IWSLT_TEST_SIZES, PAIRS, write_archives, write_iwslt_archive

SOURCES = os.path.join(REPO, "recipes", "wmt14_en_de", "sources")
WMT = {"out": "study", "corpus": {"name": "wmt14_en_de", "pair": None, "data": "data", "sources": "sources",
                                  "archives": "archives", "download": False, "verify_checksums": False,
                                  "bpe_size": 60, "workers": 1, "toy": {}},
       "models": {"arch": "base", "encodings": ["sinusoidal"]}, "train": {"recipe": "scaling_nmt"}}


def lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


@pytest.fixture(scope="module")
def wmt(tmp_path_factory):
    """WMT14 En-De prepared from the miniature archives: (its directory, the preparing run's log)."""
    work = str(tmp_path_factory.mktemp("wmt"))
    src, tgt = PAIRS["wmt14_en_de"]
    write_archives("wmt14_en_de", os.path.join(work, "archives"), src, tgt)
    shutil.copyfile(SOURCES, os.path.join(work, "sources"))
    return work, ok(snakemake(work, WMT, "data/data-bin"))


def copy(wmt, tmp_path):
    """A copy of the prepared corpus and of Snakemake's records of it (a test that changes it
    changes its own)."""
    for name in ("archives", "sources", "data", ".snakemake"):
        (shutil.copytree if os.path.isdir(os.path.join(wmt[0], name)) else shutil.copy2)(
            os.path.join(wmt[0], name), str(tmp_path / name))
    return str(tmp_path)


def test_wmt14_en_de_is_prepared_offline_and_an_edited_sources_file_prepares_it_again(wmt, tmp_path):
    out = wmt[1]
    work = copy(wmt, tmp_path)
    src, tgt = PAIRS["wmt14_en_de"]
    study = json.loads(json.dumps(WMT))
    # the archives are there: checked, not downloaded (corpus.download false would refuse to)
    assert "| downloading" not in out and "| dev.tgz already there, not downloading" in out
    assert "| test-full.tgz: checksum not verified (asked not to)" in out and "rule binarize" in out
    # the disk the preparation takes, checked before the text is extracted
    assert re.search(r"\| disk: the prepared corpus \(an estimate: 9\.2x the text, itself ~0\.8x the [\d.]+ KB of "
                     r"archives\) needs about [\d.]+ [KM]B"
                     # the extract job's own log is written in data/logs as the check runs
                     r"( \([\d.]+ [KM]?B already in data\))?; [\d.]+ [GT]B free on the filesystem of data", out)
    assert out.index("| disk: the prepared corpus") < out.index("| reading ")
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
    # an archive missing: its download job alone (corpus.download false: it fails, naming where to
    # put it); the others are not touched (an archive is never a job's output to delete)
    archive = os.path.join(work, "archives", "dev.tgz")
    os.rename(archive, archive + ".away")
    others = {name: os.stat(os.path.join(work, "archives", name)).st_mtime_ns
              for name in os.listdir(os.path.join(work, "archives")) if name.endswith(".tgz")}
    # (a deleted archive alone runs nothing: what it made is there; the extraction forced again needs it)
    assert ok(snakemake(work, study, "data/data-bin", "-n")).count("rule ") == 0
    proc = snakemake(work, study, "data/data-bin", "--forcerun", "extract")
    assert proc.returncode != 0 and set(re.findall(r"^(?:local)?rule (\w+):", proc.stdout + proc.stderr, re.M)) == {"download"}
    assert f"missing archives/dev.tgz: download it from http://www.statmt.org/wmt14/dev.tgz" in proc.stdout + proc.stderr
    assert {name: os.stat(os.path.join(work, "archives", name)).st_mtime_ns for name in others} == others
    os.rename(archive + ".away", archive)
    # Common Crawl's member dropped: the extraction and everything after it run again
    sources = os.path.join(work, "sources")
    with open(sources) as f:
        text = f.read()
    with open(sources, "w") as f:
        f.write(re.sub(r"^train training-parallel-commoncrawl\.tgz.*\n", "", text, flags=re.M))
    dry = ok(snakemake(work, study, "data/data-bin", "-n"))
    assert re.search(r"rule extract:(.|\n)*?reason: Updated input files: \S*sources", dry)
    ok(snakemake(work, study, "data/data-bin"))
    assert len(lines(f"{data}/raw/train.{src}")) == 240
    # another study's BPE size on this corpus.data is refused in one line: it would undo this study's corpus
    other = {**study, "out": "other", "corpus": {**study["corpus"], "bpe_size": 80}}
    proc = snakemake(work, other, "-n")
    assert proc.returncode != 0
    refusal = [line for line in (proc.stdout + proc.stderr).splitlines() if "configuration refused" in line]
    assert len(refusal) == 1 and refusal[0].endswith(
        "configuration refused: corpus.data data was prepared by the study study with corpus.bpe_size 60 (here 80): "
        "preparing it again here would undo that study's corpus; set corpus.data to another directory (or delete "
        "this one)")
    # this study's own edit: another BPE size redoes the subwords and the binarized corpus, not the tokens
    study["corpus"]["bpe_size"] = 80
    dry = ok(snakemake(work, study, "data/data-bin", "-n"))
    assert "rule segment:" in dry and "rule binarize:" in dry and "rule tokenize:" not in dry
    assert re.search(r"rule segment:(.|\n)*?Params have changed(.|\n)*?\"bpe_size\": 60(.|\n)*?\"bpe_size\": 80", dry)


# a tiny model that learns a little of the toy pair in 150 CPU updates (epochs of 6 updates)
SHORT_TO_LONG = {
    "split": {"train_below": 12, "bins": [12, 16], "unit": "words"},
    "models": {"arch": "tiny", "encodings": ["sinusoidal"]},
    "train": {"recipe": "scaling_nmt", "device": "cpu", "max_update": 150, "save_interval_updates": 1000, "warmup_updates": 30,
              "max_tokens": 1000, "update_freq": 1, "lr": 0.005, "dropout": 0.1, "eval_bleu": True},
    "evaluate": {"checkpoints": "epoch", "average": 2, "lenpen_form": "gnmt", "beam": 4},
    "distillation": {"teacher": "sinusoidal", "students": ["sinusoidal"], "arch": "tiny", "lr": 0.005, "dropout": 0.1,
                     "student_flags": ["--decoder-layers", 1], "relation_heads": 4, "max_epoch": None,
                     "max_update": 30, "average": 2},
}


def test_a_short_to_long_study_with_a_distilled_student_runs_to_its_report(wmt, tmp_path):
    """The split (training pairs of 12+ words set aside as the test set), a teacher chosen by
    validation BLEU detokenized as German, its epoch checkpoints averaged, GNMT's length penalty
    by reranking, a student distilled from the teacher's average, each scored against the long
    pairs' own references, and the report per bin."""
    work = copy(wmt, tmp_path)
    ok(snakemake(work, {**WMT, **SHORT_TO_LONG}, "-c2", stub=False, timeout=900))
    study = os.path.join(work, "study")
    split = json.load(open(os.path.join(study, "split", "text", "split.json")))
    bins = [part["sentences"] for part in split["parts"] if part["name"] != "train"]
    assert [part["name"] for part in split["parts"]] == ["train", "[12,16)", "[16,inf)"] and min(bins) > 0
    # the test set is the long pairs: their references (T- lines, BPE removed) are the split's own
    teacher, student = (os.path.join(study, "models", name, "seed1") for name in ("sinusoidal", "distilled-sinusoidal"))
    refs = [line.split("\t")[1] for line in lines(os.path.join(teacher, "test.txt")) if line.startswith("T-")]
    assert sorted(refs) == sorted(lines(os.path.join(study, "split", "text", "long.de")))
    scores = {}
    for directory, label in ((teacher, "enc=sinusoidal"), (student, "enc=distilled sinusoidal")):
        score = json.load(open(os.path.join(directory, "score.json")))
        assert score["sentences"] == sum(bins) and score["compound_split"] is True
        assert score["label"].startswith(f"{label} wmt14_en_de en-de seed=1 arch=tiny "
                                         "split-long-pairs(source>=12-words) beam=4 lenpen=0.6 lenpen_form=gnmt avg=2")
        scores[label] = score
        # GNMT's penalty: every finished hypothesis of the beam, reranked to one a sentence
        nbest = [line for line in lines(os.path.join(directory, "test.txt.nbest")) if line.startswith("H-")]
        assert len(nbest) == 4 * sum(bins)
        assert sum(line.startswith("H-") for line in lines(os.path.join(directory, "test.txt"))) == sum(bins)
        # the last 2 epoch checkpoints averaged
        read = sorted(int(n) for n in re.findall(r"read \S+/checkpoint(\d+)\.pt",
                                                    open(os.path.join(directory, "average.log")).read()))
        epochs = sorted(int(m.group(1)) for m in (re.fullmatch(r"checkpoint(\d+)\.pt", f) for f in
                                                  os.listdir(os.path.join(directory, "checkpoints"))) if m)
        assert len(read) == 2 and read == epochs[-2:], (read, epochs)
    # the teacher learned something (measured SacreBLEU 5.75 on the long pairs; untrained 0.0)
    assert scores["enc=sinusoidal"]["sacrebleu"] > 2.0
    results = lines(os.path.join(study, "results.txt"))
    assert len(results) == 4 and all(f"| {sum(bins)} sentences |" in line for line in results)
    report = json.load(open(os.path.join(study, "bleu_by_length.json")))
    assert [b["sentences"] for b in report["bins"]] == bins
    assert list(report["models"]) == ["sinusoidal", "distilled sinusoidal"]
    # checkpoint_best.pt by validation BLEU, detokenized as German text
    cfg = torch.load(os.path.join(teacher, "checkpoints", "checkpoint_last.pt"), weights_only=False)["cfg"]
    assert cfg["task"]["eval_bleu"] and json.loads(cfg["task"]["eval_bleu_detok_args"]) == {"target_lang": "de"}
    assert cfg["checkpoint"]["best_checkpoint_metric"] == "bleu" and not cfg["checkpoint"]["no_epoch_checkpoints"]
    assert re.search(r"\| valid on 'valid' subset \|.* \| bleu [\d.]+ ",
                     open(os.path.join(teacher, "checkpoints", "train.log")).read())
    # the student learned from the teacher's average, at its own size
    cfg = torch.load(os.path.join(student, "checkpoints", "checkpoint_last.pt"), weights_only=False)["cfg"]
    assert cfg["criterion"]["_name"] == "relation_distillation" and cfg["criterion"]["relation_heads"] == 4
    assert cfg["criterion"]["teacher_path"] == os.path.join("study", "models", "sinusoidal", "seed1", "averaged.pt")
    assert (cfg["model"].encoder_layers, cfg["model"].decoder_layers) == (2, 1)


def test_iwslt14_is_prepared_offline_as_fairseqs_script_prepares_it(tmp_path):
    work = str(tmp_path)
    expected = write_iwslt_archive(os.path.join(work, "archives", "iwslt14", "de-en.tgz"))
    study = {"out": "study", "corpus": {"name": "iwslt14_de_en", "data": "data", "archives": "archives",
                                       "download": False, "workers": 1, "toy": {}},
             "models": {"arch": "iwslt", "encodings": ["sinusoidal"]}, "train": {"recipe": "scaling_nmt"}}
    out = ok(snakemake(work, study, "data/data-bin"))
    data = tmp_path / "data"
    # no published checksum: the first use records the archive's sha256 and size beside it
    archive = tmp_path / "archives" / "iwslt14" / "de-en.tgz"
    assert "de-en.tgz: no published checksum; recorded sha256 " in out
    assert (tmp_path / "archives" / "iwslt14" / "de-en.tgz.sha256").read_text().split()[1] == str(archive.stat().st_size)
    assert "| reading 12 members of iwslt14/de-en.tgz" in out
    # extract: the talks' metadata lines dropped, title and description kept without their tags
    raw_de, raw_en = lines(data / "raw" / "train.de"), lines(data / "raw" / "train.en")
    assert len(raw_de) == len(raw_en) == expected["text_pairs"] == 3 * 42
    assert not any(tag in line for line in raw_de + raw_en for tag in ("<url>", "<talkid>", "<keywords>", "<title>",
                                                                       "</description>"))
    assert "Toy talk 0: The House" in raw_en and "TED Talk Subtitles and Transcript: Talk 2 About Houses" in raw_en
    # the test set: the five .xml sets in fairseq's order, segment text only
    assert lines(data / "raw" / "test.en") == expected["test"] == lines(data / "test.raw.en")
    assert len(expected["test"]) == sum(IWSLT_TEST_SIZES) == 30
    # tokenize: no -a (a hyphenated word stays whole), Moses' escaping, the test set's ’ straightened
    tok = "\n".join(lines(data / "tok" / "train.en"))
    assert "@-@" not in tok and re.search(r"\w-\w", tok) and "&quot;" in tok
    test_tok = "\n".join(lines(data / "tok" / "test.en"))
    assert "\u2019" not in test_tok and "&apos;s" in test_tok and "\u2019" in "\n".join(expected["test"])
    # clean 1-175 tokens, ratio 1.5, on the tokens: the 180-token, the 10:20 and the empty pair go
    clean_de, clean_en = lines(data / "clean" / "train.de"), lines(data / "clean" / "train.en")
    assert len(clean_de) == len(clean_en) == expected["cleaned"] == 123
    for s, t in zip(clean_de, clean_en):
        n, m = len(s.split()), len(t.split())
        assert 1 <= n <= 175 and 1 <= m <= 175 and max(n, m) / min(n, m) <= 1.5
    # lowercase, then the split: every 23rd cleaned pair validates (5 of 123), the other 118 train
    lc_en = lines(data / "lc" / "train.en")
    assert lc_en == [line.lower() for line in clean_en] and lc_en != clean_en
    assert lines(data / "split" / "valid.en") == lc_en[22::23] and len(lc_en[22::23]) == 123 // 23 == 5
    assert lines(data / "split" / "train.en") == [x for i, x in enumerate(lc_en, 1) if i % 23]
    assert len(lines(data / "train.de")) == len(lines(data / "train.tok.en")) == 118
    assert all(line == line.lower() for line in lines(data / "test.en") + lines(data / "test.de"))
    # BPE learned on the training part, then a dictionary per language
    assert (data / "data-bin" / "dict.de.txt").read_text() != (data / "data-bin" / "dict.en.txt").read_text()
    for split, count in (("train", 118), ("valid", 5), ("test", 30)):
        assert f"| {split}: {count} sentence pairs" in out
        assert (data / "data-bin" / f"{split}.de-en.en.bin").stat().st_size > 0
