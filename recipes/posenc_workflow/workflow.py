"""What recipes/Snakefile builds its jobs from: a study's validated configuration turned into its
models (one per row and seed), the complete command line of every job, and the checks made when
the workflow is parsed, before any job runs.

- rows: ``ENC`` or ``ENC:--flag=value[,--flag=value...]`` (the demo's row specs), refused here when
  ENC is not in the position-encoding registry (``snakemake -n`` refuses ``t6``), when a flag would
  change nothing (their models are built, tiny, as fairseq-train builds them, and labelled by
  fairseq_posenc/labels.py), or when two rows would train the same model (one resolved fairseq
  configuration: rows may differ in any fairseq-train flag);
- models: a row's model per seed; FLOATER's protocol (the encodings of :data:`WARM_STARTED` start
  from a sinusoidal model: its own ``vanilla`` stage, shared by every warm-started row of a seed, or
  a row of the study) with its control, ``vanilla_continued``; distilled students;
- commands: the full fairseq-train argument list of each model (what the train rule's params
  hold, so that Snakemake retrains a model whose command changed and its dry run says how), with
  the checkpoint a warm start reads left as ``{start}`` (the start's checkpoint directory, known
  when its job has run);
- the code a model is trained with (:func:`code_key`): what an edit of fairseq_posenc/ or an
  upgrade of fairseq or torch does to it (recipes/README.md, "Reuse").
"""
import dataclasses
import hashlib
import json
import os
import re
import sys
import threading
from typing import Dict, List, NamedTuple, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USER_DIR = os.path.join(ROOT, "fairseq_posenc")
#: the encodings trained by FLOATER's protocol: warm-started from a sinusoidal model (the paper's
#: Appendix B.2; the RNN encoders of its Table 6 take FLOATER's place in the same blocks)
WARM_STARTED = ("floater", "rnn")
CONTROL = "vanilla_continued"
VANILLA = "vanilla"


class Arch(NamedTuple):
    """What ``auto`` means for a fairseq architecture of ``models.arch`` (``transformer_ENC_SUFFIX``)."""
    suffix: str
    dropout: float
    lr: float
    max_update: int
    average: int  # checkpoints averaged
    save_interval_updates: int


#: fairseq's architectures per ``models.arch``: Vaswani et al.'s base and big, fairseq's IWSLT
#: example with Wu et al.'s 50k updates; the demo's sizes (models/from_flags.py MODEL_SIZES) train
#: transformer_posenc and have no defaults
ARCHS = {
    "base": Arch("wmt_en_de", dropout=0.1, lr=7e-4, max_update=100000, average=5, save_interval_updates=1250),
    "big": Arch("wmt_en_de_big", dropout=0.3, lr=5e-4, max_update=300000, average=20, save_interval_updates=600),
    "iwslt": Arch("iwslt_de_en", dropout=0.3, lr=5e-4, max_update=50000, average=10, save_interval_updates=1000),
}
#: what every corpus recipe knows of its corpus: languages, the official validation and test
#: sets, fairseq's split of the training pairs, how fairseq's own scripts prepare it, and its
#: published size (training pairs by the languages of the pair; the plan's estimate before the
#: corpus is prepared): WMT14 by Vaswani et al. (4.5M En-De, 36M En-Fr), WMT18 by its parts
#: (Europarl v7, Common Crawl, News Commentary v13: about 4.6M de-en, 1.0M cs-en), IWSLT'14 by
#: fairseq's examples/translation (160k)
CORPORA = {
    "wmt14_en_de": dict(pair="en-de", valid_name="newstest2013", test_name="newstest2014", valid_every=100,
                        bpe_size=40000, valid="split", style="wmt", train_pairs={"de-en": 4_500_000}),
    "wmt14_en_fr": dict(pair="en-fr", valid_name="newstest2013", test_name="newstest2014", valid_every=1333,
                        bpe_size=40000, valid="split", style="wmt", train_pairs={"en-fr": 36_000_000}),
    "wmt18": dict(pair="en-de", valid_name="newstest2017", test_name="newstest2018", valid_every=100,
                  bpe_size=40000, valid="newstest2017", style="wmt", pairs=("en-de", "de-en", "en-cs", "cs-en"),
                  train_pairs={"de-en": 4_600_000, "cs-en": 1_000_000}),
    "iwslt14_de_en": dict(pair="de-en", valid_name="split", test_name="dev2010_dev2012_tst2010-2012",
                          valid_every=23, bpe_size=10000, valid="split", style="iwslt", train_pairs={"de-en": 160_000}),
    # your own files (corpus.train, .valid, .test): prepared as WMT's, 10k BPE merges as IWSLT's
    "files": dict(pair=None, valid_name="split", test_name=None, valid_every=100, bpe_size=10000, valid="split",
                  style="files", train_pairs={}),
    "toy": dict(pair="src-tgt", valid_name="valid", test_name="test", valid_every=0, bpe_size=0, valid="valid",
                style="toy", train_pairs={}),
}
# target subwords of a training pair, for the estimate: WMT's news and parliament text at 40k
# BPE merges about 28, IWSLT's TED talks at 10k about 23 (assumptions; the prepared corpus is counted)
TARGET_SUBWORDS = {"wmt": 28, "iwslt": 23}
#: what ``auto`` means for the train settings each recipe sets its own way: Ott et al.'s
#: scaling_nmt flags (large_batch: 250 warmup updates, fairseq's examples/scaling_nmt), the demo's
#: toy flags (recipes/posenc_workflow/pipeline.py toy_train_flags; None: not passed, fairseq's own default)
RECIPE_AUTO = {
    "scaling_nmt": {"warmup_updates": 4000, "warmup_init_lr": 1e-7, "adam_eps": 1e-9},
    "toy": {"warmup_updates": 100, "warmup_init_lr": None, "adam_eps": None, "dropout": 0.1, "max_tokens": 2000,
            "update_freq": None},
}
#: train.precision: fairseq-train's flags on GPUs
PRECISION_FLAGS = {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"], "amp": ["--amp"],
                   "memory-efficient-fp16": ["--memory-efficient-fp16"]}
