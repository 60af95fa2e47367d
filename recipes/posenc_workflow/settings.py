"""Where each setting of a study goes: every field of recipes/conf/schema.yaml reaches the commands
of the study's jobs (fairseq-train's and fairseq-generate's arguments, the preparation's settings:
the params Snakemake runs a job again for), or reaches no model and no job on purpose
(:data:`NO_JOB`, each with its reason), or is refused in one line by :func:`check` where the
study's recipe, corpus or device would not use it and the user gave it a value other than its
default (the user: the study files and --config, not the corpus's own recipes/conf/CORPUS.yaml, whose
values are that corpus's defaults: :func:`given`; a refusal names the file, :func:`naming_files`).
tests/workflow/test_settings_walk.py walks every field of the schema for every recipe and corpus.
"""
import copy
import difflib
import functools
import json
import os
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import yaml

from posenc_workflow.base import ROOT, VANILLA, ConfigError
from posenc_workflow.rows import parse_rows

SCHEMA = os.path.join(ROOT, "recipes", "conf", "schema.yaml")
_FETCH = ("how the archives are fetched and checked, not what they hold: the download and extract commands "
          "take it, not their params, so that another value prepares nothing again")
_REPORT = ("how the report shows the scores: the report reads it from the study's record (study.json) and "
           "is made again; no model, decode or score changes")
#: the fields that reach no model and no job's params on purpose, with why
NO_JOB = {
    "corpus.download": _FETCH, "corpus.download_timeout": _FETCH, "corpus.mirror": _FETCH,
    "corpus.verify_checksums": _FETCH,
    "corpus.workers": "processes of a preparation job (its threads): the same corpus",
    "train.threads": "CPU threads of a job (OMP_NUM_THREADS): the same computation",
    **{f"cluster.{k}": "where SLURM runs a job (its rule's resources: recipes/posenc_workflow/cluster.py), not what "
                       "it computes" for k in ("account", "gpu_partition", "cpu_partition", "train_minutes",
                                               "cpus_per_gpu")},
    "train.tokens_per_second": "the speed the dry run's plan estimates the time from; no job reads it",
    "models.baseline": _REPORT, "report.title": _REPORT, "report.unit": _REPORT, "report.bins": _REPORT,
}
#: the rules each field feeds: the jobs whose params (or settings-derived inputs) it enters, in
#: every corpus and recipe together; editing the field redoes those jobs and what follows from their
#: outputs, nothing else. tests/workflow/test_settings_walk.py derives the same from the jobs'
#: params and fails on any difference, a new field undeclared included
FEEDS = {k: frozenset(v.split()) for k, v in {
    "cluster.account": "", "cluster.cpu_partition": "", "cluster.cpus_per_gpu": "", "cluster.gpu_partition": "",
    "cluster.train_minutes": "", "corpus.archives": "extract", "corpus.bpe": "length_split prepare_test score segment",
    "corpus.bpe_size": "segment", "corpus.clean.max_len": "segment",
    "corpus.clean.ratio": "segment", "corpus.data": "binarize extract gather score segment tokenize toy_corpus",
    "corpus.download": "", "corpus.download_timeout": "", "corpus.mirror": "",
    "corpus.pair": "binarize extract gather length_split prepare_test score segment tokenize",
    "corpus.sources": "extract", "corpus.test": "decode prepare_test score study_config test_model",
    "corpus.tokenize": "binarize gather length_split prepare_test segment tokenize",
    "corpus.toy.long_max_len": "study_config toy_corpus", "corpus.toy.pair": "study_config toy_corpus",
    "corpus.toy.seed": "study_config toy_corpus", "corpus.toy.test_size": "study_config toy_corpus",
    "corpus.toy.train_max_len": "study_config toy_corpus", "corpus.toy.train_size": "study_config toy_corpus",
    "corpus.train": "gather", "corpus.valid": "gather segment tokenize", "corpus.verify_checksums": "",
    "corpus.workers": "", "distillation.arch": "train", "distillation.average": "average score",
    "distillation.dropout": "train", "distillation.lr": "train", "distillation.max_epoch": "train",
    "distillation.max_update": "train", "distillation.relation_heads": "train",
    "distillation.relation_weight": "train", "distillation.relations": "train",
    "distillation.student_flags": "train", "distillation.students": "average decode score test_model train",
    "distillation.teacher": "train", "evaluate.average": "average score", "evaluate.beam": "decode score",
    "evaluate.checkpoints": "average train", "evaluate.lenpen": "decode score",
    "evaluate.lenpen_form": "decode score", "evaluate.lowercase": "score", "evaluate.max_tokens": "decode",
    "models.arch": "average score study_config train", "models.baseline": "study_config",
    "models.encodings": "average decode score study_config test_model train",
    "models.seeds": "average decode score study_config test_model train",
    "out": "decode length_split prepare_test score study_config test_model toy_corpus train",
    "report.bins": "study_config", "report.title": "study_config", "report.unit": "study_config",
    "split.bins": "length_split study_config", "split.train_below": "decode length_split score study_config",
    "split.unit": "decode length_split score study_config", "train.adam_eps": "train",
    "train.batch_target": "train", "train.device": "decode train", "train.distributed_port": "train",
    "train.dropout": "train", "train.encoding_flags": "study_config train", "train.eval_bleu": "train",
    "train.flags": "train", "train.gpus_per_node": "train", "train.large_batch": "train",
    "train.lr": "study_config train", "train.max_epoch": "train", "train.max_tokens": "study_config train",
    "train.max_update": "study_config train", "train.model_flags": "train", "train.nodes": "train",
    "train.position_bias_scale": "study_config train", "train.precision": "decode train",
    "train.save_interval_updates": "train", "train.share_embeddings": "train", "train.threads": "study_config",
    "train.tokens_per_second": "", "train.update_freq": "train", "train.warmup_init_lr": "train",
    "train.warmup_updates": "train", "train.weight_decay": "train",
    "warm_start.average": "average score study_config",
    "warm_start.control": "average decode score study_config test_model train",
    "warm_start.enabled": "average decode score study_config test_model train",
    "warm_start.lr_scale": "study_config train",
    "warm_start.second.max_epoch": "study_config train", "warm_start.second.max_update": "study_config train",
    "warm_start.start": "study_config train", "warm_start.vanilla.max_epoch": "study_config train",
    "warm_start.vanilla.max_update": "study_config train",
}.items()}
ABSENT = object()
# libyaml's parser where PyYAML was built with it: the schema took a tenth of every dry run
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=None)
def schema() -> dict:
    with open(SCHEMA, encoding="utf-8") as f:
        return yaml.load(f, Loader=YAML_LOADER)


