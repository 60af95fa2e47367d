"""Every field of recipes/conf/schema.yaml (read from the schema, so that a new field cannot slip
past), for every train.recipe and every corpus.name of the schema's enums: given another value,
it changes the params of some job of the study, or the study is refused in one line, or the field
is on recipes/posenc_workflow/settings.py's NO_JOB list with its reason (and then changes none). A
setting accepted and ignored fails here."""
import copy
import json
import os
import re

import pytest
import snakemake.utils
from snakemake.utils import validate

from posenc_workflow import settings, workflow as wf
from posenc_workflow.corpus import Corpus
from helpers.schema_values import other_by_type

SCHEMA = settings.SCHEMA
ENUMS = {path: node["enum"] for path, node in settings.fields() if "enum" in node}
# a study with every section on: rows that take the study's flags (t5: the bias scale, alibi:
# encoding_flags, floater: FLOATER's warm start), a split, distilled students (the toy recipe
# refuses those)
BASE = {"out": "study",
        "models": {"encodings": ["sinusoidal", "t5", "alibi", "floater"]},
        "split": {},
        "warm_start": {"enabled": True},
        "distillation": {"teacher": "sinusoidal"}}
# what a corpus kind needs besides its name (none of the shipped ones needs anything): a files
# corpus's pair and files (written by the fixture below), and other files for its walk
CORPUS_EXTRA = {}
OTHER_BY_CORPUS = {}
# what the walk's rules feed, by field (test_every_field_feeds_exactly_the_rules_it_declares); the
# settings that make a field refused by the walk's studies used, for that test
FED = {}
ENABLING = {"train.distributed_port": {"train.nodes": 2}}
# values where the schema's type alone does not give a meaningful other one: rows, row lists
OTHER = {"models.encodings": ["sinusoidal", "t5", "alibi", "floater", "rope"], "models.baseline": "alibi",
         "warm_start.start": "sinusoidal", "distillation.teacher": "alibi",
         "distillation.students": ["sinusoidal", "alibi"], "distillation.relations": "qq,kk",
         "train.encoding_flags": {"alibi": ["--alibi-encoder", "split"]}, "train.model_flags": ["--encoder-layers", 3],
         "train.flags": ["--log-interval", 7], "corpus.valid": "newstest2012", "corpus.pair": "x-y",
         "corpus.clean.ratio": 2}


@pytest.fixture(scope="module", autouse=True)
def files_corpus(tmp_path_factory):
    """Plain text files for corpus.name files: a training pair, a second one (another value of
    corpus.train), a validation pair and two test sets."""
    root = tmp_path_factory.mktemp("files")

    def pair(name):
        for side, text in (("src", "ein haus\n"), ("tgt", "a house\n")):
            (root / f"{name}.{side}").write_text(text * 3)
        return {side: str(root / f"{name}.{side}") for side in ("src", "tgt")}

    # corpus.data set: its default is named by the preparation settings, which would hide a setting
    # that no step's params hold behind the new directory
    CORPUS_EXTRA["files"] = {"pair": "de-en", "train": pair("train"), "test": {"news": pair("news")},
                             "data": str(root / "prepared")}
    OTHER.update({"corpus.train": pair("train2"), "corpus.test": {"news": pair("news"), "ted": pair("ted")}})
    OTHER_BY_CORPUS["files"] = {"corpus.valid": pair("valid"), "corpus.pair": "de-fr"}
    yield


@pytest.fixture(scope="module", autouse=True)
def schema_read_once():
    """snakemake.utils.validate reads the schema file at each call (0.4 s): here once, each call
    its own copy, for the thousand configurations of the walk."""
    read, copies = snakemake.utils._load_configfile, {}

    def once(source, filetype="Config"):
        key = (getattr(source, "name", source), filetype)
        if key not in copies:
            copies[key] = read(source, filetype=filetype)
        return copy.deepcopy(copies[key])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(snakemake.utils, "_load_configfile", once)
        yield


def other_value(path, node, current, corpus):
    """A valid value of ``path`` other than ``current``, from its schema, for the corpus kind ``corpus``."""
    if path in OTHER_BY_CORPUS.get(corpus, {}):
        return OTHER_BY_CORPUS[corpus][path]
    if path in OTHER:
        return OTHER[path]
    return other_by_type(path, node, current)


def put(config, path, value):
    *sections, name = path.split(".")
    for section in sections:
        config = config.setdefault(section, {})
    config[name] = value


def study(given):
    """The study of the configuration ``given`` (the schema's defaults filled in, as recipes/Snakefile does)."""
    config = copy.deepcopy(given)
    validate(config, SCHEMA)
    return wf.Study(config, preflight=False, given=given)


