"""scripts/mutation_test.py: only a failing test kills a mutant; a timeout, an interruption, an
error of pytest's own or no test collected is counted apart, out of the kill rate."""
import importlib.util
import os
import subprocess

import pytest
from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def mutation():
    spec = importlib.util.spec_from_file_location("mutation_test", os.path.join(ROOT, "scripts", "mutation_test.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_a_failing_test_is_a_kill(mutation):
    assert [mutation.outcome(status) for status in (0, 1, 2, 3, 4, 5, 124, 137)] == [
        "survived", "killed", "exit 2", "exit 3", "exit 4", "exit 5", "timeout", "timeout"]


def test_the_test_command_reports_pytests_status_which_decides_cosmic_rays_outcome(mutation, tmp_path):
    (tmp_path / "test_fails.py").write_text("def test_fails():\n    assert 1 == 2\n")
    (tmp_path / "test_none.py").write_text("X = 1\n")
    seen = {}
    for name in ("test_fails.py", "test_none.py"):
        done = subprocess.run(mutation.pytest_command([name], 60), shell=True, cwd=tmp_path, capture_output=True,
                              text=True)
        seen[name] = done.returncode
        # as cosmic-ray records it: any non-zero status is its KILLED, with the command's output
        result = WorkResult(worker_outcome=WorkerOutcome.NORMAL, output=done.stdout, test_outcome=TestOutcome.KILLED)
        seen[name + " outcome"] = mutation._cosmic_outcome(result)
    assert seen == {"test_fails.py": 1, "test_fails.py outcome": "killed",
                    "test_none.py": 5, "test_none.py outcome": "exit 5"}  # no test collected
    for outcome, output, expected in ((TestOutcome.KILLED, "timeout", "timeout"),
                                      (TestOutcome.INCOMPETENT, "Traceback", "incompetent"),
                                      (TestOutcome.SURVIVED, "pytest exit 0", "survived"),
                                      (TestOutcome.KILLED, "killed by a signal", "no status")):
        result = WorkResult(worker_outcome=WorkerOutcome.NORMAL, output=output, test_outcome=outcome)
        assert mutation._cosmic_outcome(result) == expected


def test_the_rate_counts_killed_and_survived_only(mutation):
    results = [{"outcome": o} for o in ("killed", "killed", "survived", "timeout", "exit 5", "incompetent", None)]
    assert mutation._counts(results) == {"killed": 2, "survived": 1, "timeout": 1, "exit 5": 1, "incompetent": 1,
                                         "not applied": 1}