_JSON_TYPES = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
               "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
               "boolean": lambda v: isinstance(v, bool), "null": lambda v: v is None,
               "string": lambda v: isinstance(v, str), "array": lambda v: isinstance(v, list),
               "object": lambda v: isinstance(v, dict)}


def coerce(value, schema: dict):
    """``value`` with every string the schema wants as another type read as YAML. Snakemake's
    ``--config KEY=VALUE`` reads a nested VALUE with YAML's BaseLoader, every leaf a string
    (``'distillation={"relation_heads": 32}'`` gives ``'32'``, ``true`` gives ``'true'``): a string
    leaf becomes what YAML reads it as where that is one of the schema's other types or enum values
    there; a field of strings only keeps it, as does one whose string means itself (``auto``)."""
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        return {k: coerce(v, properties.get(k, {})) for k, v in value.items()}
    if isinstance(value, list):
        return [coerce(v, schema.get("items", {})) for v in value]
    if not isinstance(value, str):
        return value
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    others = [t for t in types if t != "string"]
    if not (others or "enum" in schema) or value in schema.get("enum", []):
        return value
    try:
        read = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    if not isinstance(read, str) and (any(_JSON_TYPES[t](read) for t in others) or read in schema.get("enum", [])):
        return read
    return value


def fields(node: Optional[dict] = None, prefix: str = "") -> Iterator[Tuple[str, dict]]:
    """(path, schema) of every field of the schema: the leaves, and the objects that are values
    (train.encoding_flags, a files corpus's corpus.train: a type besides object, or no properties);
    a section (type object, with properties) is its fields."""
    node = schema() if node is None else node
    for name, sub in node.get("properties", {}).items():
        path = f"{prefix}{name}"
        if "properties" in sub and sub.get("type", "object") == "object":
            yield from fields(sub, path + ".")
        else:
            yield path, sub


def default(path: str):
    """The schema's default of ``path`` (``ABSENT`` where it has none)."""
    node = schema()
    for name in path.split("."):
        node = node["properties"][name]
    return node.get("default", ABSENT)


def value_at(config: Optional[dict], path: str):
    for name in path.split("."):
        if not isinstance(config, dict) or name not in config:
            return ABSENT
        config = config[name]
    return config


def changed(given: dict, prefix: str) -> List[Tuple[str, object]]:
    """(path, value) of every field at or under ``prefix`` that ``given`` sets to other than its default."""
    out = []
    for path, _ in fields():
        if path == prefix or path.startswith(prefix + "."):
            value = value_at(given, path)
            if value is not ABSENT and value != default(path):
                out.append((path, value))
    return out


