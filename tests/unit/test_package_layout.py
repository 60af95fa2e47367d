"""The plugin package (fairseq_posenc: what --user-dir loads and what a user of the plugin imports)
imports nothing of the workflow (recipes/posenc_workflow) nor any other Python of the checkout
(scripts/, tests/), counting the imports made inside functions, and holds nothing that --user-dir
leaves unloaded without a reason; the workflow's package, the scripts and the tests import the
plugin, the workflow and the scripts by their names or files, never through sys.path edits;
setup.py's console scripts are the workflow's modules that run as commands."""
import ast
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGIN = os.path.join(REPO, "fairseq_posenc")
WORKFLOW = os.path.join(REPO, "recipes", "posenc_workflow")


def modules(folder):
    for directory, subdirs, files in os.walk(folder):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        yield from (os.path.join(directory, f) for f in sorted(files) if f.endswith(".py"))


def imported(path):
    """Every module name ``path`` imports (``from . import x`` resolved against its package), at
    module level or inside a function."""
    package = os.path.relpath(os.path.dirname(path), REPO).split(os.sep)
    names = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), filename=path)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names += [module] + [f"{module}.{alias.name}" for alias in node.names]
    return names


def other_python_of_the_checkout():
    """The top-level names the checkout's Python outside the plugin would be imported by: the
    workflow's package, the scripts, the tests' modules."""
    names = {"posenc_workflow"}
    for folder in ("scripts", "tests"):
        names |= {f[:-3] for f in os.listdir(os.path.join(REPO, folder)) if f.endswith(".py")}
    return names


@pytest.mark.parametrize("path", list(modules(PLUGIN)), ids=lambda p: os.path.relpath(p, REPO))
def test_the_plugin_imports_nothing_of_the_workflow(path):
    outside = other_python_of_the_checkout()
    wrong = sorted({name for name in imported(path) if name.split(".")[0] in outside})
    assert not wrong, f"{os.path.relpath(path, REPO)} imports {wrong}: the plugin must not import the workflow"


def test_the_walk_sees_imports_inside_functions():
    # row_names.py, the workflow's, reads train_config inside a function: the walk finds it
    assert "posenc_workflow.train_config" in imported(os.path.join(WORKFLOW, "row_names.py"))
    assert "fairseq_posenc.models.config" in imported(os.path.join(PLUGIN, "labels.py"))


def _is_sys_path(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def sys_path_edits(source: str, name: str = "<source>"):
    """The lines of Python ``source`` that change ``sys.path``: one of its list methods that edit it
    called, it or an item of it assigned, pytest's ``syspath_prepend``."""
    lines = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr == "syspath_prepend" or _is_sys_path(node.func.value) and node.func.attr in (
                    "insert", "append", "extend", "remove", "pop", "clear")):
            lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                while isinstance(target, ast.Subscript):
                    target = target.value
                if _is_sys_path(target):
                    lines.append(node.lineno)
    return sorted(lines)


def test_the_sys_path_check_sees_each_kind_of_edit():
    source = ("import sys\nsys.path.insert(0, 'a')\nsys.path[:0] = ['b']\nsys.path += ['c']\n"
              "def t(monkeypatch):\n    monkeypatch.syspath_prepend('d')\nprint(sys.path.index('a'), 'sys.path.insert')\n")
    assert sys_path_edits(source) == [2, 3, 4, 6]


@pytest.mark.parametrize("path", [*modules(PLUGIN), *modules(WORKFLOW), *modules(os.path.join(REPO, "scripts")),
                                  os.path.join(REPO, "recipes", "Snakefile"), *modules(os.path.join(REPO, "tests"))],
                         ids=lambda p: os.path.relpath(p, REPO))
