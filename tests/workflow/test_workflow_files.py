"""A study on a corpus of the user's own plain files (corpus.name files), through recipes/run.sh
as a user runs it: its plan's sizes counted from the files, the short-to-long split, two encodings
and two named test sets, each decoded, scored and reported apart, with fairseq itself (tiny models,
a few CPU updates: what is tested is the workflow, not the models). Then what an edit of the split's
script redoes, and a second study on the same corpus directory. (The dry runs of the shipped
files.yaml and iwslt14_cpu.yaml are tests/workflow/test_workflow.py's, with every shipped configuration.)"""
import json
import os
import re
import subprocess
import sys

import yaml

from posenc_workflow.corpus import files_data_dir
from helpers.snakemake_runs import REPO, STUBS, checkout, edit, ok
from helpers.toy_archives import write_plain_pairs

BIN = os.path.dirname(sys.executable)


def run_sh(root, workdir, corpus, *args, timeout=900, stub=False):
    """``bash ROOT/recipes/run.sh CORPUS ARGS...`` in ``workdir``, fairseq's commands from this Python
    (``stub``: the stub fairseq-train of helpers/stubs)."""
    path = f"{STUBS + ':' if stub else ''}{BIN}:{os.environ['PATH']}"
    return subprocess.run(["bash", os.path.join(root, "recipes", "run.sh"), corpus, *args], cwd=workdir,
                          capture_output=True, text=True, timeout=timeout, start_new_session=True,
                          env={**os.environ, "PATH": path, "OMP_NUM_THREADS": "1",
                               # the checkout's packages, as its own install imports them
                               "PYTHONPATH": os.pathsep.join([str(root), os.path.join(root, "recipes")])})


def lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def write_study(path, study):
    with open(path, "w") as f:
        yaml.safe_dump(study, f)


STUDY = {
    "out": "study",
    "corpus": {"name": "files", "pair": "de-en", "train": {"src": "train.de", "tgt": "train.en"},
               "test": {"news": {"src": "news.de", "tgt": "news.en"}, "talks": {"src": "talks.de", "tgt": "talks.en"}},
               "bpe_size": 60, "workers": 1},
    "split": {"train_below": 12, "bins": [12, 16], "unit": "words"},
    "models": {"arch": "tiny", "encodings": ["sinusoidal", "alibi"]},
    "train": {"device": "cpu", "max_update": 3, "save_interval_updates": 1000, "max_tokens": 1000, "batch_target": 1000,
              "lr": 0.005, "dropout": 0.1, "warmup_updates": 2},
    # epochs of one update (71 short training pairs); a beam of 1: an untrained model decodes to its length limit
    "evaluate": {"checkpoints": "epoch", "average": 1, "beam": 1},
}


