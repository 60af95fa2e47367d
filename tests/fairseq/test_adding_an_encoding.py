"""docs/encodings.md's "Adding an encoding" works as written: its example, put in place by its two
steps in a git copy of the checkout (never the checkout itself), is one new file and one registry
line (the copy's diff shows nothing else), passes the tests that walk the registry there, is a
target of scripts/mutation_test.py there, trains through fairseq-train with the copy as
``--user-dir``, and decodes.

The page is read, not restated: the new file is its code block headed by the file's path, the
registry line its inline code in the numbered steps, and the walk takes its last step's ``pytest
-k`` selection. A step the page leaves out is a step these tests do not take, so the walk fails
where the page is incomplete. The checks of the trained model are the example's: its parameter
``r`` and how to switch its term off.
"""
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from importlib.util import module_from_spec, spec_from_file_location

import pytest
import torch
from fairseq.data import Dictionary

from posenc_workflow import toy_data
from helpers.fairseq_runs import outcome, preprocess_here, run_all
from helpers.toy import TINY

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(REPO, "docs", "encodings.md")
# the tests run in the copy: those that took a list of encodings by hand before the lists read the
# registry, and the registry walkers that run in this process (the ones that start fairseq
# processes cost 10-20 s each: the walk the page's last step asks for runs them)
WALKED = ["tests/fairseq/test_kept_keys.py", "tests/unit/test_sequence_direction.py", "tests/unit/test_plot_positions.py",
          "tests/unit/test_position_encodings.py", "tests/unit/test_position_gradients.py", "tests/unit/test_long_inputs.py",
          "tests/unit/test_kept_tables.py"]
UPDATES = 30
LR = 3e-3


def section(text, title="## Adding an encoding"):
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start:end if end >= 0 else len(text)]


def example():
    """What the page says to do: {"file": (path, code), "registry": entry, "name": str, "selection":
    the walk's -k expression}."""
    text = section(open(PAGE, encoding="utf-8").read())
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    new_files = [b for b in blocks if re.match(r"# fairseq_posenc/positions/\w+\.py\n", b)]
    assert len(new_files) == 1, "the page shows one new file under fairseq_posenc/positions/"
    path, code = new_files[0].split("\n", 1)
    entries = re.findall(r'`("(\w+)": "[\w.]+",)`', text)
    assert len(entries) == 1, "the page shows one registry line"
    commands = [shlex.split(line) for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)
                for line in block.splitlines() if "pytest" in line]
    assert len(commands) == 1 and "-k" in commands[0], "the page's last step runs pytest -k EXPRESSION"
    return {"file": (path[2:], code), "registry": entries[0][0], "name": entries[0][1],
            "selection": commands[0][commands[0].index("-k") + 1]}


def _edit(path, old, new):
    text = open(path, encoding="utf-8").read()
    assert text.count(old) == 1, f"{os.path.basename(path)}: {old!r} is not there once (the page is stale)"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new))


def _git(root, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                          capture_output=True, text=True).stdout


def build(root, steps):
    """A git copy of the package, the workflow, the tests and the scripts under ``root``, committed,
    then ``steps`` taken."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so")
    for part in ("fairseq_posenc", "recipes", "tests", "scripts"):
        shutil.copytree(os.path.join(REPO, part), os.path.join(root, part), ignore=ignore)
    shutil.copy(os.path.join(REPO, "pytest.ini"), root)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "the checkout")
    path, code = steps["file"]
    with open(os.path.join(root, path), "w", encoding="utf-8") as f:
        f.write(code)
    _edit(os.path.join(root, "fairseq_posenc", "positions", "__init__.py"), "\n}\n",
          "\n    " + steps["registry"] + "\n}\n")  # SCHEMES's end
    _git(root, "add", "-A")
    return root


@pytest.fixture(scope="module")
def steps():
    return example()


@pytest.fixture(scope="module")
def copy(steps, tmp_path_factory):
    return build(str(tmp_path_factory.mktemp("added")), steps)


def walk(root, selection, files=WALKED):
    """{test id: outcome} of the page's walk (its ``-k`` selection) over ``files`` in the copy, with
    the copy's package first on the path."""
    report = os.path.join(root, "walk.xml")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         "-k", selection, "--junitxml", report],
        cwd=root, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root}/recipes", "OMP_NUM_THREADS": "1"})
    assert os.path.exists(report), proc.stdout[-3000:] + proc.stderr[-3000:]
    outcomes = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        verdict = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                verdict = child.tag
        outcomes[f"{case.get('classname')}::{case.get('name')}"] = verdict
    return outcomes, proc.stdout


