"""The fixtures of the workflow's tests: the demo's toy corpus prepared once a run by the
workflow's own rule, and a copy of it for each test (helpers/snakemake_runs.py runs Snakemake)."""
import os
import shutil

import pytest
from filelock import FileLock

from helpers.snakemake_runs import STUDY, ok
from helpers.snakemake_server import snakemake


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """The toy corpus, prepared once a run by the workflow's own rule: the first of xdist's workers
    to ask prepares it under their shared base directory, the others wait for it and read it
    (pytest-xdist's recipe for a session fixture run once). Tests read it or copy it (work)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    base = shared / "prepared-corpus"
    with FileLock(str(shared / "prepared-corpus.lock")):
        if not (base / "done").exists():
            shutil.rmtree(base, ignore_errors=True)  # what a failed preparation left
            base.mkdir()
            ok(snakemake(str(base), STUDY, "corpus/data-bin"))
            (base / "done").touch()
    return str(base / "corpus")


@pytest.fixture
def work(corpus, tmp_path):
    shutil.copytree(corpus, tmp_path / "corpus")
    # the copy is as old as the original: nothing upstream looks newer than the corpus
    return str(tmp_path)
