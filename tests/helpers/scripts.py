"""The programs of scripts/ as modules, for tests that call their functions: each loaded from its
file, once a session, without scripts/ on ``sys.path`` (a script is a program, not a module of an
installed package, and its name there would shadow any module of that name)."""
import functools
import importlib.util
import os

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts")


@functools.lru_cache(maxsize=None)
def script(name: str):
    """scripts/NAME.py, run as a module (its ``__main__`` block not)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