def test_the_page_s_steps_fit_together(steps):
    """What the other tests take from the page hangs together (a change of its wording that loses a
    step's file or name fails here, not only in the walk): the registry line names the new file's
    module and a class it defines."""
    path, code = steps["file"]
    module = os.path.splitext(os.path.basename(path))[0]
    entry = re.fullmatch(r'"(\w+)": "(\w+)\.(\w+)",', steps["registry"])
    assert entry and entry.group(1) == steps["name"] and entry.group(2) == module
    assert re.search(rf"^class {entry.group(3)}\(PositionEncoding\):", code, re.M)


def test_the_example_is_one_new_file_and_one_registry_line(copy, steps):
    path, code = steps["file"]
    registry = "fairseq_posenc/positions/__init__.py"
    changed = [line.split("\t") for line in _git(copy, "diff", "--cached", "--numstat").splitlines()]
    assert sorted(changed) == sorted([[str(code.count("\n")), "0", path], ["1", "0", registry]])
    assert _git(copy, "diff", "--cached", "-U0", registry).splitlines()[-1] == "+    " + steps["registry"]


def test_the_example_is_a_target_of_mutation_testing_with_the_registry_s_walks(copy, steps):
    spec = spec_from_file_location("copy_mutation_test", os.path.join(copy, "scripts", "mutation_test.py"))
    mutation = module_from_spec(spec)
    spec.loader.exec_module(mutation)
    assert mutation.ROOT == copy
    assert mutation.TARGETS[steps["file"][0]] == mutation.ENCODINGS == ["tests/unit/test_position_encodings.py"]


def test_the_example_passes_the_tests_that_walk_the_registry(copy, steps):
    outcomes, stdout = walk(copy, steps["selection"])
    ran = {t for t in outcomes if f"[{steps['name']}" in t}
    # each walked file has tests for the new encoding, and they ran (not deselected, not skipped
    # for want of a GPU)
    assert {t.split("::")[0] for t in ran} == {f[:-3].replace("/", ".") for f in WALKED}, sorted(ran)
    failed = {t: v for t, v in outcomes.items() if v in ("failure", "error")}
    assert not failed, stdout[-4000:]
    assert outcomes["tests.fairseq.test_kept_keys::test_the_encodings_that_keep_something_are_found"] == "passed"


def _scores(stdout):
    """{sentence: the positional scores (bits) fairseq-generate printed}."""
    return {int(i): [float(x) for x in values.split()] for i, values in re.findall(r"^P-(\d+)\t(.*)$", stdout, re.M)}


