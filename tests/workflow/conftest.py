"""The fixtures of the workflow's tests: the demo's toy corpus prepared once a module by the
workflow's own rule, and a copy of it for each test (helpers/snakemake_runs.py runs Snakemake)."""
import shutil

import pytest

from helpers.snakemake_runs import STUDY, ok
from helpers.snakemake_server import snakemake


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The toy corpus, prepared once by the workflow's own rule."""
    base = tmp_path_factory.mktemp("corpus")
    ok(snakemake(str(base), STUDY, "corpus/data-bin"))
    return str(base / "corpus")


@pytest.fixture
def work(corpus, tmp_path):
    shutil.copytree(corpus, tmp_path / "corpus")
    # the copy is as old as the original: nothing upstream looks newer than the corpus
    return str(tmp_path)