def test_a_study_of_plain_files_with_a_split_and_two_named_test_sets_runs_to_its_report(tmp_path):
    root = str(checkout(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    train = write_plain_pairs(str(work / "train"), 150, "de", "en", seed=1)
    news = write_plain_pairs(str(work / "news"), 5, "de", "en", seed=2, lengths=(3, 6))
    talks = write_plain_pairs(str(work / "talks"), 3, "de", "en", seed=3, lengths=(3, 6))
    write_study(work / "study.yaml", STUDY)

    # the dry run: the plan's training pairs counted in the files (sources under 12 words, less
    # every 100th as validation), no job run
    dry = ok(run_sh(root, work, "files", "study.yaml", "-n"))
    short = [t for s, t in train if len(s.split()) < 12]
    pairs, words = len(short) - len(short) // 100, sum(len(t.split()) for t in short)
    assert f"({pairs:,} training pairs (counted in train.en (sources under 12 words): {len(short):,} lines, " \
           f"{words:,} target words)" in dry
    stats = dict(re.findall(r"^(\w+)\s+(\d+)$", dry.split("Job stats:")[1].split("Reasons")[0], re.M))
    assert stats["train"] == "2" and stats["decode"] == stats["score"] == "6" and stats["length_report"] == "3"
    assert not (work / "study").exists()

    out = ok(run_sh(root, work, "files", "study.yaml", "-c2"))
    # the disk check ran before the text was written
    assert "| disk: the prepared corpus (9.2x the " in out
    data = next(p for p in (work / "data").iterdir())
    assert data.name.startswith("files_de_en_")
    # each named test set prepared and binarized apart: fairseq's test and test1 subsets
    assert lines(data / "test.news.raw.en") == [t for _, t in news]
    assert {"test.de-en.de.idx", "test1.de-en.de.idx"} <= set(os.listdir(data / "data-bin"))
    study = work / "study"
    results = lines(study / "results.txt")
    assert len(results) == 12  # 2 models x 3 test sets x (SacreBLEU, tokenized BLEU)
    # the split's test set: the training pairs of 12 words or more (less the validation's)
    split = json.load(open(study / "split" / "text" / "split.json"))
    bins = [part["sentences"] for part in split["parts"] if part["name"] != "train"]
    long_pairs = sum(bins)
    assert len(bins) == 2 and min(bins) > 0 and long_pairs == sum(len(s.split()) >= 12 for s in lines(data / "train.tok.de"))
    for name, count in (("split-long-pairs(source>=12-words)", long_pairs), ("news", len(news)),
                        ("talks", len(talks))):
        mine = [line for line in results if f" arch=tiny {name} beam=1 " in line]
        assert len(mine) == 4 and all(f"| {count} sentences |" in line for line in mine), (name, results)
    for name, refs in (("news", news), ("talks", talks)):
        for row in ("sinusoidal", "alibi"):
            decoded = study / "tests" / name / row / "seed1"
            score = json.load(open(decoded / "score.json"))
            assert score["sentences"] == len(refs) and score["label"].startswith(f"enc={row} files_de_en de-en ")
            # the set's own source sentences, each once
            ids = sorted(int(line.split("\t")[0][2:]) for line in lines(decoded / "test.txt") if line.startswith("S-"))
            assert ids == list(range(len(refs)))
        report = json.load(open(study / f"bleu_by_length.{name}.json"))
        assert list(report["models"]) == ["sinusoidal", "alibi"]
        assert sum(b["sentences"] for b in report["bins"]) == len(refs)
        # its plot's title names it
        assert json.load(open(study / f"study.{name}.json"))["report"]["title"] == f"study, test set {name}"
    # every long pair in the split's report, binned by files.yaml's report.bins
    report = json.load(open(study / "bleu_by_length.json"))
    assert sum(b["sentences"] for b in report["bins"]) == long_pairs
    assert {b["bin"] for b in report["bins"]} <= {"[1,10)", "[10,20)", "[20,30)", "[30,40)", "[40,inf)"}

    # an edit of the split's script: the split and what follows it, nothing of the corpus before it
    edit(os.path.join(root, "scripts", "length_split.py"))
    dry = ok(run_sh(root, work, "files", "study.yaml", "-n"))
    ran = set(re.findall(r"^(?:local)?rule (\w+):", dry, re.M))
    assert {"length_split", "train", "decode"} <= ran and not ran & {"gather", "tokenize", "segment", "binarize"}

    # another study's BPE on this corpus's directory is refused in one line; by default it gets its own
    other = json.loads(json.dumps(STUDY))
    other["out"], other["corpus"]["bpe_size"], other["corpus"]["data"] = "other", 80, os.path.relpath(data, work)
    write_study(work / "other.yaml", other)
    proc = run_sh(root, work, "files", "other.yaml", "-n")
    assert proc.returncode != 0
    refusal = next(line for line in (proc.stdout + proc.stderr).splitlines() if "configuration refused" in line)
    assert f"corpus.data {os.path.relpath(data, work)} was prepared by the study study with corpus.bpe_size 60 " \
           "(here 80)" in refusal
    # without corpus.data each preparation has its own directory, named by its settings
    defaults = {"bpe": "subword-nmt", "tokenize": "moses"}  # as the schema fills them in
    assert data.name == os.path.basename(files_data_dir({**STUDY["corpus"], **defaults}, "de", "en")) != \
        os.path.basename(files_data_dir({**other["corpus"], **defaults}, "de", "en"))


def test_a_sacrebleu_test_set_is_read_from_sacrebleus_cache(tmp_path):
    # sacrebleu's own files (as it leaves them in $SACREBLEU after a download): no network
    cache = tmp_path / "sacrebleu" / "wmt14"
    cache.mkdir(parents=True)
    fields = {"src": ["Ein Haus .", "Zwei Katzen ."], "ref": ["A house.", "Two cats."], "docid": ["d", "d"],
              "genre": ["news", "news"], "origlang": ["de", "de"]}
    for field, text in fields.items():
        (cache / f"wmt14.de-en.{field}").write_text("".join(line + "\n" for line in text))
    settings = {"src": "de", "tgt": "en", "splits": {"test.wmt14": {"sacrebleu": "wmt14"}}}
    prepare = os.path.join(REPO, "recipes", "posenc_workflow", "prepare.py")
    proc = subprocess.run([sys.executable, prepare, "gather", "--data", str(tmp_path / "data"), "--settings",
                           json.dumps(settings)], capture_output=True, text=True,
                          env={**os.environ, "SACREBLEU": str(tmp_path / "sacrebleu")})
    assert proc.returncode == 0, proc.stderr
    assert lines(tmp_path / "data" / "raw" / "test.wmt14.de") == fields["src"]
    assert lines(tmp_path / "data" / "raw" / "test.wmt14.en") == fields["ref"]
    # a pair sacrebleu does not have: one line
    settings["splits"] = {"test.x": {"sacrebleu": "wmt14"}}
    settings["src"], settings["tgt"] = "xx", "en"
    proc = subprocess.run([sys.executable, prepare, "gather", "--data", str(tmp_path / "data"), "--settings",
                           json.dumps(settings)], capture_output=True, text=True,
                          env={**os.environ, "SACREBLEU": str(tmp_path / "sacrebleu")})
    assert proc.returncode == 2 and proc.stderr.startswith("prepare.py gather: error: sacrebleu test set wmt14 xx-en")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_cpu_studys_plan_counts_what_trains_at_a_cpus_speed_and_no_stale_training_set(tmp_path):
    """files.yaml's IWSLT model on the CPU, with the stub fairseq-train: the plan's time at the CPU
    speed of train.tokens_per_second auto (not a GPU's), in minutes under an hour, the trainings
    run at once on --cores; its totals count only what trains; after an edit of the files, the
    training set counted in them, not in the data prepared before."""
    root = str(checkout(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    write_plain_pairs(str(work / "train"), 150, "de", "en", seed=1)
    write_plain_pairs(str(work / "tst"), 5, "de", "en", seed=2, lengths=(3, 6))
    write_study(work / "study.yaml", {
        "out": "study", "models": {"encodings": ["sinusoidal", "alibi"]},
        "corpus": {"pair": "de-en", "train": {"src": "train.de", "tgt": "train.en"},
                   "test": {"tst": {"src": "tst.de", "tgt": "tst.en"}}, "bpe_size": 60, "workers": 1},
        "train": {"device": "cpu", "precision": "fp32", "max_update": 40}, "evaluate": {"checkpoints": "epoch", "average": 2}})

    def plan(*args):
        out = ok(run_sh(root, work, "files", "study.yaml", "-n", *args, stub=True))
        return [line for line in out.splitlines() if line.startswith("| plan") or line.startswith("|   ")]

    # before the corpus is prepared: 40 updates of ~3,125 target tokens (4,096 padded) a model, at the
    # measured 70 GFLOP/s of a thread over 6 x the IWSLT model's parameters with 60 embedding rows
    dry = plan("--cores", "2")
    speed = "on the CPU at 367 target tokens a second (auto: 1 thread(s) at 70 GFLOP/s, as measured on an x86 " \
            "server, over 6 x 31,574,016 parameters; set train.tokens_per_second from fairseq's wps in train.log " \
            "on your CPU) (estimated)"
    assert dry.count(f"|   time: 6 min {speed}") == 2
    assert dry[-1] == "| plan total: 2 model(s), 2 to train, 80 updates, about 3.0 GB of checkpoints, 11 min on " \
        "the CPU, 2 at a time (--cores 2, 1 thread(s) each): about 6 min from the first start (estimated before " \
        "the corpus is prepared)"
    assert plan("--cores", "1")[-1].endswith(", 11 min on the CPU, one model after another (--cores 1, 1 thread(s) "
                                             "each) (estimated before the corpus is prepared)")

    # one model trained (the corpus prepared): the other alone to train
    ok(run_sh(root, work, "files", "study.yaml", "-c1", "study/models/sinusoidal/seed1/trained.json", stub=True))
    data = next((work / "data").iterdir())
    dry = plan("--cores", "2")
    assert "|   trained: study/models/sinusoidal/seed1/trained.json, with its configuration, code and data as they " \
        "are: not in the total" in dry
    assert dry[-1] == "| plan total: 2 model(s), 1 to train (1 trained), 40 updates, about 1.5 GB of checkpoints, 2 min " \
        "on the CPU, one training (--cores 2, 1 thread(s) each)"
    counted = [line for line in dry if line.startswith("|   training set: ")]
    assert len(counted) == 2 and counted[0].startswith("|   training set: 149 pairs, ")

    # the files edited (300 pairs): the size counted in them, and both models train again
    write_plain_pairs(str(work / "train"), 300, "de", "en", seed=3)
    out = ok(run_sh(root, work, "files", "study.yaml", "-n", "--cores", "2", stub=True))
    assert re.search(r"^(local)?rule gather:", out, re.M)  # Snakemake prepares them again
    again = f"prepared again: train.de, train.en newer than data/{data.name}/data-bin"
    words = sum(len(line.split()) for line in lines(work / "train.en"))
    assert out.count(f"|   updates per epoch: ~1 ({again}; 297 training pairs (counted in train.en: 300 lines, "
                     f"{words:,} target words) of ") == 2
    assert "training set: " not in out
    assert f"|   trains again: its data is prepared again ({again[len('prepared again: '):]})" in out
    assert re.search(r"^\| plan total: 2 model\(s\), 2 to train, 80 updates, .* 2 at a time \(--cores 2, ", out, re.M)
