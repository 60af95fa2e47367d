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

from posenc_workflow import settings
from posenc_workflow.corpus import files_data_dir
from helpers import snakemake_server
from helpers.schema_values import other_by_type
from helpers.snakemake_runs import REPO, checkout, edit, ok, run_sh, run_sh_call
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
    dry = ok(snakemake_server.run_sh(root, work, "files", "edited.yaml", "-n", *args))
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
        # every job has its log
        assert (study / "logs" / f"study_config.{name}.log").exists() and (study / "logs" / f"prepare_test.{name}.log").exists()
        assert (study / "tests" / name / "alibi" / "seed1" / "test_model.log").exists()
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
    proc = snakemake_server.run_sh(root, work, "files", "edited.yaml", "-n")
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
    # a row: its model's jobs and every report (its rows); a row removed: the reports only
    row = planned(root, work, edited(models={**STUDY["models"], "encodings": ["sinusoidal", "alibi", "rope"]}))
    assert row == {"train": 1, "average": 1, "label": 1, "test_model": 2, "decode": 3, "detok": 3, "score": 3,
                   "study_config": 3, "length_report": 3, "results": 1, "all": 1}
    assert planned(root, work, edited(models={**STUDY["models"], "encodings": ["sinusoidal"]})) == {
        "study_config": 3, "length_report": 3, "results": 1, "all": 1}


def downstream(root, work):
    """{rule: the rules that read its outputs, directly or through others} of the finished study,
    from Snakemake's rule graph."""
    dot = ok(snakemake_server.run_sh(root, work, "files", "study.yaml", "--rulegraph"))
    names = dict(re.findall(r'^\s*(\d+)\[label = "(\w+)"', dot, re.M))
    after = {name: set() for name in names.values()}
    for a, b in re.findall(r"^\s*(\d+) -> (\d+)$", dot, re.M):
        after[names[a]].add(names[b])
    closed = {}
    for rule in after:
        seen, todo = set(), [rule]
        while todo:
            for b in after[todo.pop()] - seen:
                seen.add(b)
                todo.append(b)
        closed[rule] = seen
    return closed


def other(path, node, current, work):
    """A valid value of ``path`` other than ``current`` for this study."""
    if path == "corpus.train":
        write_plain_pairs(str(work / "train2"), 150, "de", "en", seed=5)
        return {"src": "train2.de", "tgt": "train2.en"}
    if path == "corpus.valid":
        write_plain_pairs(str(work / "valid"), 5, "de", "en", seed=6)
        return {"src": "valid.de", "tgt": "valid.en"}
    special = {"corpus.test": {**STUDY["corpus"]["test"], "more": {"src": "news.de", "tgt": "news.en"}},
               "corpus.pair": "de-fr", "models.encodings": ["sinusoidal", "alibi", "rope"],
               "models.baseline": "alibi", "train.encoding_flags": {"alibi": ["--alibi-encoder", "split"]},
               "train.model_flags": ["--encoder-layers", 3], "train.flags": ["--clip-norm", 0.5],
               "train.batch_target": 2 * STUDY["train"]["max_tokens"],
               "distillation.teacher": "alibi", "distillation.students": ["sinusoidal"],
               "distillation.relations": "qq,kk", "warm_start.start": "sinusoidal", "corpus.clean.ratio": 2}
    if path in special:
        return special[path]
    return other_by_type(path, node, current)