SHARE_FLAGS = {"all": ["--share-all-embeddings"], "decoder": ["--share-decoder-input-output-embed"]}
# building a model reseeds torch's global generator: one at a time, the state put back
_TORCH_RNG = threading.Lock()


class ConfigError(ValueError):
    """A configuration the workflow refuses: the message is the one line the user sees."""


# ------------------------------------------------------------------------------------------------
# the configuration as Snakemake's --config gives it
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
    import yaml

    try:
        read = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    if not isinstance(read, str) and (any(_JSON_TYPES[t](read) for t in others) or read in schema.get("enum", [])):
        return read
    return value


# ------------------------------------------------------------------------------------------------
# rows
@dataclasses.dataclass
class Row:
    """One row of a study: an encoding and the flags its spec adds, the name its models train under
    (``slug``: a wildcard of the workflow's jobs), and, once built, its model's label."""
    spec: str
    encoding: str
    flags: List[str]
    slug: str
    label: str = ""


def parse_row(spec: str) -> Row:
    """``ENC`` or ``ENC:--flag=value[,--flag=value...]`` (a flag without ``=value`` is a switch)."""
    from fairseq_posenc.positions import POSITION_ENCODINGS

    encoding, _, rest = str(spec).partition(":")
    if encoding in (CONTROL, VANILLA):
        raise ConfigError(f"models.encodings {spec}: {encoding} is FLOATER's protocol's own model, added by "
                          "warm_start")
    if encoding not in POSITION_ENCODINGS:
        raise ConfigError(f"models.encodings {spec}: {encoding!r} is not a position encoding; choose one of "
                          f"{', '.join(POSITION_ENCODINGS)}, each optionally with :--flag=value[,--flag=value...]")
    flags = []
    if ":" in str(spec):
        for item in rest.split(","):
            name, eq, value = item.partition("=")
            if not re.fullmatch(r"--[a-z0-9][a-z0-9-]*", name) or (eq and not value):
                raise ConfigError(f"models.encodings {spec}: {item!r} is not --flag=value or --flag")
            flags += [name, value] if eq else [name]
        if not flags:
            raise ConfigError(f"models.encodings {spec}: no flags after ':'")
    slug = encoding + ("-" + re.sub(r"[^A-Za-z0-9.]+", "-", rest).strip("-.") if flags else "")
    return Row(str(spec), encoding, flags, slug, str(spec))


def parse_rows(specs) -> List[Row]:
    rows, slugs = [], {}
    for spec in specs:
        row = parse_row(spec)
        if row.slug in slugs:
            raise ConfigError(f"models.encodings {slugs[row.slug].spec} and {row.spec} are the same row")
        slugs[row.slug] = row
        rows.append(row)
    return rows


def preflight_label(encoding: str, flags: List[str], size: str = "tiny", warm_start: bool = False) -> str:
    """Build the model of ``--position-encoding encoding`` with ``flags`` (no data, no training) as
    fairseq-train will, at the demo's ``size``: a flag that would change nothing is refused here
    (models/config.py), and the row's label is known before any work. ``warm_start``: built
    warm-started as FLOATER's protocol trains it (from an untrained vanilla model of its size),
    which decides its lr scale and its label. The report's labels are read from the trained
    checkpoints (fairseq_posenc/labels.py), never from here."""
    import argparse
    import tempfile

    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    from fairseq_posenc import labels
    from fairseq_posenc.models.from_flags import size_flags

    class Task:
        source_dictionary = target_dictionary = Dictionary()

    for symbol in ("a", "b", "<sep>"):
        Task.source_dictionary.add_symbol(symbol)

    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one line under the caller's own error, not a second program's
            raise ConfigError(message)

    parser = Parser(argument_default=argparse.SUPPRESS)
    ARCH_MODEL_REGISTRY["transformer_posenc"].add_args(parser)

    def build(encoding, flags):
        import torch

        model_args, _ = parser.parse_known_args(["--position-encoding", encoding, *size_flags(size), *flags])
        model_args.arch = "transformer_posenc"
        ARCH_CONFIG_REGISTRY["transformer_posenc"](model_args)
        with _TORCH_RNG:
            state = torch.random.get_rng_state()
            try:
                return ARCH_MODEL_REGISTRY["transformer_posenc"].build_model(model_args, Task())
            finally:
                torch.random.set_rng_state(state)

    if not (warm_start and encoding in WARM_STARTED):
        return labels.model_label(build(encoding, flags))
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        vanilla = os.path.join(tmp, "vanilla.pt")
        torch.save({"model": build("sinusoidal", []).state_dict()}, vanilla)
        return labels.model_label(build(encoding, [*flags, "--floater-init-from", vanilla]))


# ------------------------------------------------------------------------------------------------
# the code a model is trained with
def code_files(root: str = ROOT, encoding: Optional[str] = None) -> List[str]:
    """The files fairseq's ``--user-dir`` runs to train a model of ``encoding``: what
    ``fairseq_posenc/__init__.py`` imports (at module level or inside a function, the C++
    extension's source included), read from the source (recipes/posenc_workflow/sources.py), never
    from what a process happened to import; less what only the other encodings' schemes run (the
    files of their classes and what only those import), which the registry
    (positions/__init__.py) imports beside this one's. A file of another scheme that this scheme
    imports itself (learned.py imports sinusoidal.py) is its code too. Without ``encoding``: every
    encoding's."""
    from posenc_workflow.sources import sources

    init = os.path.join(root, "fairseq_posenc", "__init__.py")
    if encoding is None:
        return list(sources(init, root=root))
    owned = _encoding_files(root)
    schemes = set().union(*owned.values())
    # what the plugin runs besides the schemes, then what this encoding's scheme runs, not
    # following the registry (it imports every scheme) but every other import
    registry = os.path.join(root, "fairseq_posenc", "positions", "__init__.py")
    files = set(sources(init, root=root, stop=schemes))
    files |= set(sources(*owned[encoding], root=root, stop=[registry]))
    return sorted(files)


