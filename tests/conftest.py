"""Markers derived from where a test lives, so that a new file cannot slip past them: every test
outside tests/unit is ``slow`` (it runs fairseq's CLI, the workflow or the docs' programs), and so
is a unit test marked ``slow`` by hand (one that trains through fairseq-train or starts a Python
process). ``make test-fast`` runs the rest and the one test marked ``fast_run``: the plugin's
units and a single fairseq-train run. Helpers shared by several folders are in tests/helpers."""
import os

import pytest

UNIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unit") + os.sep


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("fast_run"):
            continue
        if not str(item.path).startswith(UNIT):
            item.add_marker(pytest.mark.slow)