@pytest.fixture(scope="module")
def runs(copy, steps, tmp_path_factory):
    """fairseq-train of the example, then fairseq-generate: a beam search, and the reference
    scored (``--score-reference``) by the trained model, by the same checkpoint with the
    example's position term switched off (r2 = softplus(-200) = 0 in float32: a term of 0) and by
    the same weights loaded as ``--position-encoding none``."""
    name = steps["name"]
    root = tmp_path_factory.mktemp("runs")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (300, 3, 10), "valid": (40, 3, 10),
                                                              "test": (20, 3, 12)})
    data_bin = preprocess_here(prefixes, str(root / "bin"))
    user_dir = os.path.join(copy, "fairseq_posenc")
    trained = run_all([(name, "fairseq-train", [
        data_bin, "--user-dir", user_dir, "--save-dir", str(root / name), "--arch", f"transformer_{name}_iwslt_de_en",
        "--cpu", *TINY, "--optimizer", "adam", "--lr", str(LR), "--max-tokens", "1000",
        "--max-update", str(UPDATES), "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--no-epoch-checkpoints", "--no-progress-bar", "--seed", "3", "--num-workers", "0"])], str(root / "train"))
    outcome(trained, name)
    checkpoints = {"trained": str(root / name / "checkpoint_last.pt"), "off": str(root / "off.pt"),
                   "none": str(root / "none.pt")}
    state = torch.load(checkpoints["trained"], map_location="cpu", weights_only=False)
    off = torch.load(checkpoints["trained"], map_location="cpu", weights_only=False)
    for side in ("encoder", "decoder"):
        off["model"][f"{side}.position_encoding.r"][1] = -200.0
    torch.save(off, checkpoints["off"])
    for side in ("encoder", "decoder"):
        del off["model"][f"{side}.position_encoding.r"]
    off["cfg"]["model"].position_encoding = "none"
    off["cfg"]["model"].arch = off["cfg"]["model"]._name = "transformer_none_iwslt_de_en"
    torch.save(off, checkpoints["none"])
    jobs = [("decode", "fairseq-generate", [data_bin, "--user-dir", user_dir, "--path", checkpoints["trained"],
                                            "--beam", "4"])]
    jobs += [(what, "fairseq-generate", [data_bin, "--user-dir", user_dir, "--path", path, "--score-reference"])
             for what, path in checkpoints.items()]
    results = run_all(jobs, str(root / "generate"))
    return {"state": state, "dictionary": len(Dictionary.load(os.path.join(data_bin, "dict.src.txt"))),
            **{what: outcome(results, what)["stdout"] for what, _, _ in jobs}}


def test_the_example_trains_through_fairseq_train(runs, steps):
    state = runs["state"]
    assert state["cfg"]["model"].position_encoding == steps["name"]
    assert state["optimizer_history"][-1]["num_updates"] == UPDATES
    # the example's parameter is trained by fairseq's Adam from its initial ones: every entry moved,
    # and by no more than Adam moves it (about lr an update for a steady gradient, at most
    # (1 - beta1) / sqrt(1 - beta2) = 3.2 lr; measured: 0.03 in all, against 0.29)
    for side in ("encoder", "decoder"):
        r = state["model"][f"{side}.position_encoding.r"]
        assert r.shape == (2, 4)
        moved = (r - 1).abs()
        assert bool((moved > 0).all()), f"{side}: {r}"
        assert moved.max().item() <= 3.2 * LR * UPDATES, f"{side}: {r}"
    # it learned: below the label-smoothed loss of the uniform guess, log2 of the vocabulary (fairseq's
    # dictionary: the corpus's words and the special symbols), by a real margin (measured: 4.46 against 5.81)
    assert state["extra_state"]["val_loss"] < math.log2(runs["dictionary"]) - 0.5, state["extra_state"]


def test_the_output_depends_on_the_example_s_position_term_and_on_nothing_else_it_adds(runs):
    trained, off, none = (_scores(runs[k]) for k in ("trained", "off", "none"))
    assert sorted(trained) == sorted(off) == sorted(none) == list(range(20))
    pairs = [(a, b) for i in trained for a, b in zip(trained[i], off[i])]
    assert len(pairs) > 100
    # switched off, the term changes the reference's scores by far more than the 4 printed decimals
    # (measured: up to 1.85 bits a token)
    assert max(abs(a - b) for a, b in pairs) > 0.05
    # and the model without it is `none`'s: equal to the printed decimals (each rounded once; measured:
    # equal)
    for i in off:
        assert off[i] == pytest.approx(none[i], abs=1e-4 + 1e-6), f"sentence {i}"


def test_the_example_decodes_through_fairseq_generate(runs):
    hypotheses = re.findall(r"^H-(\d+)\t(\S+)\t", runs["decode"], re.M)
    assert sorted(int(i) for i, _ in hypotheses) == list(range(20))
    assert all(math.isfinite(float(score)) and float(score) <= 0 for _, score in hypotheses)
