"""What the preparation rules of recipes/rules/prepare.smk need when the workflow is parsed: the
corpus's files (the sources file and the archives of a shipped corpus, or the user's own files of
``corpus.name: files``) and the settings of each step (its params), which
recipes/posenc_workflow/prepare.py's subcommands run with."""
import difflib
import functools
import hashlib
import json
import os
from typing import Dict, List, NamedTuple, Optional

from posenc_workflow import prepare
from posenc_workflow.base import ROOT, ConfigError
from posenc_workflow.wmt_data import archive_path, read_sources


#: the fields of ``corpus`` that decide what a prepared corpus holds (its directory's name for
#: ``files``, the record a corpus.data directory keeps of the study that prepared it). Not
#: ``corpus.test``: a files corpus's named test sets are prepared apart, under the study
#: (OUT/tests/NAME/data), with the corpus's BPE and dictionary, so that adding one prepares only it
PREPARATION = ("name", "pair", "sources", "train", "valid", "tokenize", "bpe", "bpe_size")


class TestSet(NamedTuple):
    """A test set of the study: its name (the score lines'), the prefix of its prepared files
    (PREFIX.{src,tgt}, PREFIX.raw.{tgt}: in DATA for the corpus's own test set, in OUT/WHERE/data for
    a named one), its subset of the data-bin it is decoded from, and where its decodes go under OUT
    (``models``: beside the models; ``tests/NAME`` for the named test sets of a files corpus)."""
    name: str
    prefix: str
    subset: str
    where: str
    files: Optional[Dict[str, str]] = None  # {src, tgt} or {sacrebleu}: a files corpus's


def named_tests(config: dict) -> List[TestSet]:
    """The test sets of ``corpus.test`` (files), in their order, each binarized on its own."""
    tests = config.get("test") or {}
    return [TestSet(name, "test", "test", f"tests/{name}", dict(files)) for name, files in tests.items()]


#: corpus.clean's auto by corpus kind: fairseq's prepare-*.sh (Moses' clean-corpus-n)
CLEAN_AUTO = {"wmt": {"max_len": 250, "ratio": 1.5}, "files": {"max_len": 250, "ratio": 1.5},
              "iwslt": {"max_len": 175, "ratio": 1.5}}


def _clean_changes(config: dict, style: str) -> Dict:
    """The fields of corpus.clean that differ from fairseq's rule (auto): none for it, so that the
    directories, records and params of corpora prepared before corpus.clean existed stay theirs."""
    auto = CLEAN_AUTO.get(style, {})
    return {k: v for k, v in (config.get("clean") or {}).items() if v != "auto" and (k not in auto or v != auto[k])}


def _preparation(config: dict, style: str) -> Dict:
    clean = _clean_changes(config, style)
    return {k: config.get(k) for k in PREPARATION} | ({"clean": clean} if clean else {})


def files_data_dir(config: dict, src: str, tgt: str) -> str:
    """A files corpus's directory when corpus.data is not set: named by its preparation settings,
    so that two studies that prepare the same files otherwise never share (nor undo) one."""
    settings = json.dumps(_preparation(config, "files"), sort_keys=True)
    return os.path.join("data", f"files_{src}_{tgt}_{hashlib.sha1(settings.encode()).hexdigest()[:8]}")