def job_params(study):
    """The params (and settings-derived inputs) of every job of the study, by rule, by the calls
    recipes/rules' params make: {(rule, job...): params}."""
    from posenc_workflow import retention
    from posenc_workflow.workflow import generate_command, segmentation

    jobs, corpus = {}, Corpus.of(study)
    if study.facts["style"] == "toy":
        jobs["toy_corpus",] = (json.dumps(study.config["corpus"]["toy"], sort_keys=True), study.data)
    else:
        if study.facts["style"] == "files":
            jobs["gather",] = (corpus.own_files(), corpus.gather_settings(), study.data)
            for test in corpus.tests:
                jobs["prepare_test", test.name] = (corpus.test_files(test.name), corpus.test_settings(test.name),
                                                   study.out)
        else:
            jobs["extract",] = (corpus.extract_command(), corpus.sources, study.data)
        jobs["tokenize",] = (corpus.tokenize_settings(), study.data)
        jobs["segment",] = (corpus.segment_settings(), study.data)
        jobs["binarize",] = (corpus.binarize_settings(), study.data)
    if study.split:
        jobs["length_split",] = (json.dumps(study.split, sort_keys=True), corpus.settings_json(), study.out)
    for model in study.models:
        jobs["train", model.key] = (retention.split(study.command(model))[0], model.start, model.teacher,
                                    study.checkpoints_root())
    e = study.evaluate
    for model in study.evaluated():
        averaged = os.path.join(study.model_dir(model), "averaged.pt")
        jobs["average", model.key] = (study.average(model), e["checkpoints"])
        for test in study.test_sets():
            if test.where != "models":  # a named test set: the model's files beside its decodes
                jobs["test_model", model.key, test.name] = (study.out,)
            jobs["decode", model.key, test.name] = (generate_command(study, averaged, test), e["lenpen_form"],
                                                    e["lenpen"], e["beam"])
            # the score lines' label (recipes/rules/evaluate.smk, score's `what`)
            what = (f"{study.corpus_name} {study.pair} seed={model.seed} arch={study.arch} {test.name} "
                    f"beam={e['beam']} lenpen={e['lenpen']} lenpen_form={e['lenpen_form']} avg={study.average(model)}")
            jobs["score", model.key, test.name] = (segmentation(study), study.tgt, e["lowercase"], what,
                                                   study.test_reference(test))
    for test in study.test_sets():
        jobs["study_config", test.name] = study.report_config(None if test.where == "models" else test.name)
    return jobs


def fed(before, after):
    """The rules of the jobs whose params differ between two job_params."""
    return {key[0] for key in set(before) | set(after) if before.get(key) != after.get(key)}


@pytest.mark.parametrize("recipe", ENUMS["train.recipe"])
def test_every_field_reaches_a_job_or_is_refused_or_reaches_none_on_purpose(recipe):
    assert set(settings.NO_JOB) <= {path for path, _ in settings.fields()}, "NO_JOB names a field the schema lacks"
    ignored, stale = [], []
    for name in ENUMS["corpus.name"]:
        base = copy.deepcopy(BASE)
        base["corpus"] = {"name": name, **CORPUS_EXTRA.get(name, {})}
        base["train"] = {"recipe": recipe}
        if recipe == "toy":
            del base["distillation"]  # refused there: walked as given below
        reference = study(base)
        before = job_params(reference)
        for path, node in settings.fields():
            if path in ("corpus.name", "train.recipe"):
                continue
            given = copy.deepcopy(base)
            section = path.split(".")[0]
            if section in BASE and section not in given:  # distillation under toy: the whole section, refused
                given[section] = copy.deepcopy(BASE[section])
            current = settings.value_at(reference.config, path)
            put(given, path, other_value(path, node, node.get("default") if current is settings.ABSENT else current,
                                          name))
            try:
                after = job_params(study(given))
            except wf.ConfigError as refusal:
                assert "\n" not in str(refusal) and str(refusal), (path, str(refusal))
                continue
            # the report's own record (study_config) aside: what makes a model, a decode or a score
            models = [{k: v for k, v in jobs.items() if k[0] != "study_config"} for jobs in (before, after)]
            if (models[0] == models[1]) != (path in settings.NO_JOB):
                (stale if path in settings.NO_JOB else ignored).append(f"{name}: {path}")
            FED.setdefault(path, set()).update(fed(before, after))
    assert not ignored, f"train.recipe {recipe}: accepted and ignored (not refused, not in settings.NO_JOB): {ignored}"
    assert not stale, f"train.recipe {recipe}: on settings.NO_JOB but changes a job's params: {stale}"