def test_every_field_edited_plans_the_rules_it_feeds_and_what_follows_or_is_refused_in_one_line(finished):
    """The edit walk through run.sh: each field of the schema (read from it, so that a new one cannot
    slip past) given another value in the finished study. The dry run refuses the edit in one line,
    or plans rules that settings.FEEDS declares for the field and the rules after them, nothing
    else; it plans nothing only for a field on settings.NO_JOB (which may still feed a report).
    (FEEDS holds what a field feeds in any study: this one has some of those rules.)"""
    root, work, *_ = finished
    after = downstream(root, work)
    data = next(p for p in (work / "data").iterdir())
    # the corpus's directory named: a preparation setting edited is then refused (another study's
    # preparation in the same directory), not prepared again in a directory of its own
    config = json.loads(json.dumps(STUDY))
    config["corpus"]["data"] = os.path.relpath(data, work)
    assert planned(root, work, config) == {}
    with open(os.path.join(REPO, "recipes", "conf", "files.yaml")) as f:
        defaults = yaml.safe_load(f)
    wrong, refusals = [], {}
    for path, node in settings.fields():
        if path in ("corpus.name", "train.recipe"):  # another corpus or recipe: another study
            continue
        current = settings.value_at(config, path)
        if current is settings.ABSENT:
            current = settings.value_at(defaults, path)
        if current is settings.ABSENT:
            current = node.get("default")
        given = json.loads(json.dumps(config))
        *sections, name = path.split(".")
        where = given
        for section in sections:
            where = where.setdefault(section, {})
        where[name] = other(path, node, current, work)
        write_study(work / "edited.yaml", given)
        proc = snakemake_server.run_sh(root, work, "files", "edited.yaml", "-n")
        text = proc.stdout + proc.stderr
        if proc.returncode:
            refusals[path] = [line for line in text.splitlines() if "refused" in line]
            continue
        if path == "evaluate.beam":  # the reason names the flag, old and new, not the command
            assert "before: '--beam 1' now: '--beam 2' " in text, [l for l in text.splitlines() if 'reason' in l]
        table = text.split("Job stats:")[1].split("Reasons")[0] if "Job stats:" in text else ""
        rules = set(re.findall(r"^(\w+)\s+\d+$", table, re.M)) - {"total", "all"}
        first = {rule for rule in rules if not any(rule in after[other] for other in rules)}
        if not rules:
            problem = None if path in settings.NO_JOB else "plans nothing: accepted and ignored (not on settings.NO_JOB)"
        elif not first <= settings.FEEDS[path]:
            problem = f"plans {sorted(first - settings.FEEDS[path])}, not declared in settings.FEEDS"
        elif rules != first | set().union(*(after[rule] for rule in first)) - {"all"}:
            problem = f"plans {sorted(rules)}, not what follows {sorted(first)}"
        else:
            problem = None
        if problem:
            wrong.append(f"{path} -> {where[name]!r}: {problem}")
    assert not wrong, "\n".join(wrong)
    assert {path: lines for path, lines in refusals.items() if len(lines) != 1} == {}
    # among the refusals: a setting no row uses
    assert "configuration refused: train.position_bias_scale 0.25 (edited.yaml): no row of models.encodings " \
           "(alibi, sinusoidal) takes a bias scale (" in refusals["train.position_bias_scale"][0]


