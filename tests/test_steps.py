"""fairseq_posenc/recipe/steps.py: a step is redone when its settings change, its marker is gone, or the step
before it ran again; and so, in turn, is every step after it."""
import os
import sys

import pytest

from fairseq_posenc.recipe import steps  # noqa: E402

CHAIN = [("extract", "", {"pair": "en-de"}), ("tokenize", "extract", {}), ("learn_bpe", "tokenize", {"size": "60"}),
         ("apply_bpe", "learn_bpe", {}), ("clean", "apply_bpe", {"ratio": "1.5"})]


def _run_chain(directory, chain):
    """What the recipe does: each stale step runs (its marker rewritten); returns those that ran."""
    ran = []
    for name, after, settings in chain:
        if steps.stale_reason(directory, name, after, settings):
            steps.mark_done(directory, name, after, settings)
            ran.append(name)
    return ran


def test_a_changed_setting_redoes_its_step_and_every_later_one(tmp_path):
    d = str(tmp_path)
    assert _run_chain(d, CHAIN) == ["extract", "tokenize", "learn_bpe", "apply_bpe", "clean"]
    assert _run_chain(d, CHAIN) == []
    changed = [(n, a, {"size": "80"} if n == "learn_bpe" else s) for n, a, s in CHAIN]
    assert steps.stale_reason(d, "learn_bpe", "tokenize", {"size": "80"}) == "settings changed: size 60 -> 80"
    assert _run_chain(d, changed) == ["learn_bpe", "apply_bpe", "clean"]
    assert _run_chain(d, changed) == []


def test_a_deleted_marker_redoes_its_step_and_every_later_one(tmp_path):
    d = str(tmp_path)
    _run_chain(d, CHAIN)
    os.remove(tmp_path / "tokenize")
    assert steps.stale_reason(d, "tokenize", "extract", {}) == "not done yet"
    assert _run_chain(d, CHAIN) == ["tokenize", "learn_bpe", "apply_bpe", "clean"]


def test_an_older_recipes_empty_marker_is_redone(tmp_path):
    (tmp_path / "extract").write_text("")
    assert steps.stale_reason(str(tmp_path), "extract", "", {"pair": "en-de"}) == (
        "its marker records no settings (an older recipe's): redoing it")


def test_command_line_exit_status_and_reason(tmp_path, capsys):
    args = ["--dir", str(tmp_path), "--name", "learn_bpe", "--settings", "bpe=subword-nmt", "size=60"]
    with pytest.raises(SystemExit) as e:
        steps.main(["check", *args])
    assert e.value.code == 1 and capsys.readouterr().out == "not done yet\n"
    steps.main(["done", *args])
    steps.main(["check", *args])  # up to date: returns, exit 0
    with pytest.raises(SystemExit) as e:
        steps.main(["check", *args[:-1], "size=80"])
    assert e.value.code == 1 and capsys.readouterr().out == "settings changed: size 60 -> 80\n"


RECIPE_STEP = r"""
source "$ROOT/recipes/common.sh"
WORK="$1"; PYTHON="$ROOT/.venv/bin/python"
_make() { echo "$GREETING ${SIZE:-3} $(_suffix)" > "$WORK/out"; }
_suffix() { echo "${SUFFIX:-!} $CORPUS"; }
BODY
step make "make it" _make
"""