def count_lines(path: str) -> int:
    """prepare.py's count (what its gather refuses on), once a file's content as its size and time
    say: a parse of the workflow builds a Corpus more than once (prepare.smk, plan.py)."""
    stat = os.stat(path)
    return _count_lines(os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _count_lines(path: str, size: int, mtime: int) -> int:
    return prepare.count_lines(path)


class Corpus:
    """What the rules of a corpus need when the workflow is parsed: its files and each step's settings."""

    def __init__(self, study):
        c = study.config["corpus"]
        self.study, self.style = study, study.facts["style"]
        self.langs = (study.src, study.tgt)
        self.data = study.data
        self.workers = int(c["workers"])
        self.bpe = c["bpe"]
        self.bpe_size = c.get("bpe_size") or study.facts["bpe_size"]
        self.tests = named_tests(c) if self.style == "files" else [TestSet("test", "test", "test", "models")]
        self.clean_changes = _clean_changes(c, self.style)
        if self.style == "toy" and self.clean_changes:
            name, value = next(iter(self.clean_changes.items()))
            raise ValueError(f"corpus.clean.{name} {json.dumps(value)}: corpus.name toy is the demo's generated pair, "
                             "which is not cleaned")
        if self.style == "files":
            self._check_files(c)
            self.valid = c.get("valid") or "split"
            self.has_valid = self.valid != "split"
            return
        self.sources = c.get("sources") or os.path.join(ROOT, "recipes", c["name"], "sources")
        self.valid = c.get("valid") or study.facts["valid"]
        if self.valid not in ("split", study.facts["valid_name"]):
            raise ValueError(f"corpus.valid {self.valid}: split (every {study.facts['valid_every']}th training "
                             f"pair, as fairseq) or {study.facts['valid_name']}")
        self.has_valid = self.style == "wmt" and self.valid != "split"

    def _check_files(self, c):
        # the shipped corpora's archive settings, given to a files corpus, are refused by settings.py
        if not c.get("train") or not c.get("test"):
            raise ValueError("corpus.name files: set corpus.train {src: FILE, tgt: FILE} and corpus.test "
                             "{NAME: {src: FILE, tgt: FILE}, ...}")
        valid = c.get("valid")
        if isinstance(valid, str) and valid != "split":
            raise ValueError(f"corpus.valid {valid}: split (every {self.study.facts['valid_every']}th training pair) "
                             "or {src: FILE, tgt: FILE}")
        pairs = [("train", c["train"])] + ([("valid", valid)] if isinstance(valid, dict) else [])
        for test in self.tests:
            if "sacrebleu" in test.files:
                if set(test.files) != {"sacrebleu"}:
                    raise ValueError(f"corpus.test.{test.name}: {{sacrebleu: NAME}} or {{src: FILE, tgt: FILE}}, not both")
                self._check_sacrebleu(test, c)
            elif set(test.files) != {"src", "tgt"}:
                raise ValueError(f"corpus.test.{test.name}: set src and tgt (or sacrebleu: NAME)")
            else:
                pairs.append((f"test.{test.name}", test.files))
        for where, pair in pairs:
            for side in ("src", "tgt"):
                if not os.path.isfile(pair[side]):
                    raise ValueError(f"corpus.{where}.{side}: no file {pair[side]} (paths are read from the "
                                     f"working directory, {os.getcwd()})")
            counts = [count_lines(pair[side]) for side in ("src", "tgt")]
            if counts[0] != counts[1] or not counts[0]:
                raise ValueError(f"corpus.{where}: {pair['src']} has {counts[0]:,} lines, {pair['tgt']} {counts[1]:,}: "
                                 "a pair is a line of each, and there must be one")

    def _check_sacrebleu(self, test: TestSet, c: dict):
        """A sacrebleu test set by name: one sacrebleu knows for this pair, and raw text (its
        references are scored as given: a model of text already tokenized would meet raw text)."""
        from sacrebleu.dataset import DATASETS  # sacrebleu's import is slow: only a named test set needs it

        name, pair = test.files["sacrebleu"], "-".join(self.langs)
        if name not in DATASETS:
            close = difflib.get_close_matches(name, list(DATASETS), n=3)
            raise ValueError(f"corpus.test.{test.name}: sacrebleu has no test set {name}"
                             + (f"; did you mean {' or '.join(close)}?" if close else " (sacrebleu --list names them)"))
        if pair not in DATASETS[name].langpairs:
            raise ValueError(f"corpus.test.{test.name}: sacrebleu's {name} has no {pair} (it has "
                             f"{', '.join(sorted(DATASETS[name].langpairs))})")
        if c.get("tokenize") == "none":
            raise ValueError(f"corpus.test.{test.name} {{sacrebleu: {name}}} with corpus.tokenize none: sacrebleu's "
                             "text is raw, the model's tokenized as given; give the test set as files tokenized as "
                             "your training text, or set corpus.tokenize: moses for raw files")

    def own_files(self) -> List[str]:
        """The user's training (and validation) files: the gather rule's inputs (an edit prepares
        the corpus again). A named test set's files are its own rule's (:meth:`test_files`)."""
        c = self.study.config["corpus"]
        pairs = [c["train"]] + ([c["valid"]] if self.has_valid else [])
        return [pair[side] for pair in pairs for side in ("src", "tgt")]

    def gather_settings(self) -> str:
        """Where gather reads each split of a files corpus (prepare.py gather): DATA/raw's sources."""
        c = self.study.config["corpus"]
        splits = {"train": c["train"], **({"valid": c["valid"]} if self.has_valid else {})}
        return json.dumps({**self.settings(), "splits": splits}, sort_keys=True)

    @property
    def corpus_tests(self) -> List[TestSet]:
        """The test sets prepared with the corpus (DATA/test.*): a shipped corpus's; a files
        corpus's named test sets are prepared apart (:meth:`test_settings`)."""
        return [] if self.style == "files" else self.tests

    def test(self, name: str) -> TestSet:
        return next(t for t in self.tests if t.name == name)

    def test_files(self, name: str) -> List[str]:
        """A named test set's own files (none for sacrebleu's): its prepare_test job's inputs."""
        files = self.test(name).files
        return [files["src"], files["tgt"]] if "src" in files else []

    def test_settings(self, name: str) -> str:
        """What prepare.py test prepares a named test set with: its files (or sacrebleu's name),
        the tokenizer and the corpus's BPE; the corpus's dictionary is an input, not a setting."""
        return json.dumps({**self.settings(), "bpe": self.bpe, "files": self.test(name).files, "name": name},
                          sort_keys=True)

    def splits(self, valid: Optional[bool] = None) -> List[str]:
        """The prefixes of the text the steps write: train, valid (where the corpus has its own, or
        ``valid`` is True), and the corpus's test set (a shipped corpus's)."""
        valid = self.has_valid if valid is None else valid
        return ["train"] + (["valid"] if valid else []) + [t.prefix for t in self.corpus_tests]

    @classmethod
    def of(cls, study):
        try:
            return cls(study)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def _archives(self):
        return read_sources(self.sources, *self.langs)

    def archive_paths(self) -> List[str]:
        return [archive_path(self.study.config["corpus"]["archives"], a.file) for a in self._archives()[0]]

    def archive_names(self) -> List[str]:
        """FILE of every archive of the sources file (``iwslt14/de-en.tgz``)."""
        return [a.file for a in self._archives()[0]]

    def _common(self) -> List[str]:
        return ["--sources", self.sources, "--raw-dir", self.study.config["corpus"]["archives"],
                "--src", self.langs[0], "--tgt", self.langs[1]]

    def fetch_options(self) -> List[str]:
        """How the archives are fetched and checked (corpus.download, download_timeout, mirror,
        verify_checksums): not what they hold, so not a param (another timeout must not prepare the
        corpus again)."""
        c = self.study.config["corpus"]
        return (["--timeout", repr(float(c["download_timeout"]))] + ([] if c["download"] else ["--no-download"])
                + ([] if c["verify_checksums"] else ["--no-verify"]) + (["--mirror", c["mirror"]] if c["mirror"] else []))

    def download_command(self) -> List[str]:
        """wmt_data.py fetch, downloading what is missing (unless corpus.download is false): the
        download rule's, with --only ARCHIVE."""
        return ["fetch", *self._common(), *self.fetch_options()]

    def verify_command(self) -> List[str]:
        """wmt_data.py fetch of every archive, checked, none downloaded: the extract rule's first step."""
        return ["fetch", *self._common(), *[o for o in self.fetch_options() if o != "--no-download"], "--no-download"]

    def space_command(self) -> List[str]:
        """plan.py prepare-space of the archives the pair reads: before their text is extracted."""
        return ["--work", self.data, "--recipe", self.study.corpus_name, "--sources", self.sources,
                "--archives-dir", self.study.config["corpus"]["archives"], "--src", self.langs[0], "--tgt", self.langs[1]]

    def extract_command(self) -> List[str]:
        return ["extract", *self._common(), "--out-dir", os.path.join(self.data, "raw")]

    def settings(self) -> Dict:
        out = {"style": self.style, "src": self.langs[0], "tgt": self.langs[1]}
        if self.style == "files":
            out["tokenize"] = self.study.config["corpus"]["tokenize"]
        return out

    def settings_json(self) -> str:
        return json.dumps({**self.settings(), "bpe": self.bpe}, sort_keys=True)

    def _tests(self) -> Dict:
        # the shipped corpora's one test set keeps its settings as they were (nothing to prepare
        # again); a files corpus prepares none with its training data
        return {"tests": []} if self.style == "files" else {}

    def tokenize_settings(self) -> str:
        return json.dumps({**self.settings(), "splits": self.splits(), **self._tests()}, sort_keys=True)

    def segment_settings(self) -> str:
        # the ratio only where it is not fairseq's: the params of corpora prepared before stay as
        # they were (others would prepare them again, and retrain every model on them)
        clean = {"max_len": CLEAN_AUTO[self.style]["max_len"], **self.clean_changes}
        return json.dumps({**self.settings(), "bpe": self.bpe, "bpe_size": self.bpe_size,
                           "valid": self.valid if isinstance(self.valid, str) else "given",
                           "valid_every": self.study.facts["valid_every"], **clean, **self._tests()}, sort_keys=True)

    def binarize_settings(self) -> str:
        return json.dumps({**self.settings(), "joined_dictionary": self.style != "iwslt", **self._tests()},
                          sort_keys=True)

    def preparation(self) -> Dict:
        """What decides the prepared corpus (the record DATA/prepared.json keeps, prepare.py record)."""
        return _preparation(self.study.config["corpus"], self.style) | {"pair": "-".join(self.langs),
                                                                        "bpe_size": self.bpe_size}

    def prepared_record(self) -> Optional[dict]:
        """DATA/prepared.json (which study prepared DATA, with what), None where there is none."""
        try:
            with open(os.path.join(self.data, "prepared.json"), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def preparation_changes(self, record: dict, shown: str) -> str:
        """Each ``corpus.FIELD`` whose value in ``record`` (DATA/prepared.json) differs from this
        study's, as ``shown`` formats it from the two values' JSON (``{theirs}``, ``{ours}``)."""
        theirs, ours = record.get("preparation") or {}, json.loads(json.dumps(self.preparation()))
        return ", ".join(f"corpus.{k} " + shown.format(theirs=json.dumps(theirs.get(k)), ours=json.dumps(ours.get(k)))
                         for k in sorted(set(theirs) | set(ours)) if theirs.get(k) != ours.get(k))

    def check_owner(self, out: str):
        """ValueError (one line) when DATA was prepared by another study (OUT) with other settings:
        this one would prepare it again in place, under that study's models."""
        record = self.prepared_record()
        if record is None or record.get("study") == out:
            return
        changed = self.preparation_changes(record, "{theirs} (here {ours})")
        if not changed:
            return
        raise ValueError(f"corpus.data {self.data} was prepared by the study {record.get('study')} with {changed}: "
                         "preparing it again here would undo that study's corpus; set corpus.data to another "
                         "directory (or delete this one)")

    def bpe_model(self) -> str:
        return os.path.join(self.data, "bpe", "spm.model" if self.bpe == "sentencepiece" else "code")