def test_a_files_studys_mistakes_are_refused_by_its_dry_run_in_one_line(tmp_path):
    """What the first job would have found, in the dry run through run.sh: a sacrebleu test set
    sacrebleu does not know (or not for the pair), raw sacrebleu text beside text given tokenized,
    files of a pair that differ in lines, a pair of one name."""
    cases = [{"test": {"wmt": {"sacrebleu": "wmt14x"}}}, {"pair": "de-fr", "test": {"wmt": {"sacrebleu": "wmt14"}}},
             {"tokenize": "none", "test": {"wmt": {"sacrebleu": "wmt14"}}},
             {"test": {"news": {"src": "news.de", "tgt": "short.en"}}}, {"pair": "en-en"}]
    calls = []
    for n, corpus in enumerate(cases):  # each in a directory of its own: their dry runs share a process
        work = tmp_path / str(n)
        work.mkdir()
        write_plain_pairs(str(work / "train"), 20, "de", "en", seed=1)
        write_plain_pairs(str(work / "news"), 3, "de", "en", seed=2)
        with open(work / "short.en", "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines(work / "news.en")[:2]))
        study = json.loads(json.dumps(STUDY))
        study["corpus"].update(corpus)
        write_study(work / "study.yaml", study)
        calls.append(run_sh_call(REPO, work, "files", "study.yaml", "-n"))

    def refusal(proc):
        found = [line for line in (proc.stdout + proc.stderr).splitlines() if "configuration refused" in line]
        assert proc.returncode != 0 and len(found) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
        return found[0].split("configuration refused: ", 1)[1]

    wmt14x, de_fr, raw, short, en_en = (refusal(proc) for proc in snakemake_server.runs(calls))
    assert wmt14x == "corpus.test.wmt: sacrebleu has no test set wmt14x; did you mean wmt14 or wmt24 or wmt21?"
    assert de_fr == \
        "corpus.test.wmt: sacrebleu's wmt14 has no de-fr (it has cs-en, de-en, en-cs, en-de, en-fr, en-hi, en-ru, " \
        "fr-en, hi-en, ru-en)"
    assert raw.startswith("corpus.test.wmt {sacrebleu: wmt14} with corpus.tokenize none: sacrebleu's text is raw")
    assert short == "corpus.test.news: news.de has 3 lines, short.en 2: a pair is a line of each, and there must be one"
    assert en_en.startswith("corpus.pair en-en (study.yaml): the source and the target need two names")


def test_sacrebleu_offline_without_its_cache_says_where_the_cache_is(tmp_path):
    # a proxy on a closed loopback port: urlopen fails at once, nothing leaves the machine
    settings = {"src": "de", "tgt": "en", "splits": {"test": {"sacrebleu": "wmt14"}}}
    proc = subprocess.run([sys.executable, os.path.join(REPO, "recipes", "posenc_workflow", "prepare.py"), "gather",
                           "--data", str(tmp_path / "data"), "--settings", json.dumps(settings)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SACREBLEU": str(tmp_path / "empty"), "http_proxy": "http://127.0.0.1:9",
                               "https_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
                               "HTTPS_PROXY": "http://127.0.0.1:9"})
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"prepare.py gather: error: sacrebleu test set wmt14 de-en: not in sacrebleu's cache "
                                  f"({tmp_path / 'empty'}, $SACREBLEU) and not downloaded (")
    assert "`sacrebleu -t wmt14 -l de-en --echo src > /dev/null` where there is internet" in proc.stderr


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


def _gather(data, splits, src="de", tgt="en"):
    """prepare.py gather in DATA's parent folder (the files' paths as a study gives them)."""
    prepare = os.path.join(REPO, "recipes", "posenc_workflow", "prepare.py")
    return subprocess.run([sys.executable, prepare, "gather", "--data", str(data), "--settings",
                           json.dumps({"src": src, "tgt": tgt, "splits": splits})], capture_output=True,
                          cwd=os.path.dirname(data))


def test_gather_ends_every_line_in_a_newline_and_refuses_bytes_other_tools_split_or_cannot_read(tmp_path):
    # Windows line endings (and a last line without one): taken, each line ended by \n alone
    (tmp_path / "a.de").write_bytes(b"ein haus\r\nzwei katzen\r\ndrei")
    (tmp_path / "a.en").write_bytes(b"a house\ntwo cats\r\nthree")
    proc = _gather(tmp_path / "data", {"train": {"src": str(tmp_path / "a.de"), "tgt": str(tmp_path / "a.en")}})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "data" / "raw" / "train.de").read_bytes() == b"ein haus\nzwei katzen\ndrei\n"
    assert (tmp_path / "data" / "raw" / "train.en").read_bytes() == b"a house\ntwo cats\nthree\n"
    # a byte that is not UTF-8, a carriage return inside a line: one line naming the setting, the
    # file as given and the line; nothing written
    (tmp_path / "b.en").write_bytes(b"one\ntwo\nthree\n")
    for text, problem in ((b"eins\nzwei\ndrei caf\xe2x\n", "not UTF-8 at byte 9 of the line (0xe2: invalid continuation "
                                                         "byte): convert the file to UTF-8 (iconv -f ITS-ENCODING -t UTF-8)"),
                          (b"eins\nzwei\ndrei\rvier\n", "a carriage return (\\r) inside the line, where some tools split "
                                                       "lines and others do not (the pairs would shift): remove it (or, "
                                                       "where \\r ends lines, convert them: tr '\\r' '\\n')")):
        (tmp_path / "b.de").write_bytes(text)
        proc = _gather(tmp_path / "bad", {"test.news": {"src": "b.de", "tgt": "b.en"}})
        assert proc.returncode == 2 and proc.stderr.decode().splitlines() == [
            f"prepare.py gather: error: corpus.test.news.src b.de line 3: {problem}"]
        assert os.listdir(tmp_path / "bad" / "raw") == []