def _refusals(study, given: dict) -> Iterator[Tuple[List[str], str]]:
    """(fields, why) of the settings the study would not use: refused where given otherwise than
    their defaults."""
    t, corpus = study.train, study.config["corpus"]
    if t["recipe"] == "toy":
        yield ["train.batch_target", "train.large_batch"], \
            "train.recipe toy's batch is train.max_tokens tokens, update_freq batches an update: the scaling_nmt " \
            "recipe's setting"
        yield ["evaluate.max_tokens"], "train.recipe toy decodes batches of 64 sentences"
        yield ["distillation"], "train.recipe toy trains no students: distillation is the scaling_nmt recipe's"
    elif t["max_tokens"] != "auto" and t["update_freq"] != "auto":
        yield ["train.batch_target"], "train.max_tokens and train.update_freq are both set: nothing is chosen for it"
    if t["device"] == "cpu":
        if t["precision"] != "fp32":
            yield ["train.precision"], "train.device cpu trains and decodes in fp32"
        yield ["train.nodes", "train.gpus_per_node"], "train.device cpu trains in one process"
    if int(t["nodes"]) == 1:
        yield ["train.distributed_port"], "only a training of several nodes (train.nodes > 1) listens on it"
    if study.facts["style"] not in ("wmt", "iwslt"):
        yield [f"corpus.{name}" for name in ("sources", "archives", "download", "download_timeout", "mirror",
                                             "verify_checksums")], f"corpus.name {corpus['name']} reads no archive"
    if study.facts["style"] != "files":
        yield ["corpus.train", "corpus.test", "corpus.tokenize"], \
            f"your own files are read (and tokenized or not) with corpus.name files, not {corpus['name']}"
    if study.facts["style"] == "toy":
        yield [f"corpus.{name}" for name in ("pair", "bpe", "bpe_size", "valid")], \
            "corpus.name toy is the demo's generated pair (corpus.toy): src-tgt, whole words, its own valid set"
    else:
        yield ["corpus.toy"], f"corpus.toy is the demo's generated pair, not corpus.name {corpus['name']}"
    # the plugin (torch) only when a study is checked: the workflow's light steps import this module
    from fairseq_posenc.positions import POSITION_ENCODINGS
    from fairseq_posenc.positions.bias_scale import uses_bias_scale

    encodings = sorted({row.encoding for row in study.rows})
    if not any(uses_bias_scale(POSITION_ENCODINGS[e]) for e in encodings):
        takers = ", ".join(name for name, scheme in POSITION_ENCODINGS.items() if uses_bias_scale(scheme))
        yield ["train.position_bias_scale"], \
            f"no row of models.encodings ({', '.join(encodings)}) takes a bias scale ({takers} do)"
    warm = study.warm
    if not warm.get("enabled") and value_at(given, "warm_start.enabled") is ABSENT:
        # an explicit enabled: false keeps them for later (the demo's, for scripts/demo.py --warm-start)
        yield [f"warm_start.{name}" for name in schema()["properties"]["warm_start"]["properties"] if name != "enabled"], \
            "warm_start.enabled is not set: set it true to warm-start the floater and rnn rows (false keeps " \
            "these settings for later)"
    elif warm.get("start", VANILLA) != VANILLA:
        yield ["warm_start.vanilla"], f"warm_start.start is the row {warm['start']}: no {VANILLA} stage trains"


def check(study, given: Optional[dict]) -> None:
    """Refuse, in one line, what the study cannot run: a model size the recipe has not, and (with
    ``given``, the configuration before the schema's defaults) a setting given that it would not use."""
    from fairseq_posenc.models.from_flags import MODEL_SIZES  # the plugin: torch, fairseq (seconds)

    if study.train["recipe"] == "toy" and study.arch not in MODEL_SIZES:
        raise ConfigError(f"models.arch {study.arch}: train.recipe toy trains transformer_posenc at the sizes "
                          f"{', '.join(MODEL_SIZES)} (scaling_nmt trains fairseq's {study.arch})")
    if given is None:
        return
    for paths, why in _refusals(study, given):
        for prefix in paths:
            for path, value in changed(given, prefix):
                raise ConfigError(f"{path} {json.dumps(value)}: {why}")


