"""No import circle in the plugin, imports made inside functions counted: a layer that imports a
layer above it (FLOATER reading the models layer's state) is a circle that the import order only
hides. The workflow's code (fairseq_posenc/recipe, which --user-dir does not load) is left out."""
import ast
import os

import fairseq_posenc

PACKAGE = "fairseq_posenc"
ROOT = os.path.dirname(fairseq_posenc.__file__)
LEFT_OUT = PACKAGE + ".recipe"


def _modules():
    """{dotted name: path} of every module of the plugin; a C++ extension (setup.py's
    ``pkg._name``, from ``pkg/csrc/name.cpp``) by its source, which imports nothing of it."""
    modules = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            parts = os.path.relpath(os.path.join(folder, name), ROOT).split(os.sep)
            if name.endswith(".py"):
                parts[-1] = parts[-1][:-3]
                if parts[-1] == "__init__":
                    parts = parts[:-1]
            elif name.endswith(".cpp") and parts[-2] == "csrc":
                parts = parts[:-2] + ["_" + name[:-4]]
            else:
                continue
            module = ".".join([PACKAGE, *parts])
            if module != LEFT_OUT and not module.startswith(LEFT_OUT + "."):
                modules[module] = os.path.join(folder, name)
    return modules


def _imports(module: str, path: str, modules) -> set:
    """The package's modules that ``module`` imports, anywhere in its code: ``from X import Y`` is
    X.Y where that is a module, else X."""
    if not path.endswith(".py"):
        return set()
    is_package = os.path.basename(path) == "__init__.py"
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source)
    if module == PACKAGE + ".positions":  # the registry imports each scheme's module by its name in SCHEMES
        from fairseq_posenc.positions import SCHEMES

        found.update(f"{module}.{where.rsplit('.', 1)[0]}" for where in SCHEMES.values())
    return {name for name in found if name in modules and name != module}


def import_graph():
    modules = _modules()
    return {module: _imports(module, path, modules) for module, path in modules.items()}


def find_cycle(graph):
    """One cycle as a list of modules (the first repeated at the end), or None."""
    state = {}  # 1: on the current path, 2: done

    def visit(node, path):
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target, path)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node, [])
            if cycle:
                return cycle
    return None


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    # labels.checkpoint_model imports the models layer inside the function only
    assert "fairseq_posenc.models.config" in graph["fairseq_posenc.labels"]
    assert graph["fairseq_posenc.positions"] >= {"fairseq_posenc.positions.alibi", "fairseq_posenc.positions.floater"}


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