def test_the_walk_covers_the_corpora_and_recipes_of_the_schema():
    """What the walk takes from the schema: its enums, and sections that are fields of their own."""
    assert {"toy", "wmt14_en_de", "files"} <= set(ENUMS["corpus.name"]) and set(ENUMS["train.recipe"]) == set(wf.RECIPE_AUTO)
    paths = [path for path, _ in settings.fields()]
    assert "train.weight_decay" in paths and "corpus.toy.train_size" in paths and "train.encoding_flags" in paths
    assert "corpus.toy" not in paths and "warm_start.vanilla.max_epoch" in paths
    assert "corpus.train" in paths and "corpus.valid" in paths and "corpus.train.src" not in paths


def test_a_setting_the_study_would_not_use_is_refused_in_one_line_when_given():
    """What the walk counts as refused, one case each: given values, not the schema's defaults."""
    demo = {"corpus": {"name": "toy"}, "models": {"encodings": ["sinusoidal"], "arch": "tiny"},
            "train": {"recipe": "toy", "device": "cpu", "lr": 0.003, "max_update": 8},
            "evaluate": {"checkpoints": "epoch", "average": 2}}

    def refused(**changes):
        given = copy.deepcopy(demo)
        for path, value in changes.items():
            put(given, path.replace("__", "."), value)
        with pytest.raises(wf.ConfigError) as error:
            study(given)
        return str(error.value)

    study(demo)  # accepted: the defaults the toy recipe and the CPU do not use are not refused
    assert refused(train__batch_target=4096).startswith("train.batch_target 4096: train.recipe toy's batch is train.max_tokens")
    assert refused(train__precision="bf16") == 'train.precision "bf16": train.device cpu trains and decodes in fp32'
    study({**demo, "train": {**demo["train"], "precision": "fp32"}})  # what the CPU runs: accepted
    assert refused(train__gpus_per_node=2) == "train.gpus_per_node 2: train.device cpu trains in one process"
    assert refused(corpus__bpe="sentencepiece").startswith('corpus.bpe "sentencepiece": corpus.name toy is the demo')
    assert refused(corpus__mirror="http://m") == 'corpus.mirror "http://m": corpus.name toy reads no archive'
    assert refused(warm_start__lr_scale=0.3).startswith("warm_start.lr_scale 0.3: warm_start.enabled is not set")
    study({**demo, "warm_start": {"enabled": False, "lr_scale": 0.3}})  # kept for later, as the demo's
    assert refused(models__arch="big").startswith("models.arch big: train.recipe toy trains transformer_posenc")



def test_every_field_feeds_exactly_the_rules_it_declares():
    """settings.FEEDS against what the walk above derived from the jobs' params (over every corpus
    and recipe): a field undeclared, a rule too many or too few, or a rule the workflow lacks fails."""
    assert FED, "runs after the walk (pytest's file order)"
    # the fields the walk's studies refuse everywhere: walked where they are used
    for path, enabling in ENABLING.items():
        base = copy.deepcopy(BASE)
        base["corpus"] = {"name": "wmt14_en_de"}
        for where, value in enabling.items():
            put(base, where, value)
        given = copy.deepcopy(base)
        put(given, path, other_value(path, dict(settings.fields())[path], settings.default(path), "wmt14_en_de"))
        FED[path] = fed(job_params(study(base)), job_params(study(given)))
    rules = set()
    for name in os.listdir(os.path.join(wf.ROOT, "recipes", "rules")):
        with open(os.path.join(wf.ROOT, "recipes", "rules", name), encoding="utf-8") as f:
            rules.update(re.findall(r"^\s*rule (\w+):", f.read(), re.M))
    walked = {path for path, _ in settings.fields()} - {"corpus.name", "train.recipe"}
    assert set(settings.FEEDS) == walked | {"corpus.name", "train.recipe"} & set(settings.FEEDS)
    wrong = {path: (sorted(settings.FEEDS.get(path, ())), sorted(FED[path])) for path in walked
             if settings.FEEDS.get(path) != FED[path]}
    assert not wrong, f"field: (declared, derived): {wrong}"
    assert set().union(*settings.FEEDS.values()) <= rules
    # a field that makes no model, decode or score feeds the report's record at most
    assert all(settings.FEEDS[path] <= {"study_config"} for path in settings.NO_JOB)


def test_the_schema_and_every_shipped_configuration_read_as_pyyamls_own_parser_reads_them():
    """settings.YAML_LOADER (libyaml's, where PyYAML has it) reads what yaml.safe_load reads."""
    import yaml

    conf = os.path.join(settings.ROOT, "recipes", "conf")
    paths = sorted(os.path.join(conf, name) for name in os.listdir(conf) if name.endswith(".yaml"))
    assert len(paths) > 10 and settings.SCHEMA in paths
    for path in paths:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        assert yaml.load(text, Loader=settings.YAML_LOADER) == yaml.safe_load(text), path