def _encoding_files(root: str = ROOT) -> Dict[str, set]:
    """encoding -> the files defining the classes of its scheme (its MRO), for every registered one."""
    from fairseq_posenc.positions import POSITION_ENCODINGS

    owned = {}
    for name, cls in POSITION_ENCODINGS.items():
        owned[name] = set()
        for c in cls.__mro__:
            if c.__module__.startswith("fairseq_posenc."):
                parts = c.__module__.split(".")
                owned[name].add(os.path.join(root, *parts) + ".py")
                if len(parts) > 3:  # a scheme in a package of its own (positions/floater/): the package too
                    owned[name].add(os.path.join(root, *parts[:3], "__init__.py"))
    return owned


def software_versions() -> Dict[str, str]:
    from importlib import metadata

    import fairseq
    import torch

    return {"fairseq": getattr(fairseq, "__version__", "?"), "torch": torch.__version__,
            "python": ".".join(map(str, sys.version_info[:3])),
            "fairseq_distribution": next((f"{d} {metadata.version(d)}" for d in ("fairseq", "ve-fairseq")
                                          if _has_distribution(d)), "?")}


def _has_distribution(name: str) -> bool:
    from importlib import metadata

    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


_CODE_CACHE: Dict[tuple, str] = {}


def code_key(encoding: str, root: str = ROOT) -> str:
    """12 hex digits of what trains a model of ``encoding``: the source of :func:`code_files`
    (a class of another encoding in this one's MRO counts: rnn is trained by FLOATER's package too) and
    the versions of fairseq, torch and Python. An edit of fairseq_posenc/positions/alibi.py
    retrains the alibi models and no other, one of FLOATER's solver the floater and rnn models; an
    edit of the shared model code or an upgrade retrains every model; an edit of a module that
    does not train (labels.py, the recipes) retrains none. ``root``: the checkout (another one, in
    tests)."""
    if (encoding, root) not in _CODE_CACHE:
        digest = hashlib.sha1(json.dumps(software_versions(), sort_keys=True).encode())
        for path in code_files(root, encoding):
            with open(path, "rb") as f:
                digest.update(os.path.relpath(path, root).encode() + b"\0" + f.read())
        _CODE_CACHE[(encoding, root)] = digest.hexdigest()[:12]
    return _CODE_CACHE[(encoding, root)]


# ------------------------------------------------------------------------------------------------
# the study's models
@dataclasses.dataclass
class Model:
    name: str  # the row's slug, vanilla, vanilla_continued or distilled-SLUG
    seed: int
    encoding: str
    kind: str  # scratch | vanilla | warm | control | distilled
    flags: List[str] = dataclasses.field(default_factory=list)  # the row's own
    start: Optional[str] = None  # the model (name) whose checkpoint_best.pt it starts from
    teacher: Optional[str] = None  # distilled: the model (name) whose average teaches it

    @property
    def key(self) -> str:
        return f"{self.name}/seed{self.seed}"


