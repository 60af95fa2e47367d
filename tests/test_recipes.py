"""The WMT recipes end to end, offline: miniature archives with the official names and member
paths (generated here, a toy language pair), then prepare.sh --raw-dir, train.sh, evaluate.sh,
and the extrapolation recipe down to its per-bin table and plot."""
import gzip
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = os.path.join(REPO, "recipes")
from fairseq_posenc.recipe.wmt_data import read_sources  # noqa: E402

# the names fairseq's prepare-wmt14en2*.sh and the WMT sites use (wmt18: both test archives are
# test.tgz upstream, kept under the year's name)
OFFICIAL = {
    "wmt14_en_de": {"training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz",
                    "training-parallel-nc-v9.tgz", "dev.tgz", "test-full.tgz"},
    "wmt14_en_fr": {"training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz",
                    "training-parallel-un.tgz", "training-parallel-nc-v9.tgz", "training-giga-fren.tar",
                    "dev.tgz", "test-full.tgz"},
    "wmt18": {"training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz",
              "training-parallel-nc-v13.tgz", "wmt17-test.tgz", "wmt18-test.tgz"},
}
TINY_MODEL = ("--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 64 --decoder-embed-dim 64 "
              "--encoder-ffn-embed-dim 128 --decoder-ffn-embed-dim 128 --encoder-attention-heads 2 "
              "--decoder-attention-heads 2")
# DEVICE=cpu: without it the recipes refuse to train on a machine with no GPU
TRAIN_ENV = {"MODEL_FLAGS": TINY_MODEL, "EXTRA_FLAGS": "--num-workers 0 --seed 1", "MAX_TOKENS": "2000",
             "UPDATE_FREQ": "1", "MAX_EPOCH": "30", "AVERAGE": "2", "WARMUP": "30", "LR": "5e-3",
             "SAVE_INTERVAL_UPDATES": "5", "DEVICE": "cpu", "WORKERS": "1", "GEN_MAX_TOKENS": "2000",
             "OMP_NUM_THREADS": "1"}
PAIRS = {"wmt14_en_de": ("en", "de"), "wmt14_en_fr": ("en", "fr"), "wmt18": ("cs", "en")}
# En-De validates on every 100th training pair (fairseq's split, the default); En-Fr's split takes
# every 1333rd, none of the toy corpus's 360: it validates on newstest2013; WMT18 on newstest2017
VALID_ARGS = {"wmt14_en_de": [], "wmt14_en_fr": ["--valid", "newstest2013"], "wmt18": []}

# ------------------------------------------------------------------------------------------------
# a toy language pair: every word has one translation, order kept; hyphenated compounds,
# punctuation, quotes and an ampersand exercise tokenization, escaping and compound splitting
_WORDS = ["house", "cat", "dog", "tree", "river", "city", "green", "small", "old", "new", "sees", "has",
          "likes", "near", "the", "a", "and", "of", "big", "red", "car", "road", "book", "reads"]


def _translate(word, lang):
    return {"de": word[::-1] + "en", "fr": word[::-1] + "é", "cs": "ř" + word[::-1], "en": word}[lang]


def _sentence(rng, n, src, tgt):
    words = [rng.choice(_WORDS) for _ in range(n)]
    if n > 4 and rng.random() < 0.3:
        words[1] = words[1] + "-" + words[2]  # a compound: "well-known" style
    extra_s, extra_t = "", ""
    if rng.random() < 0.2:
        extra_s = extra_t = ' "&"'
    s = " ".join(_translate_compound(w, src) for w in words) + extra_s + "."
    t = " ".join(_translate_compound(w, tgt) for w in words) + extra_t + "."
    return s[0].upper() + s[1:], t[0].upper() + t[1:]


def _translate_compound(word, lang):
    return "-".join(_translate(part, lang) for part in word.split("-"))


def _pairs(rng, count, src, tgt, lengths=(3, 16)):
    return [_sentence(rng, rng.randint(*lengths), src, tgt) for _ in range(count)]


def _sgm(lines, setid, lang):
    segs = "".join(f'<seg id="{i + 1}">{line}</seg>\n' for i, line in enumerate(lines))
    return (f'<srcset setid="{setid}" srclang="any">\n<doc sysid="ref" docid="toy" genre="news" origlang="{lang}">\n'
            f"<p>\n{segs}</p>\n</doc>\n</srcset>\n")


