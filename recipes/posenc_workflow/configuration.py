"""A study's configuration read and resolved: the validated configuration (the schema's defaults
applied) as its corpus, rows, seeds and models, refused in one line where it cannot run
(recipes/posenc_workflow/settings.py's refusals, each row's model built tiny: rows.py), and each
model's settings with ``auto`` resolved (its budget, learning rate, checkpoints averaged)."""
from typing import List, Optional

from posenc_workflow import paths, settings
from posenc_workflow.base import VANILLA, WARM_STARTED, ConfigError
from posenc_workflow.choices import ARCHS, CORPORA, RECIPE_AUTO
from posenc_workflow.corpus import TestSet, named_tests
from posenc_workflow.rows import Model, Row, parse_rows, preflight_label, study_models
from posenc_workflow.segments import decoded_segmentation, length_bins


class Configuration:
    """A validated configuration (the schema's defaults applied) as its rows, models and settings."""

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
        self.data = corpus.get("data") or paths.corpus_data(corpus, self.out, self.corpus_name, self.src, self.tgt)
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
        settings.check(self, given)
        # (the toy pair has no subwords: a word is one)
        if (length_bins(config) or ("", ""))[1] == "subwords" and decoded_segmentation(config) == "none" \
                and corpus["name"] != "toy":
            raise ConfigError("report.unit subwords: the decoded sources are words here (no split in subwords: "
                              "decoded with --remove-bpe); set report.unit words, or split.unit subwords")
        self._check_rows(preflight)
        self.models = study_models(self.rows, self.seeds, self.warm, config.get("distillation") or {})

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

    def test_sets(self):
        """Every test set decoded, scored and reported apart (corpus.TestSet): the corpus's, or a
        files corpus's named ones; with a split, first the long pairs it set aside."""
        if self.config["corpus"]["name"] != "files":
            return [TestSet(self.test_set(), "test", "test", "models")]
        named = named_tests(self.config["corpus"])
        return ([TestSet(self.test_set(), "test", "test", "models")] if self.split else []) + named

    def test_set(self) -> str:
        """What the test decode translates (the score lines' name of it): the corpus's test set, or
        with a split the training pairs it set aside as too long to train on."""
        if self.split:
            return f"split-long-pairs(source>={self.split['train_below']}-{self.split['unit']})"
        return self.facts["test_name"]

    # -- rows and models ---------------------------------------------------------------------------
    def _check_rows(self, preflight: bool):
        # the plugin's registry: torch, fairseq (seconds), imported where the rows are checked
        from fairseq_posenc.models.from_flags import MODEL_SIZES
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
        size = self.arch if self.arch in MODEL_SIZES else "tiny"
        for row in self.rows:
            try:
                row.label = preflight_label(row.encoding, self.model_flags(row.encoding) + row.flags, size,
                                            warm_start=bool(self.warm.get("enabled")))
            except (ValueError, SystemExit) as e:
                raise ConfigError(f"models.encodings {row.spec}: {e}") from None

    def row(self, slug: str) -> Row:
        return next(r for r in self.rows if r.slug == slug)

    def model(self, name: str, seed) -> Model:
        return next(m for m in self.models if m.name == name and m.seed == int(seed))

    def evaluated(self) -> List[Model]:
        """The models decoded and scored (a vanilla stage is a start, not a result)."""
        return [m for m in self.models if m.kind != "vanilla"]

    # -- each model's settings, ``auto`` resolved ------------------------------------------------
    def model_flags(self, encoding: str) -> List[str]:
        """The study's model flags for ``encoding``: its own (model_flags), the bias scale where the
        encoding takes one, and the per-encoding overrides."""
        from fairseq_posenc.positions import POSITION_ENCODINGS  # the plugin's registry: torch, fairseq (seconds)
        from fairseq_posenc.positions.bias_scale import uses_bias_scale

        flags = [str(f) for f in self.train.get("model_flags", [])]
        scale = self.train.get("position_bias_scale")
        if scale is not None and uses_bias_scale(POSITION_ENCODINGS[encoding]):
            flags += ["--position-bias-scale", repr(float(scale))]
        flags += [str(f) for f in (self.train.get("encoding_flags") or {}).get(encoding, [])]
        return flags

    def model_arch(self, model: Model) -> str:
        """The model's ``models.arch``: the study's, or a distilled student's ``distillation.arch``."""
        return self.config["distillation"]["arch"] if model.kind == "distilled" else self.arch

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
