"""What the preparation rules of recipes/rules/prepare.smk need when the workflow is parsed: the
corpus's files (the sources file, the archives) and the settings of each step (its params), which
fairseq_posenc/recipe/prepare.py's subcommands run with."""
import json
import os
from typing import Dict, List

from .workflow import ROOT, ConfigError


class Corpus:
    """What the rules of a corpus need when the workflow is parsed: its files and each step's settings."""

    def __init__(self, study):
        c = study.config["corpus"]
        self.study, self.style = study, study.facts["style"]
        self.langs = (study.src, study.tgt)
        self.data = study.data
        self.workers = int(c["workers"])
        self.sources = c.get("sources") or os.path.join(ROOT, "recipes", c["name"], "sources")
        self.valid = c.get("valid") or study.facts["valid"]
        if self.valid not in ("split", study.facts["valid_name"]):
            raise ValueError(f"corpus.valid {self.valid}: split (every {study.facts['valid_every']}th training "
                             f"pair, as fairseq) or {study.facts['valid_name']}")
        self.has_valid = self.style == "wmt" and self.valid != "split"
        self.bpe = c["bpe"]
        self.bpe_size = c.get("bpe_size") or study.facts["bpe_size"]

    @classmethod
    def of(cls, study):
        try:
            return cls(study)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def _archives(self):
        from .wmt_data import read_sources

        return read_sources(self.sources, *self.langs)

    def archive_paths(self) -> List[str]:
        from .wmt_data import archive_path

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

    def extract_command(self) -> List[str]:
        return ["extract", *self._common(), "--out-dir", os.path.join(self.data, "raw")]

    def settings(self) -> Dict:
        return {"style": self.style, "src": self.langs[0], "tgt": self.langs[1]}

    def settings_json(self) -> str:
        return json.dumps({**self.settings(), "bpe": self.bpe}, sort_keys=True)

    def tokenize_settings(self) -> str:
        return json.dumps({**self.settings(), "splits": ["train", "valid", "test"] if self.has_valid
                           else ["train", "test"]}, sort_keys=True)

    def segment_settings(self) -> str:
        return json.dumps({**self.settings(), "bpe": self.bpe, "bpe_size": self.bpe_size, "valid": self.valid,
                           "valid_every": self.study.facts["valid_every"],
                           "max_len": 175 if self.style == "iwslt" else 250}, sort_keys=True)

    def binarize_settings(self) -> str:
        return json.dumps({**self.settings(), "joined_dictionary": self.style != "iwslt"}, sort_keys=True)

    def bpe_model(self) -> str:
        return os.path.join(self.data, "bpe", "spm.model" if self.bpe == "sentencepiece" else "code")