class Study:
    """A validated configuration (the schema's defaults applied) as its rows, models and commands."""

    def __init__(self, config: dict, preflight: bool = True, given: Optional[dict] = None):
        """``given``: the configuration as the user's files and --config gave it, before the
        schema's defaults: a setting given that the study's recipe, corpus or device would not use
        is refused (recipes/posenc_workflow/settings.py)."""
        self.config = config
        corpus = config["corpus"]
        if corpus["name"] not in CORPORA:
            raise ConfigError(f"corpus.name {corpus['name']!r}: choose one of {', '.join(CORPORA)}")
        self.facts = dict(CORPORA[corpus["name"]])
        self.pair = corpus.get("pair") or self.facts["pair"]
        if not self.pair:
            raise ConfigError("corpus.pair: set the languages of your files, SRC-TGT (as de-en)")
        if "pairs" in self.facts and self.pair not in self.facts["pairs"]:
            raise ConfigError(f"corpus.pair {self.pair}: {corpus['name']} has {', '.join(self.facts['pairs'])}")
        self.src, self.tgt = self.pair.split("-")
        if self.src == self.tgt:  # fairseq's files are named by language: both sides would be one file
            raise ConfigError(f"corpus.pair {self.pair}: the source and the target need two names, SRC-TGT "
                              "(fairseq names each side's files by its language)")
        self.corpus_name = corpus["name"] if corpus["name"] not in ("wmt18", "files") else \
            f"{corpus['name']}_{self.src}_{self.tgt}"
        # {corpus}: one study file for every pair of a corpus (WMT18) writes each pair apart
        try:
            self.out = config["out"].format(corpus=self.corpus_name)
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(f"out {config['out']!r}: {{corpus}} is the only field it can hold ({e!r})") from None
        self.config = {**config, "out": self.out}  # the report's title and the study's record name it
        self.data = corpus.get("data") or self._default_data(corpus)
        models = config["models"]
        self.arch = models["arch"]
        self.rows = parse_rows(models["encodings"])
        self.seeds = list(models["seeds"])
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"models.seeds {self.seeds}: each seed once")
        self.train = config["train"]
        self.warm = config.get("warm_start") or {}
        self.evaluate = config["evaluate"]
        self.split = config.get("split")
        from posenc_workflow.settings import check

        check(self, given)
        # (the toy pair has no subwords: a word is one)
        if (length_bins(config) or ("", ""))[1] == "subwords" and decoded_segmentation(config) == "none" \
                and corpus["name"] != "toy":
            raise ConfigError("report.unit subwords: the decoded sources are words here (no split in subwords: "
                              "decoded with --remove-bpe); set report.unit words, or split.unit subwords")
        self._resolved: Dict[str, tuple] = {}
        self._check_rows(preflight)
        self.models = self._models()

    def _default_data(self, corpus: dict) -> str:
        from posenc_workflow.corpus import files_data_dir

        if corpus["name"] == "toy":
            return os.path.join(self.out, "corpus")
        if corpus["name"] == "files":
            return files_data_dir(corpus, self.src, self.tgt)
        return os.path.join("data", self.corpus_name)

    def test_sets(self):
        """Every test set decoded, scored and reported apart (corpus.TestSet): the corpus's, or a
        files corpus's named ones; with a split, first the long pairs it set aside."""
        from posenc_workflow.corpus import TestSet, named_tests

        if self.config["corpus"]["name"] != "files":
            return [TestSet(self.test_set(), "test", "test", "models")]
        named = named_tests(self.config["corpus"])
        return ([TestSet(self.test_set(), "test", "test", "models")] if self.split else []) + named

    def test_data_bin(self, test) -> str:
        """The binarized set ``test`` (a TestSet) is decoded from: the split's or the corpus's, or
        a named test set's own (prepared apart: recipes/rules/prepare.smk, prepare_test)."""
        return self.data_bin() if test.where == "models" else os.path.join(self._test_data(test), "data-bin")

    def report_config(self, test_name: Optional[str] = None) -> dict:
        """What the report reads of the study (its study.json): the rows, seeds, baseline, bins and
        title (report.py length), a named test set's title naming it; the demo's report (report.py
        demo) also its size, budget, toy pair and warm start, for its note."""
        config = self.config
        out = {"out": config["out"], "models": {k: config["models"].get(k) for k in ("encodings", "seeds", "baseline")},
               "report": config["report"], **({"split": config["split"]} if config.get("split") else {})}
        if config["corpus"]["name"] == "toy":
            out["models"]["arch"] = config["models"]["arch"]
            out["corpus"] = {"toy": config["corpus"]["toy"]}
            out["train"] = {k: config["train"].get(k) for k in ("max_update", "max_tokens", "lr", "threads",
                                                                "encoding_flags", "position_bias_scale")}
            out["warm_start"] = config.get("warm_start") or {}
        config = out
        if test_name:
            config = {**config, "report": {**config["report"], "title": (config["report"].get("title") or self.out)
                                           + f", test set {test_name}"}}
        return config

    def test_reference(self, test) -> str:
        """The raw references SacreBLEU scores ``test`` against (the target side as given)."""
        where = self.data if test.where == "models" else self._test_data(test)
        return os.path.join(where, f"{test.prefix}.raw.{self.tgt}")

    def _test_data(self, test) -> str:
        """Where a named test set is prepared (recipes/rules/prepare.smk, prepare_test)."""
        return os.path.join(self.out, test.where, "data")

    # -- rows and their preflight -----------------------------------------------------------------
    def _check_rows(self, preflight: bool):
        from fairseq_posenc.positions import POSITION_ENCODINGS

        for encoding in self.train.get("encoding_flags") or {}:
            if encoding not in POSITION_ENCODINGS:
                raise ConfigError(f"train.encoding_flags {encoding}: {encoding!r} is not a position encoding; choose "
                                  f"among {', '.join(POSITION_ENCODINGS)}")
        baseline = self.config["models"].get("baseline")
        if baseline and not any(baseline in (r.spec, r.slug) for r in self.rows):
            raise ConfigError(f"models.baseline {baseline} is not among models.encodings "
                              f"({', '.join(r.spec for r in self.rows)})")
        start = self.warm.get("start", VANILLA) if self.warm.get("enabled") else None
        if start and start != VANILLA and not any(start in (r.spec, r.slug) for r in self.rows):
            raise ConfigError(f"warm_start.start {start}: {VANILLA} or one of models.encodings")
        if start and not any(r.encoding in WARM_STARTED for r in self.rows):
            raise ConfigError("warm_start.enabled: no row of models.encodings is warm-started "
                              f"({', '.join(WARM_STARTED)})")
        if not preflight:
            return
        size = self.arch if self.arch in _sizes() else "tiny"
        for row in self.rows:
            try:
                row.label = preflight_label(row.encoding, self._model_flags(row.encoding) + row.flags, size,
                                            warm_start=bool(self.warm.get("enabled")))
            except (ValueError, SystemExit) as e:
                raise ConfigError(f"models.encodings {row.spec}: {e}") from None

    def check_same_rows(self):
        """Two rows are one model where fairseq resolves their commands to one configuration
        (train_config.identity) from one start: refused, the report would show one model twice.
        Rows that differ in any other flag (``--encoder-layers``, ``--dropout``) are two models.
        Called where the rows are trained (recipes/rules/train.smk, scripts/demo.py): it resolves
        each row's command, seconds a study."""
        seen = {}
        for row in self.rows:
            model = self.model(row.slug, self.seeds[0])
            key = (self.resolved(model)[1], model.start, model.teacher, model.encoding)
            if key in seen:
                raise ConfigError(f"models.encodings {seen[key].spec} and {row.spec} are the same model, "
                                  f"{row.label!r}: fairseq resolves them to one configuration")
            seen[key] = row

    def resolved(self, model: "Model"):
        """(fairseq's resolved configuration of the model's command, its identity), once a model,
        cached on disk under :func:`config_cache`."""
        from posenc_workflow import train_config

        if model.key not in self._resolved:
            try:
                config = train_config.resolve(self.command(model), cache=config_cache())
            except ValueError as error:
                raise ConfigError(f"{model.key}: {error}") from None
            # FLOATER's vanilla stage with a budget of its own (warm_start.vanilla) is another model
            # than a sinusoidal row of the same configuration: its own directory (with the rows'
            # budget it is that row's model, trained once: recipes/rules/train.smk's _same_as)
            stage = None
            if model.kind == "vanilla" and self.budget(model) != self.budget(dataclasses.replace(model, kind="scratch")):
                stage = {"stage": VANILLA}
            self._resolved[model.key] = (config, train_config.identity(config, stage))
        return self._resolved[model.key]

    def row(self, slug: str) -> Row:
        return next(r for r in self.rows if r.slug == slug)

    def _start_name(self) -> str:
        start = self.warm.get("start", VANILLA)
        if start == VANILLA:
            return VANILLA
        return next(r.slug for r in self.rows if start in (r.spec, r.slug))

    def _models(self) -> List[Model]:
        warm = bool(self.warm.get("enabled"))
        models = []
        for seed in self.seeds:
            for row in self.rows:
                if warm and row.encoding in WARM_STARTED:
                    models.append(Model(row.slug, seed, row.encoding, "warm", row.flags, start=self._start_name()))
                else:
                    models.append(Model(row.slug, seed, row.encoding, "scratch", row.flags))
            if warm and self._start_name() == VANILLA:
                models.append(Model(VANILLA, seed, "sinusoidal", "vanilla"))
            if warm and self.warm.get("control", True):
                models.append(Model(CONTROL, seed, "sinusoidal", "control", start=self._start_name()))
        distill = self.config.get("distillation") or {}
        if distill.get("teacher"):
            teacher = next((r.slug for r in self.rows if distill["teacher"] in (r.spec, r.slug)), None)
            if teacher is None:
                raise ConfigError(f"distillation.teacher {distill['teacher']}: not one of models.encodings")
            for seed in self.seeds:
                for spec in distill.get("students", ["sinusoidal"]):
                    row = parse_row(spec)
                    models.append(Model(f"distilled-{row.slug}", seed, row.encoding, "distilled", row.flags,
                                        teacher=teacher))
        return models

    def model(self, name: str, seed) -> Model:
        return next(m for m in self.models if m.name == name and m.seed == int(seed))

    def evaluated(self) -> List[Model]:
        """The models decoded and scored (a vanilla stage is a start, not a result)."""
        return [m for m in self.models if m.kind != "vanilla"]

    # -- commands ----------------------------------------------------------------------------------
    def data_bin(self) -> str:
        if self.split:
            return os.path.join(self.out, "split", "data-bin")
        return os.path.join(self.data, "data-bin")

    def _model_flags(self, encoding: str) -> List[str]:
        """The study's model flags for ``encoding``: its own (model_flags), the bias scale where the
        encoding takes one, and the per-encoding overrides."""
        from fairseq_posenc.positions import POSITION_ENCODINGS
        from fairseq_posenc.positions.bias_scale import uses_bias_scale

        flags = [str(f) for f in self.train.get("model_flags", [])]
        scale = self.train.get("position_bias_scale")
        if scale is not None and uses_bias_scale(POSITION_ENCODINGS[encoding]):
            flags += ["--position-bias-scale", repr(float(scale))]
        flags += [str(f) for f in (self.train.get("encoding_flags") or {}).get(encoding, [])]
        return flags

    def model_arch(self, model: "Model") -> str:
        """The model's ``models.arch``: the study's, or a distilled student's ``distillation.arch``."""
        return self.config["distillation"]["arch"] if model.kind == "distilled" else self.arch

    def arch_flags(self, encoding: str, arch: Optional[str] = None) -> List[str]:
        arch = arch or self.arch
        if arch in ARCHS:
            return ["--arch", f"transformer_{encoding}_{ARCHS[arch].suffix}"]
        from fairseq_posenc.models.from_flags import size_flags

        return ["--arch", "transformer_posenc", "--position-encoding", encoding, *size_flags(arch)]

    def arch_default(self, key: str, arch: Optional[str] = None, section: str = "train"):
        """``section.key`` of the configuration, its ``auto`` the architecture's value (``arch``: the
        study's by default)."""
        arch = arch or self.arch
        value = self.config[section].get(key, "auto")
        if value != "auto":
            return value
        if arch not in ARCHS:
            raise ConfigError(f"{section}.{key}: auto has no value for {'models' if section == 'train' else section}.arch "
                              f"{arch}: set it")
        value = getattr(ARCHS[arch], key)
        if self.train.get("large_batch") and key in ("lr", "max_update", "save_interval_updates"):
            # fairseq's examples/scaling_nmt big batches: 16x the update, lr 0.001, every count of
            # updates divided by 16 so that each stands for the same tokens
            value = {"lr": 1e-3, "max_update": value // 16, "save_interval_updates": 125 if arch == "base" else 50}[key]
        return value

    def recipe_default(self, key: str):
        """``train.key``, its ``auto`` the recipe's value (:data:`RECIPE_AUTO`)."""
        value = self.train.get(key, "auto")
        if value != "auto":
            return value
        if key == "warmup_updates" and self.train["recipe"] == "scaling_nmt" and self.train.get("large_batch"):
            return 250
        return RECIPE_AUTO[self.train["recipe"]][key]

    def world(self) -> int:
        return 1 if self.train["device"] == "cpu" else int(self.train["nodes"]) * int(self.train["gpus_per_node"])

    def batch(self):
        """(max_tokens, update_freq) of every model: auto keeps ``train.batch_target`` padded tokens
        an update at any GPU count (recipes/posenc_workflow/plan.py)."""
        from posenc_workflow.plan import batch_for

        target = self.train["batch_target"] * (16 if self.train.get("large_batch") else 1)
        max_tokens = None if self.train["max_tokens"] == "auto" else int(self.train["max_tokens"])
        update_freq = None if self.train["update_freq"] == "auto" else int(self.train["update_freq"])
        max_tokens, update_freq, _ = batch_for(max_tokens, self.world(), update_freq, target=target)
        return max_tokens, update_freq

    def device_flags(self) -> List[str]:
        if self.train["device"] == "cpu":
            return ["--cpu"]
        flags = PRECISION_FLAGS[self.train["precision"]] + ["--distributed-world-size", str(self.world())]
        if int(self.train["nodes"]) > 1 and self.train["distributed_port"] is not None:
            # one task a node (srun inside the job): fairseq-train infers SLURM's world from it and
            # spawns a process per GPU; the port is where rank 0 listens on the first node (none
            # given: train_job.py derives one from the SLURM job id)
            flags += ["--distributed-port", str(self.train["distributed_port"])]
        return flags

    def budget(self, model: Model):
        """(max_update, max_epoch) of the model's training, None where not set."""
        def both(section, default_update=None):
            return section.get("max_update") or default_update, section.get("max_epoch")

        if model.kind == "vanilla":
            return both(self.warm.get("vanilla", {}))
        if model.kind in ("warm", "control"):
            return both(self.warm.get("second", {}))
        if model.kind == "distilled":
            return both(self.config["distillation"])
        max_epoch = self.train.get("max_epoch")
        max_update = self.train.get("max_update", "auto")
        max_update = (None if max_epoch else self.arch_default("max_update")) if max_update == "auto" else max_update
        return max_update, max_epoch

    def average(self, model: Model) -> int:
        if model.kind in ("warm", "control"):
            return int(self.warm.get("average", 5))  # FLOATER's paper averages the last 5, base and big
        if model.kind == "distilled":
            return int(self.config["distillation"].get("average", 5))
        if self.evaluate.get("average", "auto") != "auto":
            return int(self.evaluate["average"])
        return self.arch_default("average")

    def lr(self, model: Model) -> float:
        if model.kind == "distilled":
            return float(self.arch_default("lr", self.model_arch(model), "distillation"))
        lr = float(self.arch_default("lr"))
        if model.kind in ("warm", "control"):
            lr *= float(self.warm.get("lr_scale", 0.5))
        return lr

    def command(self, model: Model) -> List[str]:
        """fairseq-train's argument list for ``model`` (without --save-dir, which the training job
        adds: a directory named by the hash of the resolved configuration)."""
        if self.train["recipe"] == "toy":
            return self._toy_command(model)
        return self._scaling_nmt_command(model)

    def _common_end(self, model: Model, encoding_flags: List[str]) -> List[str]:
        flags = [str(f) for f in self.train.get("flags", [])]
        return [*encoding_flags, *flags, "--seed", str(model.seed)]

    def _start_flags(self, model: Model, encoding: str) -> List[str]:
        if model.kind == "warm" and encoding in WARM_STARTED:
            return ["--floater-init-from", "{start}/checkpoint_best.pt"]
        if model.kind == "control":
            return ["--finetune-from-model", "{start}/checkpoint_best.pt"]
        return []

    def _split_flags(self, model: Model):
        """(flags of the model, flags that stay with the warm-started stage): a vanilla start and the
        control take the study's flags without the warm-started encoding's own (flags.split)."""
        from posenc_workflow.flags import split

        shared = self._model_flags(model.encoding)
        if model.kind in ("vanilla", "control"):
            warm = next((r for r in self.rows if r.encoding in WARM_STARTED), None)
            if warm is not None:
                shared = split(warm.encoding, self._model_flags(warm.encoding))[0]
            return shared
        return shared + model.flags

    def _toy_command(self, model: Model) -> List[str]:
        """The demo's flags (pipeline.toy_train_flags) with the study's settings: each ``auto`` the
        toy recipe's value (:data:`RECIPE_AUTO`), a setting of fairseq's default passed only when
        it differs, so that the demo's commands stay what they were."""
        from posenc_workflow.pipeline import toy_train_flags

        t = self.train
        max_update, max_epoch = self.budget(model)
        keep = 5 if model.kind == "vanilla" else max(5, self.average(model))
        flags = toy_train_flags(model.encoding, max_update or 0, model.seed, keep_last_epochs=keep, size=self.arch,
                                lr=self.lr(model), max_tokens=int(self.recipe_default("max_tokens")),
                                device=self.device_flags(), dropout=self.recipe_default("dropout"),
                                warmup_updates=int(self.recipe_default("warmup_updates")),
                                share=SHARE_FLAGS[t["share_embeddings"]])
        flags = _without(flags, "--seed")  # _common_end gives it
        interval = ["--save-interval-updates", str(self.arch_default("save_interval_updates"))] \
            if self.evaluate["checkpoints"] == "update" or t.get("save_interval_updates", "auto") != "auto" else []
        if self.evaluate["checkpoints"] == "update":
            # interval checkpoints to average: the scaling_nmt recipe's, every save_interval_updates
            flags = _without(flags, "--keep-last-epochs") + self._keep_flags(model) + interval
        elif interval:  # besides the epoch checkpoints averaged, the last interval one (to resume from)
            flags += interval + ["--keep-interval-updates", "1"]
        flags += self._optimizer_flags()
        if t["weight_decay"]:
            flags += ["--weight-decay", str(t["weight_decay"])]
        if self.recipe_default("update_freq") is not None:
            flags += ["--update-freq", str(self.recipe_default("update_freq"))]
        flags += self._eval_bleu_flags()
        if max_epoch:
            flags += ["--max-epoch", str(max_epoch)]
        return [self.data_bin(), "--user-dir", USER_DIR, *flags, *self._split_flags(model),
                *self._start_flags(model, model.encoding), *self._common_end(model, [])]

    def _optimizer_flags(self) -> List[str]:
        """Adam's eps and the warmup's initial lr, where set (null: fairseq's defaults)."""
        flags = []
        if self.recipe_default("adam_eps") is not None:
            flags += ["--adam-eps", str(self.recipe_default("adam_eps"))]
        if self.recipe_default("warmup_init_lr") is not None:
            flags += ["--warmup-init-lr", str(self.recipe_default("warmup_init_lr"))]
        return flags

    def _eval_bleu_flags(self) -> List[str]:
        """train.eval_bleu: checkpoint_best.pt by validation BLEU decoded in process (fairseq's
        IWSLT example), with the test decode's beam and length limit."""
        if not self.train.get("eval_bleu"):
            return []
        remove = ["--eval-bleu-remove-bpe"] + (["sentencepiece"] if self.config["corpus"]["bpe"] == "sentencepiece" else [])
        flags = ["--eval-bleu", "--eval-bleu-args", json.dumps({"beam": int(self.evaluate["beam"]), "max_len_a": 1.5,
                                                                "max_len_b": 50}),
                 "--eval-bleu-detok", "moses", *remove, "--best-checkpoint-metric", "bleu",
                 "--maximize-best-checkpoint-metric"]
        if self.tgt != "en":
            flags += ["--eval-bleu-detok-args", json.dumps({"target_lang": self.tgt})]
        return flags

    def _keep_flags(self, model: Model) -> List[str]:
        """The checkpoints a run keeps: the last ``average`` of the kind evaluate.checkpoints
        averages (a vanilla stage: its checkpoint_best.pt is what is used), one interval checkpoint
        besides epoch checkpoints (checkpoint_last.pt resumes anyway)."""
        keep = str(1 if model.kind == "vanilla" else self.average(model))
        if self.evaluate["checkpoints"] == "epoch":
            return ["--keep-last-epochs", keep, "--keep-interval-updates", "1"]
        return ["--no-epoch-checkpoints", "--keep-interval-updates", keep]

    def _scaling_nmt_command(self, model: Model) -> List[str]:
        """The Scaling NMT flags (Ott et al., 2018) with the papers' base/big settings; IWSLT's
        config gives fairseq's example's (decoder-only sharing, weight decay, Adam's own eps)."""
        t = self.train
        arch = self.model_arch(model)
        max_update, max_epoch = self.budget(model)
        max_tokens, update_freq = self.batch()
        argv = [self.data_bin(), "--user-dir", USER_DIR, *SHARE_FLAGS[t["share_embeddings"]], "--optimizer", "adam",
                "--adam-betas", "(0.9, 0.98)"]
        eps = self.recipe_default("adam_eps")
        argv += ["--adam-eps", str(eps)] if eps is not None else []
        argv += ["--clip-norm", "0.0", "--lr-scheduler", "inverse_sqrt",
                 "--warmup-updates", str(self.recipe_default("warmup_updates"))]
        init = self.recipe_default("warmup_init_lr")
        argv += ["--warmup-init-lr", str(init)] if init is not None else []
        criterion = "relation_distillation" if model.kind == "distilled" else "label_smoothed_cross_entropy"
        argv += ["--criterion", criterion, "--label-smoothing", "0.1", "--weight-decay", str(t["weight_decay"]),
                 "--dropout", str(self.arch_default("dropout", arch, "distillation" if model.kind == "distilled" else "train")),
                 "--max-tokens", str(max_tokens), "--update-freq", str(update_freq),
                 "--save-interval-updates", str(self.arch_default("save_interval_updates", arch)),
                 *self._keep_flags(model), "--no-progress-bar", "--log-interval", "100", "--log-format", "simple"]
        argv += self._eval_bleu_flags()
        argv += [*self.arch_flags(model.encoding, arch), "--lr", repr(self.lr(model))]
        argv += ["--max-update", str(max_update)] if max_update else []
        argv += ["--max-epoch", str(max_epoch)] if max_epoch else []
        if model.kind == "distilled":
            d = self.config["distillation"]
            argv += [*[str(f) for f in d.get("student_flags", [])], "--teacher-path", "{teacher}",
                     "--relation-heads", str(d["relation_heads"]), "--relations", d["relations"],
                     "--relation-weight", str(d["relation_weight"])]
        argv += self._split_flags(model) + self._start_flags(model, model.encoding)
        argv += self.device_flags()
        return argv + self._common_end(model, [])

    def corpus_estimate(self):
        """The corpus's published size (plan.CorpusEstimate) for the plan before it is prepared."""
        from posenc_workflow.plan import CorpusEstimate

        if self.facts["style"] == "files":
            return self._counted_files()
        pairs = self.facts["train_pairs"].get("-".join(sorted((self.src, self.tgt))))
        if not pairs or self.config["corpus"].get("sources"):  # another sources file: another corpus
            return None
        bpe = self.config["corpus"].get("bpe_size") or self.facts["bpe_size"]
        joined = self.facts["style"] != "iwslt"
        return CorpusEstimate(pairs, TARGET_SUBWORDS[self.facts["style"]], bpe * (1 if joined else 2),
                              f"{self.corpus_name}'s published size")

    def _counted_files(self):
        """A files corpus's training pairs and target words, counted in its files (the plan before
        it is prepared): its own split's validation pairs out, a word a subword (BPE only adds)."""
        from posenc_workflow.plan import CorpusEstimate

        corpus = self.config["corpus"]
        path = corpus["train"]["tgt"]
        # with a split in words, the pairs it trains on: sources under train_below (before tokenization)
        below = self.split["train_below"] if self.split and self.split["unit"] == "words" else None
        lines = words = 0
        with open(path, "rb") as f, open(corpus["train"]["src"], "rb") as g:
            for line, source in zip(f, g):
                if below is None or len(source.split()) < below:
                    lines += 1
                    words += len(line.split())
        pairs = lines - (lines // self.facts["valid_every"] if corpus.get("valid") in (None, "split") else 0)
        path += f" (sources under {below} words)" if below else ""
        bpe = corpus.get("bpe_size") or self.facts["bpe_size"]
        return CorpusEstimate(pairs, words / max(lines, 1) + 1, bpe,
                              f"counted in {path}: {lines:,} lines, {words:,} target words", counted=True)

    def tokens_per_second(self, model: "Model"):
        """train.tokens_per_second, auto: on GPUs Vaswani et al.'s P100 speed for base and big models
        and an assumed one for iwslt (plan.GPU_TOKENS_PER_SECOND); on the CPU "auto", which the plan
        works out from the model's parameters (plan.cpu_tokens_per_second)."""
        from posenc_workflow.plan import GPU_TOKENS_PER_SECOND

        value = self.train.get("tokens_per_second", "auto")
        if value == "auto":
            return "auto" if self.train["device"] == "cpu" else GPU_TOKENS_PER_SECOND.get(self.model_arch(model))
        return float(value) if value is not None else None

    def test_set(self) -> str:
        """What the test decode translates (the score lines' name of it): the corpus's test set, or
        with a split the training pairs it set aside as too long to train on."""
        if self.split:
            return f"split-long-pairs(source>={self.split['train_below']}-{self.split['unit']})"
        return self.facts["test_name"]

    # -- where things go ---------------------------------------------------------------------------
    def model_dir(self, model: Model) -> str:
        return os.path.join(self.out, "models", model.name, f"seed{model.seed}")

    def checkpoints_root(self) -> str:
        return os.path.join(self.out, "checkpoints")


def local_gpus(resources: Optional[dict] = None) -> int:
    """The GPUs of the jobs Snakemake runs here: recipes/run.sh's ``--resources gpus=N`` where
    ``resources`` (Snakemake's global resources) hold it, else counted as run.sh counts them
    (CUDA_VISIBLE_DEVICES where set, else ``nvidia-smi -L``)."""
    import subprocess

    if resources and "gpus" in resources:
        return int(getattr(resources["gpus"], "value", resources["gpus"]))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU") for line in listed.splitlines())


def _without(flags: List[str], option: str) -> List[str]:
    """``flags`` less ``option`` and its value."""
    i = flags.index(option)
    return flags[:i] + flags[i + 2:]


def _sizes():
    from fairseq_posenc.models.from_flags import MODEL_SIZES

    return MODEL_SIZES


def config_cache() -> str:
    """Where resolved fairseq configurations are cached (train_config.resolve), under Snakemake's
    own directory of the working directory."""
    return os.path.join(".snakemake", "fairseq_posenc", "configs")


def generate_command(study: "Study", averaged: str, test=None) -> List[str]:
    """fairseq-generate of the test set with the averaged checkpoint: beam search with fairseq's
    |Y|^lenpen, or (lenpen_form gnmt) every finished hypothesis with its raw score for rerank.py to
    pick by GNMT's ((5+|Y|)/6)^lenpen. Outputs are capped at 1.5 x source + 50 tokens: never below
    Vaswani et al.'s source + 50, and it lets a model that runs on past the training lengths show it.
    ``test``: the test set (corpus.TestSet) decoded, by default the study's first."""
    e = study.evaluate
    test = test or study.test_sets()[0]
    cmd = ["fairseq-generate", study.test_data_bin(test), "--user-dir", USER_DIR, "--path", averaged, "--gen-subset",
           test.subset, "--beam", str(e["beam"])]
    if e["lenpen_form"] == "gnmt":
        cmd += ["--nbest", str(e["beam"]), "--unnormalized"]
    else:
        cmd += ["--lenpen", str(e["lenpen"])]
    cmd += ["--max-len-a", "1.5", "--max-len-b", "50"]
    cmd += ["--batch-size", "64"] if study.train["recipe"] == "toy" else ["--max-tokens", str(e["max_tokens"])]
    if study.config["corpus"]["name"] != "toy" and (not study.split or study.split["unit"] == "words"):
        cmd += ["--remove-bpe=sentencepiece" if study.config["corpus"]["bpe"] == "sentencepiece" else "--remove-bpe"]
    if study.train["device"] == "cpu":
        cmd += ["--cpu"]
    else:  # fairseq-generate decodes on one GPU; --amp is a training option: it decodes in fp32
        cmd += {"fp16": ["--fp16"], "memory-efficient-fp16": ["--fp16"], "bf16": ["--bf16"]}.get(
            study.train["precision"], [])
    return cmd


def segmentation(study: "Study") -> str:
    """How the decoded H- and T- lines are segmented (scoring.py detok-generation --bpe)."""
    return decoded_segmentation(study.config)


def decoded_segmentation(config: dict) -> str:
    """:func:`segmentation` of a study's configuration (its record, study.json): the subwords of a
    split in subwords (decoded without --remove-bpe, S- lines too), else none (words)."""
    corpus, split = config.get("corpus") or {}, config.get("split")
    if corpus.get("name") == "toy" or not split or split.get("unit", "subwords") == "words":
        return "none"
    return "sentencepiece" if corpus.get("bpe") == "sentencepiece" else "subword_nmt"


def length_bins(config: dict):
    """The length report's (bins, unit), a pair: report.bins and report.unit where report.bins is
    set, else a split's split.bins and split.unit; None: no length report. A pair, since a unit is
    what its bins count; and report.bins, null unless given, says the report was asked for, where
    report.unit's default (words) is filled in whether given or not."""
    report, split = config.get("report") or {}, config.get("split")
    if report.get("bins"):
        return list(report["bins"]), report.get("unit", "words")
    if split:
        return list(split.get("bins") or []), split.get("unit", "subwords")
    return None