def test_no_sys_path_edit_imports_the_packages(path):
    with open(path, encoding="utf-8") as f:
        source = f.read()
    if path.endswith(".py"):
        edits = sys_path_edits(source, path)
    else:  # the Snakefile: Snakemake's syntax, not Python's
        edits = [n for n, line in enumerate(source.splitlines(), 1) if "sys.path.insert" in line or "sys.path.append" in line]
    assert not edits, (f"{os.path.relpath(path, REPO)} edits sys.path (line {edits[0]}): import the packages by their "
                       "installed names, a script by its file (tests/helpers/scripts.py)")


#: the plugin's modules that loading it as fairseq does (--user-dir) leaves unloaded, and why each
#: is the plugin's: everything else it ships is what registers and runs models, loaded by every
#: fairseq command, and code that only the workflow or the scripts use is the workflow's
LOADED_ON_DEMAND = {
    "fairseq_posenc.labels": "a model's label read from its checkpoint, a program of the plugin (python -m "
                             "fairseq_posenc.labels CHECKPOINT) that the workflow's label rule runs",
    "fairseq_posenc.bias_bound": "how far each encoding's learned biases could move and did, read from the "
                                 "encodings' own parameters in a checkpoint (the demo's bias table)",
}


@pytest.mark.slow  # a Python process that imports fairseq
def test_user_dir_loads_every_module_of_the_plugin_but_those_loaded_on_demand():
    script = ("import argparse, sys\nfrom fairseq.utils import import_user_module\n"
              f"import_user_module(argparse.Namespace(user_dir={PLUGIN!r}))\n"
              "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] == 'fairseq_posenc')))\n")
    loaded = set(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                cwd=REPO).stdout.split())
    shipped = {".".join(["fairseq_posenc", *os.path.relpath(path, PLUGIN)[:-3].split(os.sep)]).removesuffix(".__init__")
               for path in modules(PLUGIN)}
    assert "fairseq_posenc.positions.alibi" in loaded
    unloaded = shipped - loaded
    assert unloaded <= set(LOADED_ON_DEMAND), (
        f"--user-dir leaves {sorted(unloaded - set(LOADED_ON_DEMAND))} unloaded: move them to the workflow "
        "(recipes/posenc_workflow) if only the workflow or the scripts use them, else add them to LOADED_ON_DEMAND "
        "with the reason")
    assert unloaded == set(LOADED_ON_DEMAND), f"{sorted(set(LOADED_ON_DEMAND) - unloaded)}: loaded by --user-dir now"


def runs_as_command(path: str) -> bool:
    """Whether the module at ``path`` has a ``main`` callable without arguments (what a console
    script calls) and calls something under ``if __name__ == "__main__":``."""
    tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    main = next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main"), None)
    guarded = any(isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
                  for node in tree.body)
    return guarded and main is not None and len(main.args.defaults) == len(main.args.posonlyargs + main.args.args) \
        and None not in main.args.kw_defaults


def test_the_console_scripts_are_the_workflow_modules_that_run_as_commands():
    tree = ast.parse(open(os.path.join(REPO, "setup.py"), encoding="utf-8").read())
    listed = next((ast.literal_eval(node.value) for node in tree.body
                   if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["WORKFLOW_STEPS"]), None)
    assert listed is not None, "setup.py names no WORKFLOW_STEPS: its console scripts are listed by hand"
    commands = [os.path.basename(p)[:-3] for p in modules(WORKFLOW) if runs_as_command(p)]
    assert sorted(listed) == sorted(commands)
    # run_args.py runs as a file only: its main takes the arguments run.sh gives it
    assert "run_args" not in commands and runs_as_command(os.path.join(WORKFLOW, "scoring.py"))


def test_no_test_module_imports_another():
    """What test modules share is a helper (tests/helpers) or a fixture (a conftest.py): a test module
    imported by another would run its tests' module-level code, and pytest collects each once."""
    tests = os.path.join(REPO, "tests")
    test_modules = {os.path.basename(p)[:-3] for p in modules(tests) if os.path.basename(p).startswith("test_")}
    wrong = {os.path.relpath(path, REPO): sorted({name.split(".")[0] for name in imported(path)} & test_modules)
             for path in modules(tests)}
    assert not {path: names for path, names in wrong.items() if names}
