"""The tests run the checkout they live in: pytest refuses, in one line and before any test, a
plugin or a workflow that would be imported from another checkout (a second clone run with the
first clone's virtualenv, which silently tested the first clone's code)."""
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _checkout(root, *own):
    """tests/conftest.py and pytest.ini in ``root`` with a passing test, and the packages ``own``
    (stand-ins: the conftest only finds them)."""
    os.makedirs(os.path.join(root, "tests"))
    shutil.copy(os.path.join(REPO, "tests", "conftest.py"), os.path.join(root, "tests"))
    shutil.copy(os.path.join(REPO, "pytest.ini"), root)
    with open(os.path.join(root, "tests", "test_one.py"), "w") as f:
        f.write("def test_one():\n    pass\n")
    for folder in own:
        os.makedirs(os.path.join(root, folder))
        open(os.path.join(root, folder, "__init__.py"), "w").close()
    return root


def _pytest(root, *path):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_one.py"],
                          cwd=root, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(path)})


def _refusal(package, found, root):
    return [f"ERROR: {package} is imported from {found}, not from this checkout ({root}): run the tests with "
            f"PYTHONPATH={root}:{root}/recipes, or `pip install -e .` in {root}"]


def test_a_plugin_from_another_checkout_is_refused_in_one_line(tmp_path):
    root = _checkout(str(tmp_path / "clone"))
    done = _pytest(root, REPO, os.path.join(REPO, "recipes"))
    assert done.returncode == 4
    refusal = _refusal("fairseq_posenc", f"{REPO}/fairseq_posenc", root)
    assert (done.stdout + done.stderr).strip().splitlines() == refusal


def test_a_workflow_from_another_checkout_is_refused_in_one_line(tmp_path):
    root = _checkout(str(tmp_path / "clone"), "fairseq_posenc")
    done = _pytest(root, root, os.path.join(REPO, "recipes"))
    assert done.returncode == 4
    refusal = _refusal("posenc_workflow", f"{REPO}/recipes/posenc_workflow", root)
    assert (done.stdout + done.stderr).strip().splitlines() == refusal


def test_the_checkout_s_own_packages_are_tested(tmp_path):
    root = _checkout(str(tmp_path / "clone"), "fairseq_posenc", os.path.join("recipes", "posenc_workflow"))
    done = _pytest(root, root, os.path.join(root, "recipes"))
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
