"""The files of the checkout that a Python file runs, read from its source: what it imports from
the checkout (``import x``, ``from .x import y``, at module level or inside a function: a lazy
import runs too when its function does), the modules beside it it names as ``"module.Name"`` (a
registry's ``import_module``: fairseq_posenc/positions/__init__.py's SCHEMES) and the scripts of the
checkout it names by file name (``"text.py"``, run as a subprocess), followed to the end.

recipes/Snakefile makes them the inputs of the rule that runs the file, so that an edit of any of
them runs the rule again (and, through its outputs, what follows), and an edit of another does
not; trained_code.code_key hashes those that ``fairseq_posenc/__init__.py`` runs (what fairseq's
``--user-dir`` loads to train a model). Derived from the source, not from a process's
``sys.modules``, so that it is the same whatever the process imported before.

``from pkg import name`` reads ``pkg/name.py`` when that is a module, else ``pkg/__init__.py``;
the parent packages Python initialises on the way are not followed. ``fairseq_posenc/__init__.py``
itself (the plugin's registration: every model, encoding and criterion) is never followed from
another file: that code reaches a rule's output through the model the rule reads, whose code key
retrains it.
"""
import ast
import functools
import os
import re
from typing import Iterable, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT_NAME = re.compile(r"[\w./-]+\.py")
# "module.Name": a module beside the file named by a string, as a registry imports it (import_module)
MODULE_NAME = re.compile(r"([A-Za-z_]\w*)\.[A-Za-z_]\w*")


def _module_file(directory: str) -> Optional[str]:
    """``directory.py`` or ``directory/__init__.py``, whichever exists; for a C++ extension
    ``pkg/_name`` (setup.py's), its source ``pkg/csrc/name.cpp``."""
    if os.path.isfile(directory + ".py"):
        return directory + ".py"
    init = os.path.join(directory, "__init__.py")
    if os.path.isfile(init):
        return init
    package, name = os.path.split(directory)
    extension = os.path.join(package, "csrc", name[1:] + ".cpp")
    return extension if name.startswith("_") and os.path.isfile(extension) else None


@functools.lru_cache(maxsize=None)
def _imported(path: str, root: str) -> Tuple[str, ...]:
    """What ``path`` imports or names as a script; kept, as a Snakefile asks for many rules."""
    tree = _parse(path)
    here = os.path.dirname(path)
    found = []

    def top(name: str) -> List[str]:
        """Where a top-level name is found: beside a file run as a script, in scripts/, at the root
        (the plugin), in recipes/ (the workflow's package, setup.py's package_dir)."""
        return [d for d in (here, os.path.join(root, "scripts"), root, os.path.join(root, "recipes"))
                if _module_file(os.path.join(d, name))]

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                for base in top(parts[0])[:1]:
                    found.append(_module_file(os.path.join(base, *parts)))
        elif isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".") if node.module else []
            if node.level:
                base = here
                for _ in range(node.level - 1):
                    base = os.path.dirname(base)
            else:
                bases = top(parts[0])
                if not bases:
                    continue
                base = bases[0]
            package = os.path.join(base, *parts)
            for alias in node.names:
                found.append(_module_file(os.path.join(package, alias.name)) or _module_file(package))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and SCRIPT_NAME.fullmatch(node.value):
            for base in (here, os.path.join(root, "scripts"), root):
                if os.path.isfile(os.path.join(base, node.value)):
                    found.append(os.path.join(base, node.value))
                    break
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.fullmatch(node.value):
            found.append(_module_file(os.path.join(here, MODULE_NAME.fullmatch(node.value).group(1))))
    return tuple(os.path.abspath(f) for f in found if f)


@functools.lru_cache(maxsize=None)
def _parse(path: str) -> ast.AST:
    if not path.endswith(".py"):
        return ast.Module(body=[], type_ignores=[])  # a C++ source: what it includes is not followed
    with open(path, "rb") as f:
        tree = ast.parse(f.read(), filename=path)
    # docstrings name files in prose, not what runs
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            node.body = node.body[1:]
    return tree


def sources(*paths: str, root: str = ROOT, stop: Iterable[str] = ()) -> Tuple[str, ...]:
    """The files ``paths`` run, themselves included, sorted (absolute paths); the files of
    ``stop`` are neither followed nor included."""
    plugin = os.path.abspath(os.path.join(root, "fairseq_posenc", "__init__.py"))
    stop = {os.path.abspath(p) for p in stop}
    start = [os.path.abspath(p) for p in paths]
    seen, todo = set(start), list(start)
    while todo:
        path = todo.pop()
        for found in _imported(path, root):
            if found not in seen and found != plugin and found not in stop and found.startswith(root + os.sep):
                seen.add(found)
                todo.append(found)
    return tuple(sorted(seen))
