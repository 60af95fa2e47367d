"""Markers derived from where a test lives, so that a new file cannot slip past them: every test
outside tests/unit is ``slow`` (it runs fairseq's CLI, the workflow or the docs' programs), and so
is a unit test marked ``slow`` by hand (one that trains through fairseq-train or starts a Python
process). ``make test-fast`` runs the rest and the one test marked ``fast_run``: the plugin's
units and a single fairseq-train run. Helpers shared by several folders are in tests/helpers.

The tests refuse to start when the plugin or the workflow would be imported from another checkout
than theirs (a second clone run with the first clone's virtualenv), as recipes/Snakefile does."""
import importlib.util
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNIT = os.path.join(REPO, "tests", "unit") + os.sep
#: the packages under test, and their folders in this checkout
PACKAGES = {"fairseq_posenc": "fairseq_posenc", "posenc_workflow": os.path.join("recipes", "posenc_workflow")}


def pytest_configure(config):
    for package, folder in PACKAGES.items():
        spec = importlib.util.find_spec(package)  # found, not imported: no torch before a refusal
        found = os.path.dirname(spec.origin) if spec and spec.origin else "nowhere"
        if os.path.realpath(found) != os.path.realpath(os.path.join(REPO, folder)):
            raise pytest.UsageError(
                f"{package} is imported from {found}, not from this checkout ({REPO}): run the tests with "
                f"PYTHONPATH={REPO}:{REPO}/recipes, or `pip install -e .` in {REPO}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("fast_run"):
            continue
        if not str(item.path).startswith(UNIT):
            item.add_marker(pytest.mark.slow)
