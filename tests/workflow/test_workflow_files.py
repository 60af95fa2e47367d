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

import pytest
import yaml

from posenc_workflow.corpus import files_data_dir
from helpers.snakemake_runs import REPO, checkout, edit, ok, run_sh
from helpers.toy_archives import write_plain_pairs

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
    "train": {"device": "cpu", "max_update": 9, "save_interval_updates": 1000, "max_tokens": 1000, "batch_target": 1000,
              "lr": 0.005, "dropout": 0.1, "warmup_updates": 2},
    # epochs of 3 updates (71 short training pairs), the last 2 averaged; a beam of 1: an untrained
    # model decodes to its length limit
    "evaluate": {"checkpoints": "epoch", "average": 2, "beam": 1},
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """The study of STUDY run to its report through run.sh, with its dry run before: (the checkout,
    the working directory, the dry run's output, the run's, the pairs of train, news and talks)."""
    tmp_path = tmp_path_factory.mktemp("files")
    root = str(checkout(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    train = write_plain_pairs(str(work / "train"), 150, "de", "en", seed=1)
    news = write_plain_pairs(str(work / "news"), 5, "de", "en", seed=2, lengths=(3, 6))
    talks = write_plain_pairs(str(work / "talks"), 3, "de", "en", seed=3, lengths=(3, 6))
    write_study(work / "study.yaml", STUDY)
    dry = ok(run_sh(root, work, "files", "study.yaml", "-n"))
    assert not (work / "study").exists()
    out = ok(run_sh(root, work, "files", "study.yaml", "-c2"))
    return root, work, dry, out, train, news, talks


def planned(root, work, study, *args):
    """{rule: jobs} of a dry run of ``study`` (written to edited.yaml) through run.sh: {} when
    nothing is to be done."""
    write_study(work / "edited.yaml", study)
    dry = ok(run_sh(root, work, "files", "edited.yaml", "-n", *args))
    if "Job stats:" not in dry:
        assert "Nothing to be done" in dry, dry[-2000:]
        return {}
    table = dry.split("Job stats:")[1].split("Reasons")[0]
    return {rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", table, re.M) if rule != "total"}


def edited(**changes):
    """STUDY with ``section__field=value`` changed (``section=value`` replaces a section)."""
    out = json.loads(json.dumps(STUDY))
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            out[section][field] = value
        else:
            out[section] = value
    return out


def test_a_study_of_plain_files_with_a_split_and_two_named_test_sets_runs_to_its_report(finished):
    root, work, dry, out, train, news, talks = finished
    # the dry run: the plan's training pairs counted in the files (sources under 12 words, less
    # every 100th as validation), no job run
    short = [t for s, t in train if len(s.split()) < 12]
    pairs, words = len(short) - len(short) // 100, sum(len(t.split()) for t in short)
    assert f"({pairs:,} training pairs (counted in train.en (sources under 12 words): {len(short):,} lines, " \
           f"{words:,} target words)" in dry
    stats = dict(re.findall(r"^(\w+)\s+(\d+)$", dry.split("Job stats:")[1].split("Reasons")[0], re.M))
    assert stats["train"] == "2" and stats["decode"] == stats["score"] == "6" and stats["length_report"] == "3"
    # the disk check ran before the text was written
    assert "| disk: the prepared corpus (9.2x the " in out
    data = next(p for p in (work / "data").iterdir())
    assert data.name.startswith("files_de_en_")
    study = work / "study"
    # each named test set prepared and binarized apart, under the study, with the corpus's dictionaries
    assert lines(study / "tests" / "news" / "data" / "test.raw.en") == [t for _, t in news]
    assert not any(name.startswith("test") for name in os.listdir(data / "data-bin"))
    for name in ("news", "talks"):
        binarized = study / "tests" / name / "data" / "data-bin"
        assert {"test.de-en.de.idx", "test.de-en.en.idx"} <= set(os.listdir(binarized))
        assert all((binarized / f"dict.{lang}.txt").read_bytes() == (data / "data-bin" / f"dict.{lang}.txt").read_bytes()
                   for lang in ("de", "en"))
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
    script = os.path.join(root, "scripts", "length_split.py")
    with open(script, encoding="utf-8") as f:
        original = f.read()
    edit(script)
    try:
        dry = ok(run_sh(root, work, "files", "study.yaml", "-n"))
    finally:  # the other tests' dry runs read the same finished study
        with open(script, "w", encoding="utf-8") as f:
            f.write(original)
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


# what the report of one test set runs (a named one: its model's files beside its decodes)
DECODE = {"decode", "detok", "score"}


def test_adding_a_test_set_prepares_decodes_and_reports_only_it(finished):
    root, work, *_ = finished
    write_plain_pairs(str(work / "forum"), 4, "de", "en", seed=4, lengths=(3, 6))
    study = json.loads(json.dumps(STUDY))
    study["corpus"]["test"]["forum"] = {"src": "forum.de", "tgt": "forum.en"}
    # its preparation; per row its decode, detok, score and the model's files beside them; its
    # length report; the results of every test set (one file)
    assert planned(root, work, study) == {"prepare_test": 1, "test_model": 2, "decode": 2, "detok": 2, "score": 2,
                                          "study_config": 1, "length_report": 1, "results": 1, "all": 1}
    # removed: the results only; renamed: as added
    del study["corpus"]["test"]["forum"]
    del study["corpus"]["test"]["talks"]
    assert planned(root, work, study) == {"results": 1, "all": 1}
    study["corpus"]["test"]["chats"] = {"src": "talks.de", "tgt": "talks.en"}
    assert planned(root, work, study)["prepare_test"] == 1 and "train" not in planned(root, work, study)


def test_another_average_trains_nothing_and_one_past_the_kept_checkpoints_is_refused(finished):
    root, work, *_ = finished
    # 3 epochs, the last 2 kept: 1 averages again, and what follows the averages
    assert planned(root, work, edited(evaluate__average=1)) == {
        "average": 2, "label": 2, "test_model": 4, "decode": 6, "detok": 6, "score": 6, "length_report": 3,
        "results": 1, "all": 1}
    write_study(work / "edited.yaml", edited(evaluate__average=3))
    proc = run_sh(root, work, "files", "edited.yaml", "-n")
    refusal = [line for line in (proc.stdout + proc.stderr).splitlines() if "configuration refused" in line]
    assert proc.returncode != 0 and len(refusal) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "evaluate.average 3 (epoch checkpoints): more than the finished trainings kept (sinusoidal/seed1 kept 2, " \
           "alibi/seed1 kept 2); lower it, or train them again: delete their checkpoint directories (study/checkpoints/" \
           in refusal[0]


def test_each_edit_plans_the_jobs_it_feeds(finished):
    root, work, *_ = finished
    assert planned(root, work, STUDY) == {}
    # a seed: its models' jobs; the reports of every test set (their rows gain a seed)
    seeds = planned(root, work, edited(models={**STUDY["models"], "seeds": [1, 2]}))
    assert seeds == {"train": 2, "average": 2, "label": 2, "test_model": 4, "decode": 6, "detok": 6, "score": 6,
                     "study_config": 3, "length_report": 3, "results": 1, "all": 1}
    # the beam: decodes on, never a training
    beam = planned(root, work, edited(evaluate={**STUDY["evaluate"], "beam": 2}))
    assert beam == {"decode": 6, "detok": 6, "score": 6, "length_report": 3, "results": 1, "all": 1}
    # the report's bins: the reports only (the split's report reads split.bins, report.bins the named sets')
    bins = planned(root, work, edited(report={"bins": [1, 5, 9]}))
    assert bins == {"study_config": 3, "length_report": 3, "all": 1}
    # a job's threads: nothing
    assert planned(root, work, edited(train={**STUDY["train"], "threads": 2})) == {}


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