def write_archives(recipe, raw_dir, src, tgt, seed=1, train_pairs=360):
    """Every archive of the recipe's sources file, with the members it names, in ``raw_dir``."""
    archives, corpora = read_sources(os.path.join(RECIPES, recipe, "sources"), src, tgt)
    assert {a.file for a in archives} == OFFICIAL[recipe]
    rng = random.Random(seed)
    members = {a.file: {} for a in archives}
    n_train = sum(c.split == "train" for c in corpora)
    for c in corpora:
        count = {"train": train_pairs // n_train, "valid": 30, "test": 40}[c.split]
        pairs = _pairs(rng, count, src, tgt)
        for member, lang, lines in ((c.src_member, src, [p[0] for p in pairs]), (c.tgt_member, tgt, [p[1] for p in pairs])):
            if member.endswith(".sgm"):
                data = _sgm(lines, c.split, lang).encode()
            else:
                data = "".join(line + "\n" for line in lines).encode()
            members[c.archive][member] = gzip.compress(data) if member.endswith(".gz") else data
    os.makedirs(raw_dir, exist_ok=True)
    for name, files in members.items():
        with tarfile.open(os.path.join(raw_dir, name), "w:gz" if name.endswith(".tgz") else "w") as tar:
            for member, data in files.items():
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return archives, corpora


def run(script, args=(), env=None, cwd=None):
    proc = subprocess.run(["bash", os.path.join(RECIPES, script), *args], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, cwd=cwd)
    return proc


def ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + "\n---\n" + proc.stderr[-3000:]
    return proc.stdout


def lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Each recipe's miniature archives and prepare.sh output, made once for the module."""
    made = {}

    def prepare(recipe, bpe="subword-nmt"):
        if recipe not in made:
            src, tgt = PAIRS[recipe]
            base = tmp_path_factory.mktemp(recipe)
            write_archives(recipe, str(base / "raw"), src, tgt)
            args = ["--raw-dir", str(base / "raw"), "--out", str(base / "data"), *VALID_ARGS[recipe]]
            if recipe == "wmt18":
                args += ["--pair", f"{src}-{tgt}"]
            # sentencepiece's size counts the characters too (subword-nmt's counts merges only)
            env = {"BPE": bpe, "BPE_SIZE": "150" if bpe == "sentencepiece" else "60", "WORKERS": "1",
                   "VERIFY_CHECKSUMS": "0"}
            proc = run(f"{recipe}/prepare.sh", args, env)
            made[recipe] = (base, ok(proc), args, env)
        return made[recipe]

    return prepare


@pytest.fixture(scope="module")
def trained(prepared):
    """A tiny model trained 30 epochs by the recipe's train.sh on its prepared corpus, once."""
    made = {}

    def train(recipe, bpe="subword-nmt"):
        if recipe not in made:
            src, tgt = PAIRS[recipe]
            base = prepared(recipe, bpe)[0]
            env = {**TRAIN_ENV, "DATA": str(base / "data"), "OUT": str(base / "runs" / "sin"), "ENC": "sinusoidal",
                   "ARCH": "base", "PAIR": f"{src}-{tgt}", "RESULTS": str(base / "results.txt")}
            made[recipe] = (env, ok(run(f"{recipe}/train.sh", env=env)))
        return made[recipe]

    return train


def plan_numbers(stdout):
    """Updates per epoch and the averaged updates, as the plan printed them."""
    per_epoch = int(re.search(r"\| updates per epoch: (\d+)", stdout).group(1))
    averaged = [int(u) for u in re.search(r"\| averaged: updates ([\d, ]+) \(", stdout).group(1).split(", ")]
    return per_epoch, averaged


@pytest.mark.parametrize("recipe, bpe", [("wmt14_en_de", "subword-nmt"), ("wmt14_en_fr", "sentencepiece"),
                                         ("wmt18", "subword-nmt")])
def test_recipe_prepares_trains_and_evaluates_offline(prepared, trained, recipe, bpe):
    src, tgt = PAIRS[recipe]
    base, out, args, env = prepared(recipe, bpe)
    data = base / "data"
    # prepare: every step ran, with progress, and read the archives from --raw-dir
    for n in range(1, 9):
        assert f"== [{n}/8]" in out
    assert "no download" in out and "| downloading" not in out
    # the miniature archives are not the official files: their published checksums cannot match
    assert "test.tgz: checksum not verified (asked not to)" in out or "test-full.tgz: checksum not verified" in out
    test_set = "newstest2018" if recipe == "wmt18" else "newstest2014"
    n_train_raw = len(lines(data / "raw" / f"train.{src}"))
    assert n_train_raw == 360
    assert len(lines(data / "raw" / f"test.{tgt}")) == 40 and len(lines(data / "raw" / f"valid.{src}")) == 30
    tok_train = lines(data / "tok" / f"train.{src}")
    if recipe == "wmt14_en_de":  # fairseq's split: pairs 100, 200, 300 validate, the other 357 train
        assert "validation: train-every-100th" in out
        assert lines(data / "split" / f"valid.{src}") == [tok_train[99], tok_train[199], tok_train[299]]
        assert len(lines(data / "split" / f"train.{src}")) == 357 and len(lines(data / f"valid.{src}")) == 3
        assert "VALID_NAME=train-every-100th" in (data / "corpus.env").read_text()
    else:
        assert len(lines(data / "split" / f"train.{src}")) == 360 and len(lines(data / f"valid.{src}")) == 30
    # sacremoses: aggressive dash splitting and Moses escaping; the test references stay raw
    tok = "\n".join(lines(data / "tok" / f"train.{src}"))
    assert " @-@ " in tok and "&quot;" in tok and "&amp;" in tok
    assert any("-" in line and "@-@" not in line for line in lines(data / f"test.raw.{tgt}"))
    # clean: 1-250 tokens, ratio <= 1.5; train.tok.* are the same pairs before BPE
    train_src, train_tgt = lines(data / f"train.{src}"), lines(data / f"train.{tgt}")
    assert 0 < len(train_src) == len(train_tgt) <= n_train_raw
    assert len(lines(data / f"train.tok.{src}")) == len(train_src)
    for s, t in zip(train_src, train_tgt):
        assert 1 <= len(s.split()) <= 250 and max(len(s.split()), len(t.split())) / min(len(s.split()), len(t.split())) <= 1.5
    segmented = "\n".join(train_src)
    assert ("@@ " in segmented) if bpe == "subword-nmt" else ("\u2581" in segmented)
    for split in ("train", "valid", "test"):
        for lang in (src, tgt):
            assert (data / "data-bin" / f"{split}.{src}-{tgt}.{lang}.bin").stat().st_size > 0
    assert (data / "data-bin" / f"dict.{src}.txt").read_text() == (data / "data-bin" / f"dict.{tgt}.txt").read_text()

    # a re-run checks the archives again and skips the 7 steps that are done
    again = ok(run(f"{recipe}/prepare.sh", args, env))
    assert again.count("done before, skipping") == 7 and "== [1/8] archives: check" in again
    assert "checksum not verified (asked not to)" in again

    # train: the plugin's architecture for ENC, tiny sizes, 30 epochs, a checkpoint every 5 updates
    runs = base / "runs"
    train_env, out = trained(recipe, bpe)
    assert "fairseq-train --arch transformer_sinusoidal_wmt_en_de: lr 5e-3, dropout 0.1" in out
    assert "on CPU (DEVICE=cpu asked for it; fp32)" in out
    assert "transformer_sinusoidal_wmt_en_de" in (runs / "sin" / "train.log").read_text()
    # the plan's numbers are fairseq's: 30 epochs of its updates per epoch, and exactly the interval
    # checkpoints it said would be averaged (those due at an epoch's end are not interval ones)
    per_epoch, averaged = plan_numbers(out)
    last = torch.load(runs / "sin" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert last["optimizer_history"][-1]["num_updates"] == 30 * per_epoch
    interval = {int(m.group(1)) for m in (re.fullmatch(r"checkpoint_\d+_(\d+)\.pt", f) for f in os.listdir(runs / "sin")) if m}
    assert interval == set(averaged) and len(averaged) == 2 and all(u % 5 == 0 and u % per_epoch for u in averaged)
    assert not any(re.fullmatch(r"checkpoint\d+\.pt", f) for f in os.listdir(runs / "sin"))  # --no-epoch-checkpoints

    # evaluate: the run finished; average the last 2, beam search, both BLEUs appended to the results file
    out = ok(run(f"{recipe}/evaluate.sh", env=train_env))
    assert f"checkpoint_last.pt: finished (epoch 30 of 30, update {30 * per_epoch})" in out
    assert "fairseq-generate --gen-subset test" in out and "on CPU (DEVICE=cpu asked for it; fp32) (--cpu)" in out
    assert (runs / "sin" / "averaged_last2.pt").exists()
    gen = lines(runs / "sin" / f"generate.{test_set}.txt")
    assert sum(line.startswith("H-") for line in gen) == 40
    results = lines(base / "results.txt")
    assert len(results) == 2
    sacre = re.search(r"\| (\S+) (\S+-\S+) enc=sinusoidal arch=base (\S+) beam=(\d+) lenpen=0.6 lenpen_form=fairseq avg=2 \| 40 sentences "
                      r"\| SacreBLEU (\d+\.\d\d) \(detokenized\) \| (nrefs:1\|case:mixed\|eff:no\|tok:13a\S*)$", results[0])
    assert sacre, results[0]
    assert sacre.group(2) == f"{src}-{tgt}" and sacre.group(3) == test_set
    assert sacre.group(4) == ("10" if recipe == "wmt18" else "4")  # DIET decoded with beam 10
    # the toy pair is learnable in 30 epochs (measured with the last 2 interval checkpoints, 5
    # updates apart, averaged: En-De 24.2, En-Fr 12.4, WMT18 cs-en 21.7 SacreBLEU; an untrained
    # model scores about 0.1): a score this high means that hypotheses, tokenized and raw references stayed aligned
    # sentence by sentence through every step
    assert 8.0 < float(sacre.group(5)) <= 100.0
    # compound splitting for a German target only (En-De's convention): fr and en are not split
    split = "compound split" if tgt == "de" else "no compound split"
    tokenized = re.search(r"\| tokenized BLEU (\d+\.\d\d) \(" + split + r", tokenize none\) \| [\d.]+/[\d.]+/[\d.]+/[\d.]+ "
                          r"\(BP = [\d.]+", results[1])
    assert tokenized, results[1]
    assert 8.0 < float(tokenized.group(1)) <= 100.0
    scores = json.loads((runs / "sin" / f"bleu.{test_set}.json").read_text())
    assert scores["sacrebleu"] == float(sacre.group(5)) and scores["tokenized_bleu"] == float(tokenized.group(1))
    detok = lines(runs / "sin" / f"generate.{test_set}.txt.detok")
    assert len(detok) == 40 and not any("@-@" in h or "&quot;" in h for h in detok)


def test_floater_warm_start_path_and_extrapolation_recipe(prepared, tmp_path):
    """ENC=floater goes through recipes/floater/train.sh; the extrapolation recipe splits a
    prepared corpus by source length, trains each encoding and writes the per-bin table and plot."""
    base, _, _, _ = prepared("wmt14_en_de")
    out = tmp_path / "extrapolation"
    env = {**TRAIN_ENV, "DATA": str(base / "data"), "OUT": str(out), "ENCODINGS": "sinusoidal floater",
           "TRAIN_BELOW": "12", "BINS": "12 15 18", "UNIT": "words", "VANILLA_EPOCHS": "1", "FLOATER_EPOCHS": "2", "MAX_EPOCH": "2",
           "SAVE_INTERVAL_UPDATES": "2",
           "GEN_FLAGS": "--max-len-b 10"}  # untrained models: keep their hypotheses short
    stdout = ok(run("extrapolation/run.sh", env=env))
    assert "FLOATER: the paper's warm-start protocol" in stdout and "== 2/3 FLOATER warm-started" in stdout
    split = json.loads((out / "split" / "split.json").read_text())
    assert split["unit"] == "words" and split["train_below"] == 12
    counts = {p["name"]: p["sentences"] for p in split["parts"]}
    assert set(counts) == {"train", "[12,15)", "[15,18)", "[18,inf)"} and counts["train"] > 100
    for name in ("train", "long"):  # counted in words, trained and decoded in subwords
        for line in lines(out / "split" / f"{name}.en"):
            assert (len(line.split()) < 12) == (name == "train")
        assert len(lines(out / "split" / "bpe" / f"{name}.en")) == len(lines(out / "split" / f"{name}.en"))
    report = (out / "bleu_by_length.md").read_text()
    # (the report's layout is scripts/bleu_by_length.py's; here: one row per encoding, every bin)
    long_pairs = sum(v for k, v in counts.items() if k != "train")
    assert re.search(r"^\| encoding \| \[12,15\) n=\d+ \| \[15,18\) n=\d+ \| \[18,inf\) n=\d+ \|$", report, re.M)
    assert re.search(r"^\| sinusoidal \| \d+\.\d \| \d+\.\d \| \d+\.\d \|$", report, re.M)
    assert re.search(r"^\| floater \(warm start\) \| \d+\.\d \(", report, re.M)  # its label names the start
    assert "source length in words" in report
    results = json.loads((out / "bleu_by_length.json").read_text())
    assert set(results["models"]) == {"sinusoidal", "floater (warm start)", "vanilla_continued"}
    assert results["unit"] == "words"
    assert sum(b["sentences"] for b in results["bins"]) == long_pairs
    png = (out / "bleu_by_length.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "floater" / "floater" / "averaged_last2.pt").exists()
    # the rows are named by the decoded checkpoints' own labels (fairseq_posenc/labels.py)
    assert (out / "floater" / "evaluated_checkpoint.txt").read_text() == f"{out}/floater/floater/averaged_last2.pt\n"
    # FLOATER's control (VANILLA_CONTINUED=1 by default here): the vanilla model trained on from the
    # same checkpoint with stage 2's schedule, without FLOATER, decoded and reported against it
    assert "== 2/3 control: the vanilla model trained on from" in stdout
    control = torch.load(out / "floater" / "vanilla_continued" / "checkpoint_last.pt", map_location="cpu",
                         weights_only=False)
    stage2 = torch.load(out / "floater" / "floater" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert control["cfg"]["model"].position_encoding == "sinusoidal"
    assert control["cfg"]["optimization"]["lr"] == stage2["cfg"]["optimization"]["lr"] == [5e-3 / 2]
    assert (control["optimizer_history"][-1]["num_updates"] == stage2["optimizer_history"][-1]["num_updates"]
            == int(re.search(r"\| stage floater: ends at its update (\d+) ", stdout).group(1)))
    control_log = (out / "floater" / "vanilla_continued" / "train.log").read_text()
    assert f"loading pretrained model from {os.path.realpath(out / 'floater' / 'vanilla')}/checkpoint_best.pt" in control_log
    assert (out / "floater" / "vanilla_continued" / "averaged_last2.pt").exists()
    assert re.search(r"^\| vanilla_continued \| \d+\.\d \(", report, re.M)
    assert re.search(r"^\| floater \(warm start\) - vanilla_continued \| [+-]\d+\.\d \[", report, re.M)
    assert results["controls"] == {"floater (warm start)": "vanilla_continued"}
    assert all("vs_control" in row for row in results["models"]["floater (warm start)"])
    # a re-run with the same settings trains and decodes nothing again
    stdout = ok(run("extrapolation/run.sh", env=env))
    # every model's stages are decided again (finished: skipped) and its decode step is done before
    assert stdout.count("done before, skipping") == 4 and "done training" not in stdout
    assert stdout.count(": skip finished at update") == 4  # sinusoidal; FLOATER's vanilla, FLOATER, its control
    # a deleted marker decodes the model again without training it (fairseq-train would train one
    # update more)
    trained = torch.load(out / "sinusoidal" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    os.remove(out / ".done" / "model_sinusoidal")
    stdout = ok(run("extrapolation/run.sh", env={**env, "ENCODINGS": "sinusoidal"}))
    assert re.search(r"sinusoidal: skip finished at update (\d+)", stdout), stdout
    again = torch.load(out / "sinusoidal" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert again["optimizer_history"][-1]["num_updates"] == trained["optimizer_history"][-1]["num_updates"]
    assert (out / ".done" / "model_sinusoidal").exists()
    # a new lr redoes sinusoidal from update 0 (fairseq-train would otherwise resume the old
    # model, find it finished and decode it under the new label)
    old = torch.load(out / "sinusoidal" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    stdout = ok(run("extrapolation/run.sh", env={**env, "ENCODINGS": "sinusoidal", "LR": "4e-3"}))
    assert "redoing" in stdout and ("sinusoidal: restart another configuration (lr: [0.005] -> [0.004] (lr_scheduler, "
                                     "model, optimization, optimizer))") in stdout
    new = torch.load(out / "sinusoidal" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert old["cfg"]["optimization"]["lr"] == [5e-3] and new["cfg"]["optimization"]["lr"] == [4e-3]
    train_log = (out / "sinusoidal" / "train.log").read_text()
    assert "loaded checkpoint" not in train_log and "No existing checkpoint found" in train_log


# ------------------------------------------------------------------------------------------------
def test_missing_archive_says_which_and_where_and_writes_nothing(tmp_path):
    write_archives("wmt14_en_de", str(tmp_path / "raw"), "en", "de")
    os.remove(tmp_path / "raw" / "training-parallel-nc-v9.tgz")
    proc = run("wmt14_en_de/prepare.sh", ["--raw-dir", str(tmp_path / "raw"), "--out", str(tmp_path / "data")])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"wmt_data.py: error: missing {tmp_path}/raw/training-parallel-nc-v9.tgz: "
        "download it from http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz"]
    assert not (tmp_path / "data" / "raw").exists() and not (tmp_path / "data" / ".done").exists()


def test_train_without_prepared_corpus_says_so(tmp_path):
    proc = run("wmt14_en_de/train.sh", env={"DATA": str(tmp_path)})
    assert proc.returncode == 2
    assert f"no prepared corpus in DATA={tmp_path}" in proc.stderr and "recipes/wmt14_en_de/prepare.sh" in proc.stderr


@pytest.mark.parametrize("problem, message", [
    ("unequal", "commoncrawl.de-en.en has 120 lines but commoncrawl.de-en.de has 119"),
    ("latin1", "commoncrawl.de-en.de is not UTF-8"),
    ("empty", "commoncrawl.de-en.en is empty"),
])
def test_bad_raw_corpus_gets_one_line_and_exit_2(tmp_path, problem, message):
    write_archives("wmt14_en_de", str(tmp_path / "raw"), "en", "de")
    path = tmp_path / "raw" / "training-parallel-commoncrawl.tgz"
    with tarfile.open(path) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar}
    if problem == "unequal":
        files["commoncrawl.de-en.de"] = b"".join(files["commoncrawl.de-en.de"].splitlines(True)[:-1])
    elif problem == "latin1":
        files["commoncrawl.de-en.de"] = "caf\xe9\n".encode("latin-1") * 120
    else:
        files["commoncrawl.de-en.en"] = files["commoncrawl.de-en.de"] = b""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    proc = run("wmt14_en_de/prepare.sh", ["--raw-dir", str(tmp_path / "raw"), "--out", str(tmp_path / "data")],
               env={"VERIFY_CHECKSUMS": "0"})
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "data" / "raw" / "train.en").exists()


def test_published_checksum_mismatch_stops(tmp_path):
    """The generated test-full.tgz is not the official file: its md5 (sacrebleu's) must not match."""
    write_archives("wmt14_en_de", str(tmp_path / "raw"), "en", "de")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "fairseq_posenc", "recipe", "wmt_data.py"), "fetch", "--sources",
                           os.path.join(RECIPES, "wmt14_en_de", "sources"), "--raw-dir", str(tmp_path / "raw"),
                           "--no-download"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "training-parallel-europarl-v7.tgz: no published checksum, skipped verification" in proc.stdout
    assert "test-full.tgz: md5 is" in proc.stderr and "expected a8cd784e006feb32ac6f3d9ec7eb389a" in proc.stderr


# ------------------------------------------------------------------------------------------------
# paper scale (issue #16), on the miniature archives
def test_evaluate_refuses_an_unfinished_run_or_marks_it_and_decodes_in_the_precision_asked(trained, tmp_path):
    env, out = trained("wmt14_en_de")
    updates = 30 * plan_numbers(out)[0]
    run_dir = tmp_path / "half"
    shutil.copytree(env["OUT"], run_dir, ignore=shutil.ignore_patterns("averaged*", "generate*", "bleu*"))
    # what an interrupted run leaves: train.sh was asked for 40 epochs, the last checkpoint is at 30
    (run_dir / "train.env").write_text("TRAINED_MAX_UPDATE=\nTRAINED_MAX_EPOCH=40\n")
    half = {**env, "OUT": str(run_dir), "RESULTS": str(tmp_path / "results.txt")}
    proc = run("wmt14_en_de/evaluate.sh", env=half)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"evaluate.sh: {run_dir}/checkpoint_last.pt stopped at update {updates} (epoch 30 finished) before epoch 40: "
        "training is unfinished (re-run train.sh to finish it, or set ALLOW_UNFINISHED=1 to score it marked UNFINISHED)")
    assert not (tmp_path / "results.txt").exists() and not (run_dir / "averaged_last2.pt").exists()
    # on a GPU machine: each precision flag reaches fairseq-generate as the decoding precision
    for flags, device, decode in [("--bf16", "1 GPU(s) (--bf16); decoding on 1 GPU (bf16)", "--bf16"),
                                  ("--fp16 --memory-efficient-fp16", "2 GPU(s) (--fp16 --memory-efficient-fp16); "
                                   "decoding on 1 GPU (fp16)", "--fp16"),
                                  ("--amp", "1 GPU(s) (--amp); decoding on 1 GPU (fp32)", "")]:
        gpus = "2" if "memory" in flags else "1"
        out = ok(run("wmt14_en_de/evaluate.sh", ["--dry-run"], env={**half, "ALLOW_UNFINISHED": "1", "DEVICE": "auto",
                                                                   "NUM_GPUS": gpus, "DEVICE_FLAGS": flags}))
        assert "== WARNING: " in out and "scoring it anyway (ALLOW_UNFINISHED=1), marked UNFINISHED" in out
        assert f"on {device} ({decode}) ->" in out
        command = re.search(r"^== --dry-run: would run fairseq-generate (.*)$", out, re.M).group(1)
        assert command.endswith(f"--gen-subset test {decode} --remove-bpe".replace("  ", " ")) and "--cpu" not in command
        assert ("--fp16" in command, "--bf16" in command) == (decode == "--fp16", decode == "--bf16")
        # the line can be copied: every flag of the run is in it
        for flag in ("--user-dir", "--path", "--beam 4 --lenpen 0.6", "--max-len-a 1.5 --max-len-b 50", "--max-tokens"):
            assert flag in command, command
    # scored anyway when asked: both results lines say so
    out = ok(run("wmt14_en_de/evaluate.sh", env={**half, "ALLOW_UNFINISHED": "1"}))
    results = lines(tmp_path / "results.txt")
    assert len(results) == 2 and all(" avg=2 UNFINISHED | 40 sentences | " in r for r in results)


def test_train_refuses_the_cpu_unless_asked_and_keeps_the_papers_batch_on_1_and_8_gpus(prepared, tmp_path):
    data = prepared("wmt14_en_de")[0] / "data"
    env = {**TRAIN_ENV, "DATA": str(data), "OUT": str(tmp_path / "run"), "MAX_TOKENS": "4096", "UPDATE_FREQ": "auto"}
    del env["DEVICE"]
    proc = run("wmt14_en_de/train.sh", ["--dry-run"], env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("plan.py: error: no GPU visible (torch.cuda.device_count() is 0): a WMT-size "
                                   "stage would take weeks on CPU; set DEVICE=cpu to run it there anyway")
    for gpus, freq in (("1", 8), ("8", 1)):
        proc = run("wmt14_en_de/train.sh", ["--dry-run"], env={**env, "NUM_GPUS": gpus, "SAVE_INTERVAL_UPDATES": "7"})
        assert f"| tokens per update: 4096 x {gpus} GPU x update-freq {freq} = 32768 padded tokens at most" in proc.stdout
        assert f"| device: {gpus} GPU(s) (--fp16); decoding on 1 GPU (fp16)" in proc.stdout
        # the toy corpus is one update of the papers' batch: every update ends an epoch, no interval
        # checkpoint can be written, and the plan says so before anything runs
        assert "| updates per epoch: 1" in proc.stdout and proc.returncode == 2
        assert "writes 0 checkpoints every 7 updates (4 more fall at an epoch's end)" in proc.stderr
        assert not (tmp_path / "run").exists()
    # fairseq-train would use every visible GPU: it is held to the count the plan assumed
    out = ok(run("wmt14_en_de/train.sh", ["--dry-run"], env={
        **env, "NUM_GPUS": "2", "MAX_TOKENS": "500", "UPDATE_FREQ": "1", "SAVE_INTERVAL_UPDATES": "1",
        "MAX_EPOCH": "", "MAX_UPDATE": "6", "DEVICE_FLAGS": "--bf16"}))
    assert "== --dry-run: nothing trained (device flags: --bf16 --distributed-world-size 2)" in out
    out = ok(run("wmt14_en_de/train.sh", ["--dry-run"], env={
        **env, "NUM_GPUS": "2", "MAX_TOKENS": "500", "UPDATE_FREQ": "1", "SAVE_INTERVAL_UPDATES": "1",
        "MAX_EPOCH": "", "MAX_UPDATE": "6", "DEVICE_FLAGS": ""}))  # set but empty: fp32, not fp16
    assert "| device: 2 GPU(s) (fp32); decoding on 1 GPU (fp32)" in out
    assert "== --dry-run: nothing trained (device flags: --distributed-world-size 2)" in out


def test_en_fr_like_run_of_2_6_epochs_averages_interval_checkpoints(prepared, tmp_path):
    """En-Fr: 100k updates are 2.6 epochs, too few for 5 epoch checkpoints. Here 18 updates of
    about 7 an epoch: the default interval is refused, one of 3 updates gives 5 or 6 checkpoints,
    the last 5 averaged."""
    data = prepared("wmt14_en_de")[0] / "data"
    env = {**TRAIN_ENV, "DATA": str(data), "OUT": str(tmp_path / "run"), "MAX_EPOCH": "", "MAX_UPDATE": "18",
           "AVERAGE": "5", "SAVE_INTERVAL_UPDATES": "auto"}
    proc = run("wmt14_en_de/train.sh", env=env)
    assert proc.returncode == 2
    assert "writes 0 checkpoints every 1250 updates: too few to average the last 5" in proc.stderr
    out = ok(run("wmt14_en_de/train.sh", env={**env, "SAVE_INTERVAL_UPDATES": "3"}))
    per_epoch, averaged = plan_numbers(out)
    assert 6 <= per_epoch <= 9 and f"({18 / per_epoch:.2f} epochs, --max-update)" in out
    assert averaged == [u for u in range(3, 19, 3) if u % per_epoch][-5:]
    # fairseq wrote exactly those (checkpoint_EPOCH_UPDATE.pt), at the epochs the plan's count implies
    kept = {f for f in os.listdir(tmp_path / "run") if re.fullmatch(r"checkpoint_\d+_\d+\.pt", f)}
    assert kept == {f"checkpoint_{(u - 1) // per_epoch + 1}_{u}.pt" for u in averaged}
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "average_checkpoints.py"), "--inputs",
                           str(tmp_path / "run"), "--num-update-checkpoints", "5", "--output", str(tmp_path / "avg.pt")],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "averaged 5 checkpoints" in proc.stderr, proc.stderr


def test_prepare_rerun_with_another_bpe_size_redoes_bpe_and_what_follows(prepared, tmp_path):
    base, _, args, env = prepared("wmt14_en_de")
    shutil.copytree(base / "data", tmp_path / "data")
    args = [a if a != str(base / "data") else str(tmp_path / "data") for a in args]
    out = ok(run("wmt14_en_de/prepare.sh", args, {**env, "BPE_SIZE": "80"}))
    assert out.count("done before, skipping") == 3  # extract, tokenize, split
    assert "== [5/8] learn joint subword-nmt (80): redoing (settings changed: var.BPE_SIZE 60 -> 80)" in out
    assert "== [6/8] apply subword-nmt: redoing (step learn_bpe ran again since)" in out
    # preprocess writes BPE_SIZE into corpus.env: its own setting changed, besides the step before it
    (line,) = [x for x in out.splitlines() if x.startswith("== [8/8] fairseq-preprocess --joined-dictionary")]
    assert line.endswith(": redoing (settings changed: var.BPE_SIZE 60 -> 80)"), line
    assert "BPE_SIZE=80" in (tmp_path / "data" / "corpus.env").read_text()
    # more merges: fewer, longer subwords than the 60-merge corpus
    old, new = (sum(len(line.split()) for line in lines(d / "train.en")) for d in (base / "data", tmp_path / "data"))
    assert new < old


def test_prepare_rerun_on_a_copy_of_the_archives_skips_every_step_and_keeps_a_corpus_keyed_the_old_way(
        prepared, tmp_path):
    """The archives copied to other storage (another path, new dates) are the same archives: the
    extraction is keyed by their content, so a re-run skips all 7 steps. A corpus whose marker holds
    the earlier size-and-date key of these same archives is kept too (issue 31, item 6)."""
    from fairseq_posenc.recipe import wmt_data

    base, _, args, env = prepared("wmt14_en_de")
    shutil.copytree(base / "raw", tmp_path / "cluster", copy_function=shutil.copy)
    for name in os.listdir(tmp_path / "cluster"):
        os.utime(tmp_path / "cluster" / name, ns=(1_600_000_000_000_000_000,) * 2)
    shutil.copytree(base / "data", tmp_path / "data")
    args = [{str(base / "data"): str(tmp_path / "data"), str(base / "raw"): str(tmp_path / "cluster")}.get(a, a)
            for a in args]
    out = ok(run("wmt14_en_de/prepare.sh", args, env))
    assert out.count("done before, skipping") == 7 and "redoing" not in out, out
    # a marker of the earlier key (sizes and dates): upgraded in place, nothing redone
    sources = read_sources(os.path.join(RECIPES, "wmt14_en_de", "sources"), "en", "de")[0]
    marker = tmp_path / "data" / ".done" / "extract"
    record = json.loads(marker.read_text())
    key = record["settings"]["archives"]
    record["settings"]["archives"] = wmt_data.legacy_fingerprint(sources, str(tmp_path / "cluster"))
    marker.write_text(json.dumps(record))
    proc = run("wmt14_en_de/prepare.sh", args, env)
    assert ok(proc).count("done before, skipping") == 7 and "keyed by their content (sha256)" in proc.stderr
    assert json.loads(marker.read_text())["settings"]["archives"] == key


def test_truncated_archive_in_the_cache_is_downloaded_again_after_deleting_it(tmp_path):
    write_archives("wmt14_en_de", str(tmp_path / "mirror"), "en", "de", train_pairs=90)
    cache = tmp_path / "cache"
    shutil.copytree(tmp_path / "mirror", cache)
    whole = (cache / "training-parallel-nc-v9.tgz").read_bytes()
    (cache / "training-parallel-nc-v9.tgz").write_bytes(whole[: len(whole) // 2])
    env = {"ARCHIVES": str(cache), "MIRROR": f"file://{tmp_path}/mirror", "VERIFY_CHECKSUMS": "0", "BPE_SIZE": "40",
           "WORKERS": "1"}
    args = ["--out", str(tmp_path / "data"), "--valid", "newstest2013"]
    proc = run("wmt14_en_de/prepare.sh", args, env)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"wmt_data.py: error: {cache}/training-parallel-nc-v9.tgz is not a readable tar "
                                  "archive (") and proc.stderr.strip().endswith("delete it and download it again")
    os.remove(cache / "training-parallel-nc-v9.tgz")
    out = ok(run("wmt14_en_de/prepare.sh", args, env))
    assert f"| downloading file://{tmp_path}/mirror/training-parallel-nc-v9.tgz" in out
    assert out.count("| downloading") == 1 and (cache / "training-parallel-nc-v9.tgz").read_bytes() == whole
    assert len(lines(tmp_path / "data" / "raw" / "train.en")) == 90


def test_arguments_a_recipe_does_not_take_are_refused(tmp_path):
    proc = run("wmt14_en_de/prepare.sh", ["--pair", "en-fr"])
    assert proc.returncode == 2 and proc.stderr.strip() == "prepare.sh: --pair: wmt14_en_de has one pair, en-de"
    proc = run("wmt14_en_fr/train.sh", ["--epochs", "3"])
    assert proc.returncode == 2 and proc.stderr.strip() == "train.sh: unknown argument '--epochs' (see --help)"
    # wmt18 takes --pair: cs-en is the cs-en corpus, not en-de's
    proc = run("wmt18/train.sh", ["--pair", "cs-en"], cwd=str(tmp_path))
    assert proc.returncode == 2 and "no prepared corpus in DATA=data/wmt18_cs_en" in proc.stderr


def test_en_fr_floater_big_plans_the_papers_one_epoch_half_lr_and_last_5(prepared, tmp_path):
    data = prepared("wmt14_en_fr", "sentencepiece")[0] / "data"
    env = {k: v for k, v in TRAIN_ENV.items() if k not in ("AVERAGE", "LR", "MAX_EPOCH")}
    env.update({"DATA": str(data), "OUT": str(tmp_path / "run"), "ENC": "floater", "ARCH": "big",
                "SAVE_INTERVAL_UPDATES": "1"})
    out = ok(run("wmt14_en_fr/train.sh", ["--dry-run"], env=env))
    per_epoch = plan_numbers(out)[0]
    assert "== FLOATER protocol (big): vanilla at lr 5e-4, FLOATER at lr 0.00025, dropout 0.1" in out
    # the paper's Appendix B.2: the vanilla model trains 30 epochs (not the baseline's MAX_UPDATE)
    assert f"| stage vanilla: ends at its update {30 * per_epoch} (30.00 epochs, --max-epoch)" in out
    assert f"| stage floater: ends at its update {per_epoch} (1.00 epochs, --max-epoch)" in out
    assert "the last 5 kept (--keep-interval-updates)" in out and "== --dry-run: nothing trained" in out


def test_wmt18_pairs_share_one_archive_cache(tmp_path):
    """The four pairs read the same five archives: the second pair downloads nothing. (The toy
    archives hold cs-en members only, so both runs stop at extraction, after the fetch.)"""
    write_archives("wmt18", str(tmp_path / "mirror"), "cs", "en", train_pairs=30)
    env = {"ARCHIVES": str(tmp_path / "cache"), "MIRROR": f"file://{tmp_path}/mirror", "VERIFY_CHECKSUMS": "0"}
    first = run("wmt18/prepare.sh", ["--pair", "en-de", "--out", str(tmp_path / "en_de")], env)
    second = run("wmt18/prepare.sh", ["--pair", "de-en", "--out", str(tmp_path / "de_en")], env)
    assert first.stdout.count("| downloading file://") == 5
    assert second.stdout.count("already there, not downloading") == 5 and "| downloading" not in second.stdout
    for proc in (first, second):  # the cs-en toy archives have no German members
        assert proc.returncode == 2 and "has no member training/europarl-v7.de-en." in proc.stderr
    assert sorted(os.listdir(tmp_path / "cache")) == sorted(OFFICIAL["wmt18"])


def test_extrapolation_dry_run_plans_each_model_with_its_own_defaults_and_a_new_bins_redoes_the_split(
        prepared, tmp_path):
    """--dry-run splits and binarizes (the plan counts updates per epoch from the short-pair
    corpus) and prints each model's plan, training nothing. With ARCH=big sinusoidal averages
    20 and FLOATER 5: one encoding's defaults must not carry over to the next. FLOATER and RNN
    start from one vanilla stage, which the totals count once. A re-run with other BINS redoes the
    split, leaving no bin file of the old BINS behind."""
    base, _, _, _ = prepared("wmt14_en_de")
    out = tmp_path / "extrapolation"
    env = {k: v for k, v in TRAIN_ENV.items() if k not in ("AVERAGE", "MAX_EPOCH")}
    env.update({"DATA": str(base / "data"), "OUT": str(out), "ENCODINGS": "sinusoidal floater rnn learned",
                "ARCH": "big", "MAX_UPDATE": "400", "SAVE_INTERVAL_UPDATES": "5", "TRAIN_BELOW": "12",
                "BINS": "12 15 18", "UNIT": "words"})
    stdout = ok(run("extrapolation/run.sh", ["--dry-run"], env=env))
    plans = re.findall(r"\| averaged: updates ([\d, ]+) \(", stdout)
    # sinusoidal (big: last 20), FLOATER and RNN (FLOATER's paper: last 5), learned (big again: last 20)
    assert [len(p.split(", ")) for p in plans] == [20, 5, 5, 20]
    # the dry run adds up every model's stages (FLOATER's and RNN's two among them) and checks the disk once
    ends = [int(n) for n in re.findall(r"\| stage \S+: ends at its update (\d+) ", stdout)]
    assert len(ends) == 6 and ends[0] == ends[5] == 400 and ends[1] == ends[3]
    vanilla = {line.split()[4] for line in stdout.splitlines() if line.startswith("== 1/3 vanilla stage: ")}
    assert len(vanilla) == 1 and os.path.dirname(vanilla.pop()) == str(out / "shared")
    # and FLOATER's and RNN's controls (VANILLA_CONTINUED=1 by default here): their stage 2 once more
    controls = [int(n) for n in re.findall(r"\| control stage vanilla_continued: stage (?:floater|rnn)'s schedule "
                                           r"from the same start, without it: (\d+) more updates", stdout)]
    assert controls == [ends[2], ends[4]]
    control = sum(controls)
    # the vanilla stage FLOATER and RNN share counts once
    assert re.search(rf"\| total for 4 model\(s\): {sum(ends) + control - ends[3]} updates, about [\d.]+ [KMGT]?B of "
                     rf"checkpoints; vanilla-big-\w+ \({ends[3]} updates\) shared by 2 models, counted once\n", stdout), \
        stdout
    assert re.search(r"\| disk: they need about [\d.]+ [KMGT]?B; [\d.]+ [KMGT]?B free on the filesystem of ", stdout)
    assert not (out / ".plan_totals").exists()
    assert stdout.count("== --dry-run: nothing trained") >= 3 and "== --dry-run: nothing trained, no report" in stdout
    assert not (out / "sinusoidal").exists() or not any((out / "sinusoidal").glob("*.pt"))
    assert not (out / "bleu_by_length.md").exists()
    assert sorted(p.name for p in (out / "split").glob("long.*.en")) == [
        "long.12-15.en", "long.15-18.en", "long.18-inf.en"]

    # (the rest checks the split: one model's plan is enough, and other ENCODINGS must not redo it)
    env["ENCODINGS"] = "sinusoidal"
    stdout = ok(run("extrapolation/run.sh", ["--dry-run"], env={**env, "BINS": "12 20"}))
    assert re.search(r"== \[split\] .*: redoing \(settings changed: var\.BINS 12 15 18 -> 12 20\)", stdout), stdout
    assert re.search(r"== \[preprocess\] .*: redoing", stdout), stdout
    assert sorted(p.name for p in (out / "split").glob("long.*.en")) == ["long.12-20.en", "long.20-inf.en"]
    long_pairs = sum(len(lines(p)) for p in (out / "split").glob("long.*-*.en"))
    assert len(lines(out / "split" / "long.en")) == long_pairs  # the one test set holds no old bin
    proc = run("extrapolation/run.sh", ["--pair", "de-en"], env=env)
    assert proc.returncode == 2 and "--pair: wmt14_en_de has one pair" in proc.stderr
    proc = run("extrapolation/run.sh", ["--dry-run"], env={**env, "NNODES": "2"})
    assert proc.returncode == 2 and "the extrapolation recipe runs on one node (NNODES=2" in proc.stderr

    # the validation set is cut at TRAIN_BELOW too (counted in words: subword-nmt's @@ undone), so
    # that checkpoint selection sees no test length
    valid = lines(out / "split" / "valid.en")
    full_valid = lines(base / "data" / "valid.en")
    words = [sum(not t.endswith("@@") for t in line.split()) for line in full_valid]
    assert len(valid) == sum(w < 12 for w in words) and 0 < len(valid) < len(full_valid)
    assert f"valid: {len(valid):7d} of {len(full_valid)} validation pairs (sources < 12)" in stdout
    # the split is stamped by content: the same corpus at another path is done; the corpus
    # changed at the same path (one training pair less) redoes the split and what follows
    moved = tmp_path / "moved"
    shutil.copytree(base / "data", moved)
    env = {**env, "DATA": str(moved), "BINS": "12 20"}
    stdout = ok(run("extrapolation/run.sh", ["--dry-run"], env=env))
    assert re.search(r"== \[split\] .*: done before, skipping", stdout), stdout
    for lang in ("en", "de"):
        text = lines(moved / f"train.tok.{lang}")
        (moved / f"train.tok.{lang}").write_text("".join(line + "\n" for line in text[1:]), encoding="utf-8")
    stdout = ok(run("extrapolation/run.sh", ["--dry-run"], env=env))
    assert re.search(r"== \[split\] .*: redoing \(settings changed: input.text_src \w+ -> \w+, input.text_tgt", stdout), stdout
    assert re.search(r"== \[preprocess\] .*: redoing", stdout), stdout


def test_extrapolation_on_an_en_fr_corpus_keeps_en_frs_defaults(prepared, tmp_path):
    """The extrapolation recipe takes the corpus's recipe defaults: En-Fr big trains with dropout
    0.1 (Vaswani et al.) and FLOATER's stage one epoch (Liu et al.), as recipes/wmt14_en_fr does."""
    base = prepared("wmt14_en_fr")[0]
    env = {k: v for k, v in TRAIN_ENV.items() if k not in ("LR", "MAX_EPOCH")}
    env.update({"DATA": str(base / "data"), "OUT": str(tmp_path / "x"), "ENCODINGS": "floater", "ARCH": "big",
                "MAX_UPDATE": "400", "SAVE_INTERVAL_UPDATES": "1", "TRAIN_BELOW": "12", "BINS": "12 15",
                "UNIT": "words"})
    stdout = ok(run("extrapolation/run.sh", ["--dry-run"], env=env))
    assert "== FLOATER protocol (big): vanilla at lr 5e-4, FLOATER at lr 0.00025, dropout 0.1 " in stdout
    assert re.search(r"\| stage floater: ends at its update \d+ \(1\.00 epochs, --max-epoch\)", stdout), stdout
    # its validation set, sentencepiece-segmented, is cut at 12 words (pieces that start with U+2581)
    valid = lines(tmp_path / "x" / "split" / "valid.en")
    assert valid and all(sum(p.startswith("\u2581") for p in line.split()) < 12 for line in valid)


def test_train_into_an_out_of_other_settings_is_refused(prepared, tmp_path):
    """fairseq-train resumes from OUT's checkpoint_last.pt whatever its flags: a second run with
    another lr into the same OUT would continue (or end) the first and carry its label."""
    data = prepared("wmt14_en_de")[0] / "data"
    env = {**TRAIN_ENV, "DATA": str(data), "OUT": str(tmp_path / "run"), "MAX_EPOCH": "", "MAX_UPDATE": "4",
           "SAVE_INTERVAL_UPDATES": "2"}
    ok(run("wmt14_en_de/train.sh", env=env))
    best = (tmp_path / "run" / "checkpoint_best.pt").stat().st_mtime_ns
    # a finished run is not trained further (fairseq-train would train one update more)
    stdout = ok(run("wmt14_en_de/train.sh", env=env))
    assert f"{tmp_path / 'run'}: skip finished at update 4 (update 4)" in stdout
    assert torch.load(tmp_path / "run" / "checkpoint_last.pt", weights_only=False)["optimizer_history"][-1][
        "num_updates"] == 4 and (tmp_path / "run" / "checkpoint_best.pt").stat().st_mtime_ns == best
    stdout = ok(run("wmt14_en_de/train.sh", env={**env, "MAX_UPDATE": "6"}))  # training longer resumes
    assert f"{tmp_path / 'run'}: resume stopped at update 4 of update 6" in stdout
    assert torch.load(tmp_path / "run" / "checkpoint_last.pt", weights_only=False)["optimizer_history"][-1][
        "num_updates"] == 6
    proc = run("wmt14_en_de/train.sh", env={**env, "MAX_UPDATE": "6", "LR": "1e-3"})
    assert proc.returncode == 2
    assert (f"{tmp_path / 'run'} holds checkpoints of another configuration: lr: [0.005] -> [0.001] (lr_scheduler, "
            "model, optimization, optimizer). fairseq-train would resume them: use another OUT, delete its checkpoints "
            "to start over, or set STAGE_ON_CHANGE=restart") in proc.stderr
    # the log of all three runs, appended
    log = (tmp_path / "run" / "train.log").read_text()
    assert log.count(": start nothing trained yet") == 1 and log.count(": resume stopped at update 4") == 1