def schema_errors(config: dict) -> List[str]:
    """One line per error of ``config`` against the schema: the field's path and what it allows (a
    key not in the schema: the closest key, or the keys of its section), never the schema itself."""
    from jsonschema import Draft202012Validator  # its import takes a while: where a configuration is checked

    lines = []
    for error in sorted(Draft202012Validator(schema()).iter_errors(config), key=lambda e: list(map(str, e.path))):
        path = ".".join(map(str, error.absolute_path))
        if error.validator == "additionalProperties":
            allowed = list(error.schema.get("properties", {}))
            for key in sorted(set(error.instance) - set(allowed)):
                close = difflib.get_close_matches(key, allowed, n=1)
                where = f"{path}.{key}" if path else key
                hint = f"did you mean {close[0]}?" if close else f"choose among {', '.join(allowed)}"
                lines.append(f"{where}: not a setting{' of ' + path if path else ''}; {hint}")
        elif error.validator == "enum":
            lines.append(f"{path} {json.dumps(error.instance)}: one of {', '.join(map(str, error.validator_value))}")
        else:
            message = error.message if len(error.message) <= 200 else error.message[:197] + "..."
            lines.append(f"{path or 'the configuration'}: {message}")
    return lines


# -- where each value came from: the corpus's own file, a study file or --config -----------------
def label(path: str, repo: str) -> str:
    """``path`` as the user would name it: from the working directory, else from the checkout."""
    path = os.path.abspath(path)
    for base in (os.getcwd(), repo):
        relative = os.path.relpath(path, base)
        if not relative.startswith(".."):
            return relative
    return path


def corpus_file(configfiles: Sequence[str], recipes: str) -> Optional[str]:
    """The corpus's own file, recipes/conf/NAME.yaml of a recipes/NAME/run.sh, where it is the first
    config file (recipes/run.sh passes it first): its values are the corpus's defaults."""
    if configfiles:
        first = os.path.abspath(configfiles[0])
        name = os.path.splitext(os.path.basename(first))[0]
        if os.path.basename(os.path.dirname(first)) == "conf" and os.path.isfile(os.path.join(recipes, name, "run.sh")):
            return first
    return None


def origins(configfiles: Sequence[str], overrides: Mapping, repo: str) -> Dict[str, str]:
    """path -> what gave it last (Snakemake merges the config files in order, then --config), for
    every key of every section."""
    out: Dict[str, str] = {}

    def walk(node, prefix, where):
        for key, value in node.items():
            out[prefix + str(key)] = where
            if isinstance(value, Mapping):
                walk(value, f"{prefix}{key}.", where)

    for path in configfiles:
        with open(path, encoding="utf-8") as f:
            data = yaml.load(f, Loader=YAML_LOADER)
        if isinstance(data, dict):
            walk(data, "", label(path, repo))
    walk(overrides or {}, "", "--config")
    return out


def given(config: dict, where: Dict[str, str], defaults: Optional[str]) -> dict:
    """What the user gave (:func:`check`'s ``given``): ``config`` (the merged files and --config,
    before the schema's defaults) less what only the file labelled ``defaults`` (the corpus's own)
    gave, ``where`` being :func:`origins`."""

    def keep(node, prefix):
        out = {}
        for key, value in node.items():
            path = prefix + key
            if isinstance(value, dict) and value:
                kept = keep(value, path + ".")
                if kept or defaults is None or where.get(path) != defaults:
                    out[key] = kept
            elif defaults is None or where.get(path) != defaults:
                out[key] = copy.deepcopy(value)
        return out

    return keep(config, "")


#: the settings that name a row: a corpus's file's yields to the schema's default where the user's rows lack it
ROW_SETTINGS = ("models.baseline", "warm_start.start")


def corpus_rows_yield(config: dict, given_: dict) -> None:
    """A row the corpus's own file names (files.yaml's baseline sinusoidal) and the user's
    models.encodings lack is that corpus's default, not the user's choice: the schema's default
    takes its place (the report's baseline: sinusoidal if a row, else the first)."""
    names = {VANILLA} | {name for row in parse_rows(config["models"]["encodings"]) for name in (row.spec, row.slug)}
    for path in ROW_SETTINGS:
        value = value_at(config, path)
        if value not in (ABSENT, None) and value not in names and value_at(given_, path) is ABSENT:
            *sections, name = path.split(".")
            node = config
            for section in sections:
                node = node[section]
            node[name] = default(path)


def naming_files(message: str, config: dict, where: Dict[str, str]) -> str:
    """A refusal that starts with a setting's path, or its path and value, then ":" (or " is "),
    with the file that gave the value after them: "models.arch iwslt (recipes/conf/files.yaml): ..."."""
    path = message.split(" ", 1)[0].rstrip(":")
    if path not in where:
        return message
    heads = [path]
    value = value_at(config, path)
    if value is not ABSENT:
        heads = [f"{path} {text}" for text in (json.dumps(value), str(value), repr(value))] + heads
    for head in heads:
        if message.startswith(head) and message[len(head):].startswith((":", " is ")):
            return f"{head} ({where[path]}){message[len(head):]}"
    return message