def _recipe_step(work, body="", **env):
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = RECIPE_STEP.replace("BODY", body)
    proc = subprocess.run(["bash", "-c", script, "bash", str(work)], capture_output=True, text=True,
                          env={**os.environ, "ROOT": root, "GREETING": "hi", "CORPUS": "/data/a", **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[0]


def test_a_recipe_step_is_keyed_by_its_functions_source_and_the_settings_they_read(tmp_path):
    """recipes/common.sh's step derives its key from the step itself, with no list of settings to
    keep: a setting read by its function or by a function that one runs (SUFFIX) redoes it, and so
    does an edit of either function; a location (a value with a "/": its content is declared as an
    input) and the workers' count do not."""
    assert _recipe_step(tmp_path) == "== make it"
    assert _recipe_step(tmp_path) == "== make it: done before, skipping (delete %s/.done/make to redo)" % tmp_path
    assert _recipe_step(tmp_path, GREETING="hello") == "== make it: redoing (settings changed: var.GREETING hi -> hello)"
    assert _recipe_step(tmp_path, GREETING="hello", SUFFIX="?") == (
        "== make it: redoing (settings changed: var.SUFFIX  -> ?)")
    same = dict(GREETING="hello", SUFFIX="?")
    assert "skipping" in _recipe_step(tmp_path, CORPUS="/data/b", WORKERS="7", **same)
    changed = _recipe_step(tmp_path, body='_suffix() { echo "${SUFFIX:-!}! $CORPUS"; }', **same)
    assert changed.startswith("== make it: redoing (settings changed: step.source "), changed
    assert "skipping" in _recipe_step(tmp_path, body='_suffix() { echo "${SUFFIX:-!}! $CORPUS"; }', **same)



TOOL_STEP = r"""
source "$ROOT/recipes/common.sh"
WORK="$1"; PYTHON="$ROOT/.venv/bin/python"; SCRIPTS="$TOOLS"
_tool() { "$PYTHON" "$SCRIPTS/tool.py" > "$WORK/out"; subword-nmt --help > /dev/null 2>&1 || true; }
step tool "run the tool" _tool
"""


def _tool_step(work, tools):
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(["bash", "-c", TOOL_STEP, "bash", str(work)], capture_output=True, text=True,
                          env={**os.environ, "ROOT": root, "TOOLS": str(tools)})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[0]


def test_a_step_is_keyed_by_the_code_of_the_programs_it_runs(tmp_path):
    """recipe/programs.py: a Python file a step runs is keyed by its source, the local modules it
    imports (transitively, function-level imports too) and the versions of the distributions they
    import; a command of the Python environment by its distribution's version. No version tag to
    bump by hand (the tokenizers had one)."""
    import json
    from importlib import metadata

    from fairseq_posenc.recipe import programs

    tools, work = tmp_path / "tools", tmp_path / "work"
    tools.mkdir()
    work.mkdir()
    (tools / "tool.py").write_text("import helper\nprint(helper.WORD)\n")
    (tools / "helper.py").write_text("def _late():\n    import sacremoses  # noqa\nWORD = 'a'\n")
    (tools / "unused.py").write_text("WORD = 'x'\n")
    assert _tool_step(work, tools) == "== run the tool"
    marker = json.loads((work / ".done" / "tool").read_text())["settings"]
    assert marker["program.subword-nmt"] == f"subword-nmt=={metadata.version('subword-nmt')}"
    assert marker["program.tool.py"] == programs.python_key(str(tools / "tool.py"), {})
    (tools / "unused.py").write_text("WORD = 'y'\n")  # not imported: nothing to redo
    assert _tool_step(work, tools) == f"== run the tool: done before, skipping (delete {work}/.done/tool to redo)"
    (tools / "helper.py").write_text("def _late():\n    import sacremoses  # noqa\nWORD = 'b'\n")
    assert _tool_step(work, tools).startswith("== run the tool: redoing (settings changed: program.tool.py ")
    assert (work / "out").read_text() == "b\n"
    # a distribution imported anywhere in the closure: its version is part of the key
    files, outside = programs.python_closure(str(tools / "tool.py"))
    assert sorted(os.path.basename(f) for f in files) == ["helper.py", "tool.py"] and outside == {"sacremoses"}
    key = programs.python_key(str(tools / "tool.py"), {})
    real = metadata.version
    try:
        metadata.version = lambda name: "9.9" if name == "sacremoses" else real(name)
        assert programs.python_key(str(tools / "tool.py"), {}) != key
    finally:
        metadata.version = real


def test_the_recipes_programs_are_found_with_their_local_modules():
    """The tokenizer's key covers text.py and sacremoses/sentencepiece; the length split's covers
    the plugin modules it imports, not the package's __init__ (it registers models)."""
    from fairseq_posenc.recipe import programs

    root = programs.ROOT
    files, outside = programs.python_closure(os.path.join(root, "fairseq_posenc/recipe/text.py"))
    assert [os.path.relpath(f, root) for f in files] == ["fairseq_posenc/recipe/text.py"]
    assert outside == {"sacremoses", "sentencepiece"}
    files, outside = programs.python_closure(os.path.join(root, "scripts/length_split.py"))
    names = {os.path.relpath(f, root) for f in files}
    assert {"scripts/length_split.py", "fairseq_posenc/length_bins.py", "fairseq_posenc/recipe/plan.py"} <= names
    assert "fairseq_posenc/__init__.py" not in names and {"fairseq", "torch"} <= outside
