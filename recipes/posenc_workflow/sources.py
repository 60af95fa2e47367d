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
import hashlib
import json
import os
import re
import tempfile
from typing import Iterable, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT_NAME = re.compile(r"[\w./-]+\.py")
# "module.Name": a module beside the file named by a string, as a registry imports it (import_module)
MODULE_NAME = re.compile(r"([A-Za-z_]\w*)\.[A-Za-z_]\w*")
# what each file names (_named), by the digest of its bytes: $XDG_CACHE_HOME, else ~/.cache
_CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                      "fairseq-posenc", "sources")


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
    here = os.path.dirname(path)
    found = []

    def top(name: str) -> List[str]:
        """Where a top-level name is found: beside a file run as a script, in scripts/, at the root
        (the plugin), in recipes/ (the workflow's package, setup.py's package_dir)."""
        return [d for d in (here, os.path.join(root, "scripts"), root, os.path.join(root, "recipes"))
                if _module_file(os.path.join(d, name))]

    for kind, level, module, names in _named(path):
        if kind == "import":
            parts = module.split(".")
            for base in top(parts[0])[:1]:
                found.append(_module_file(os.path.join(base, *parts)))
        elif kind == "from":
            parts = module.split(".") if module else []
            if level:
                base = here
                for _ in range(level - 1):
                    base = os.path.dirname(base)
            else:
                bases = top(parts[0])
                if not bases:
                    continue
                base = bases[0]
            package = os.path.join(base, *parts)
            for name in names:
                found.append(_module_file(os.path.join(package, name)) or _module_file(package))
        elif SCRIPT_NAME.fullmatch(module):
            for base in (here, os.path.join(root, "scripts"), root):
                if os.path.isfile(os.path.join(base, module)):
                    found.append(os.path.join(base, module))
                    break
        else:
            found.append(_module_file(os.path.join(here, MODULE_NAME.fullmatch(module).group(1))))
    return tuple(os.path.abspath(f) for f in found if f)


def _named(path: str) -> List[list]:
    """What ``path``'s source names, in the order of its syntax tree: ``["import", 0, module, []]``,
    ``["from", level, module, names]`` and ``["string", 0, text, []]`` for a string constant that
    names a script or a module. A function of the file's bytes alone, so kept on disk under their
    digest (_CACHE): parsing the checkout's files is most of a dry run's time once Snakemake is
    imported, and every dry run, test or study, reads the same files."""
    if not path.endswith(".py"):
        return []  # a C++ source: what it includes is not followed
    with open(path, "rb") as f:
        text = f.read()
    kept = os.path.join(_CACHE, hashlib.sha256(_extractor() + text).hexdigest() + ".json")
    try:
        with open(kept, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        pass
    named = _parse(text, path)
    try:  # written whole or not at all: another process may read it at once
        os.makedirs(_CACHE, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=_CACHE, suffix=".tmp", delete=False, encoding="utf-8") as f:
            json.dump(named, f)
        os.replace(f.name, kept)
    except OSError:  # a read-only home: parsed each time
        pass
    return named


@functools.lru_cache(maxsize=None)
def _extractor() -> bytes:
    """This file's bytes: a cache entry is keyed by the code that wrote it too."""
    with open(os.path.abspath(__file__), "rb") as f:
        return f.read()


def _parse(text: bytes, path: str) -> List[list]:
    tree = ast.parse(text, filename=path)
    # docstrings name files in prose, not what runs
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            node.body = node.body[1:]
    named = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named.extend(["import", 0, alias.name, []] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            named.append(["from", node.level, node.module or "", [alias.name for alias in node.names]])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                SCRIPT_NAME.fullmatch(node.value) or MODULE_NAME.fullmatch(node.value)):
            named.append(["string", 0, node.value, []])
    return named


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