def test_a_carriage_return_inside_a_line_of_text_already_tokenized_is_refused_naming_the_file_and_line(tmp_path):
    """Python's text readers (the split of the validation pairs, fairseq-preprocess) end a line at a
    lone \\r, subword-nmt and wc -l do not: it failed later, on internal files, with line counts."""
    root = str(checkout(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    write_plain_pairs(str(work / "train"), 150, "de", "en", seed=1)
    write_plain_pairs(str(work / "news"), 5, "de", "en", seed=2, lengths=(3, 6))
    text = (work / "train.de").read_bytes().split(b"\n")
    text[41] += b" a\rb"
    (work / "train.de").write_bytes(b"\n".join(text))
    study = json.loads(json.dumps(STUDY))
    study["corpus"].update({"tokenize": "none", "test": {"news": {"src": "news.de", "tgt": "news.en"}}})
    del study["split"]
    write_study(work / "study.yaml", study)
    proc = run_sh(root, work, "files", "study.yaml", "-c1")
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "error:" in line]
    assert proc.returncode != 0 and errors == [
        "prepare.py gather: error: corpus.train.src train.de line 42: a carriage return (\\r) inside the line, where "
        "some tools split lines and others do not (the pairs would shift): remove it (or, where \\r ends lines, "
        "convert them: tr '\\r' '\\n')"]


def test_corpus_clean_sets_the_longest_side_and_the_ratio_kept_or_neither(tmp_path):
    """prepare.py segment as the segment rule runs it, on text already tokenized: few words, each
    one subword once BPE is learned, so that a side's subwords are its words."""
    data = tmp_path / "data"
    pairs = [("ab cd ef", "uv wx yz")] * 4 + [("ab cd", "uv wx yz uv"), ("ab cd ef ab cd ef", "uv wx yz uv wx yz"),
                                             ("", "uv wx")]
    for folder in ("tok", "raw"):
        (data / folder).mkdir(parents=True)
    for side, lang in enumerate(("de", "en")):
        (data / "tok" / f"train.{lang}").write_text("".join(p[side] + "\n" for p in pairs))
        for split in ("valid", "test.news"):
            for folder in ("tok", "raw"):
                (data / folder / f"{split}.{lang}").write_text(pairs[0][side] + "\n")
    prepare = os.path.join(REPO, "recipes", "posenc_workflow", "prepare.py")

    def kept(**clean):
        settings = {"style": "files", "src": "de", "tgt": "en", "tokenize": "none", "bpe": "subword-nmt",
                    "bpe_size": 10, "valid": "given", "valid_every": 100, "tests": ["test.news"], **clean}
        proc = subprocess.run([sys.executable, prepare, "segment", "--data", str(data), "--settings",
                               json.dumps(settings)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        log = [line for line in proc.stderr.splitlines() if line.startswith("| clean:")]
        return log, list(zip(lines(data / "train.de"), lines(data / "train.en")))

    # fairseq's rule (the shipped corpora's params: no ratio given): the pair of ratio 2 dropped
    log, train = kept(max_len=250)
    assert log == ["| clean: kept 5 of 7 pairs (1-250 tokens, ratio <= 1.5)"] and train == pairs[:4] + pairs[5:6]
    log, train = kept(max_len=5, ratio=None)
    assert log == ["| clean: kept 5 of 7 pairs (1-5 tokens, any ratio)"] and train == pairs[:5]
    log, train = kept(max_len=None, ratio=2)
    assert log == ["| clean: kept 6 of 7 pairs (1 or more tokens, ratio <= 2.0)"] and train == pairs[:6]
    # a side left empty is no pair, whatever corpus.clean says
    log, train = kept(max_len=None, ratio=None)
    assert log == ["| clean: kept 6 of 7 pairs (1 or more tokens, any ratio)"] and train == pairs[:6]


def test_corpus_clean_reaches_the_segment_rules_params_and_leaves_fairseqs_rule_as_it_was(tmp_path):
    from posenc_workflow import workflow as wf
    from posenc_workflow.corpus import Corpus
    from helpers.snakemake_runs import shipped

    def segment(*names, **sections):
        return json.loads(Corpus.of(wf.Study(shipped(*names, **sections), preflight=False)).segment_settings())

    # auto: the shipped corpora's params as before corpus.clean (another would prepare them again)
    assert segment("wmt14_en_de")["max_len"] == 250 and "ratio" not in segment("wmt14_en_de")
    assert segment("iwslt14_de_en")["max_len"] == 175 and "ratio" not in segment("iwslt14_de_en")
    assert {k: v for k, v in segment("iwslt14_de_en", corpus={"clean": {"max_len": None, "ratio": 2}}).items()
            if k in ("max_len", "ratio")} == {"max_len": None, "ratio": 2}
    files = {}
    for name in ("t.de", "t.en"):
        (tmp_path / name).write_text("a\n")
        files[name[-2:]] = str(tmp_path / name)
    corpus = {"pair": "de-en", "train": {"src": files["de"], "tgt": files["en"]},
              "test": {"t": {"src": files["de"], "tgt": files["en"]}}}
    mine = segment("files", corpus={**corpus, "clean": {"ratio": None}})
    assert mine["max_len"] == 250 and mine["ratio"] is None
    assert segment("files", corpus={**corpus, "clean": {"max_len": 250, "ratio": 1.5}}) == segment("files", corpus=corpus)
    # a files corpus's directory is named by its cleaning too, unless fairseq's (named as before)
    defaults = {"bpe": "subword-nmt", "tokenize": "moses", "bpe_size": 10000}
    assert files_data_dir({**corpus, **defaults, "clean": {"max_len": "auto", "ratio": 1.5}}, "de", "en") == \
        files_data_dir({**corpus, **defaults}, "de", "en") != \
        files_data_dir({**corpus, **defaults, "clean": {"max_len": "auto", "ratio": None}}, "de", "en")
    # the demo's generated pair is not cleaned: refused in one line
    with pytest.raises(wf.ConfigError) as error:
        segment("demo", corpus={"clean": {"max_len": 100}})
    assert str(error.value) == "corpus.clean.max_len 100: corpus.name toy is the demo's generated pair, which is not " \
                               "cleaned"


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

    def plan(proc):
        return [line for line in ok(proc).splitlines() if line.startswith("| plan") or line.startswith("|   ")]

    # before the corpus is prepared: 40 updates of ~3,125 target tokens (4,096 padded) a model, at the
    # measured 70 GFLOP/s of a thread over 6 x the IWSLT model's parameters with 60 embedding rows
    dry, one = (plan(proc) for proc in snakemake_server.runs(
        [run_sh_call(root, work, "files", "study.yaml", "-n", "--cores", cores, stub=True) for cores in ("2", "1")]))
    speed = "on the CPU at 367 target tokens a second (auto: 1 thread(s) at 70 GFLOP/s, as measured on an x86 " \
            "server, over 6 x 31,574,016 parameters; set train.tokens_per_second from fairseq's wps in train.log " \
            "on your CPU) (estimated)"
    assert dry.count(f"|   time: 6 min {speed}") == 2
    assert dry[-1] == "| plan total: 2 model(s), 2 to train, 80 updates, about 3.0 GB of checkpoints, 11 min on " \
        "the CPU, 2 at a time (--cores 2, 1 thread(s) each): about 6 min from the first start (estimated before " \
        "the corpus is prepared)"
    assert one[-1].endswith(", 11 min on the CPU, one model after another (--cores 1, 1 thread(s) "
                                             "each) (estimated before the corpus is prepared)")

    # one model trained (the corpus prepared): the other alone to train
    ok(run_sh(root, work, "files", "study.yaml", "-c1", "study/models/sinusoidal/seed1/trained.json", stub=True))
    data = next((work / "data").iterdir())
    dry = plan(run_sh(root, work, "files", "study.yaml", "-n", "--cores", "2", stub=True))
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
