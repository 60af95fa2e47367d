"""What a recipe step's programs are, as settings of its marker: a step redone when the code that
produced its output changed, not when someone remembered to bump a version tag.

A program is either a Python file the step runs (``$RECIPE_PY/text.py``, ``$SCRIPTS/x.py``) or
a command of the Python environment (``subword-nmt``, ``fairseq-preprocess``). A Python file is
keyed by its source, the source of every module of this checkout it imports (transitively, found
by reading its ``import`` statements, function-level ones included), and the version of every
installed distribution those import (sacremoses, sentencepiece, torch, ...). A command is keyed by
the distribution that installs it and its version.

Left out, with the reason:
- a package's ``__init__.py`` on the way to a module (``fairseq_posenc/__init__.py`` registers
  fairseq models; what a step computes comes from the module it names);
- the standard library (it changes with Python, which a venv fixes) and commands outside the
  Python environment (coreutils, tar, gzip: POSIX behaviour, not a model's settings).
"""
import ast
import hashlib
import os
import sys
from typing import Dict, Iterable, List, Optional, Set, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _imports(path: str) -> List[Tuple[str, int]]:
    """(module name, relative level) of every import statement in the file."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            # "from . import x" / "from pkg import mod": the names may be modules themselves
            found += [(f"{base}.{alias.name}" if base else alias.name, node.level) for alias in node.names]
            if base:
                found.append((base, node.level))
    return found


def _local_file(name: str, level: int, importer: str) -> Optional[str]:
    """The file of this checkout a module name refers to, or None (not ours)."""
    if level:
        folder = os.path.dirname(importer)
        for _ in range(level - 1):
            folder = os.path.dirname(folder)
        roots = [folder]
    else:  # absolute: from the checkout's root, or a sibling run as a file (its folder on sys.path)
        roots = [ROOT, os.path.dirname(importer)]
    parts = name.split(".") if name else []
    for root in roots:
        candidate = os.path.join(root, *parts)
        if parts and os.path.isfile(candidate + ".py"):
            return candidate + ".py"
        if parts and os.path.isfile(os.path.join(candidate, "__init__.py")):
            return os.path.join(candidate, "__init__.py")
    return None


def _third_party(name: str, level: int) -> Optional[str]:
    top = name.split(".")[0]
    if level or not top or top in sys.stdlib_module_names or top == "__future__":
        return None
    return top


def python_closure(path: str) -> Tuple[List[str], Set[str]]:
    """The checkout's files ``path`` runs (itself first, then its local imports, transitively) and
    the top-level names of the other modules they import."""
    files, todo, outside = [], [os.path.abspath(path)], set()
    while todo:
        current = todo.pop()
        if current in files:
            continue
        files.append(current)
        imports = _imports(current)
        resolved = [(name, level, _local_file(name, level, current)) for name, level in imports]
        for name, level, local in resolved:
            if local is None:
                top = _third_party(name, level)
                if top and _local_file(top, 0, current) is None:
                    outside.add(top)
            elif os.path.basename(local) == "__init__.py" and any(
                    other.startswith(name + ".") and found for other, _, found in resolved):
                continue  # only the package of a module imported by name: that module is followed
            else:
                todo.append(local)
    return files, outside


def _versions(top: str, found: Dict[str, List[str]]) -> List[str]:
    """name==version of the distributions that install the top-level module ``top``."""
    from importlib import metadata

    try:  # most distributions are named as their module (a scan of every one costs 0.25 s)
        return [f"{top}=={metadata.version(top)}"]
    except metadata.PackageNotFoundError:
        pass
    if not found:
        found.update(metadata.packages_distributions())
    return [f"{dist}=={metadata.version(dist)}" for dist in sorted(set(found.get(top, [])))] or [f"{top}==absent"]


def python_key(path: str, found: Dict[str, List[str]]) -> str:
    files, outside = python_closure(path)
    digest = hashlib.sha1()
    for name in sorted(files):
        digest.update(os.path.relpath(name, ROOT).encode() + b"\0")
        with open(name, "rb") as f:
            digest.update(f.read())
    for top in sorted(outside):
        digest.update(f"{top}:{','.join(_versions(top, found))}\0".encode())
    return digest.hexdigest()[:12]


def command_key(command: str) -> Optional[str]:
    """name==version of the distribution whose console script ``command`` is; None if none is."""
    from importlib import metadata

    for entry in metadata.entry_points(group="console_scripts"):
        if entry.name == command:
            dist = entry.dist.name if entry.dist is not None else entry.module.split(".")[0]
            return f"{dist}=={metadata.version(dist)}"
    return None


def program_settings(programs: Iterable[str]) -> Dict[str, str]:
    """``program.NAME=KEY`` for each program (a .py file's path or a command's name)."""
    settings, found = {}, {}
    for program in programs:
        if program.endswith(".py"):
            if not os.path.isfile(program):
                raise ValueError(f"a step runs {program}, which does not exist")
            settings[f"program.{os.path.basename(program)}"] = python_key(program, found)
        else:
            key = command_key(program)
            if key is not None:
                settings[f"program.{program}"] = key
    return settings
