"""No import circle in the plugin nor in the workflow's package, imports made inside functions
counted: a layer that imports a layer above it (FLOATER reading the models layer's state, the
workflow's settings reading its Study) is a circle that the import order only hides."""
import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: package name -> its folder in this checkout (read from the source, whatever is installed)
PACKAGES = {"fairseq_posenc": os.path.join(REPO, "fairseq_posenc"),
            "posenc_workflow": os.path.join(REPO, "recipes", "posenc_workflow")}


def _modules(package: str):
    """{dotted name: path} of every module of ``package``; a C++ extension (setup.py's
    ``pkg._name``, from ``pkg/csrc/name.cpp``) by its source, which imports nothing of it."""
    root = PACKAGES[package]
    modules = {}
    for folder, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        for name in files:
            parts = os.path.relpath(os.path.join(folder, name), root).split(os.sep)
            if name.endswith(".py"):
                parts[-1] = parts[-1][:-3]
                if parts[-1] == "__init__":
                    parts = parts[:-1]
            elif name.endswith(".cpp") and parts[-2] == "csrc":
                parts = parts[:-2] + ["_" + name[:-4]]
            else:
                continue
            modules[".".join([package, *parts])] = os.path.join(folder, name)
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
    for node in tree.body:  # the plugin's registry imports each scheme's module by its name in SCHEMES
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SCHEMES"]:
            found.update(f"{module}.{where.rsplit('.', 1)[0]}" for where in ast.literal_eval(node.value).values())
    return {name for name in found if name in modules and name != module}


def import_graph(package: str):
    modules = _modules(package)
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
    graph = import_graph("fairseq_posenc")
    # labels.checkpoint_model imports the models layer inside the function only
    assert "fairseq_posenc.models.config" in graph["fairseq_posenc.labels"]
    assert graph["fairseq_posenc.positions"] >= {"fairseq_posenc.positions.alibi", "fairseq_posenc.positions.floater"}
    # row_names.training_options imports train_config inside the function only
    assert "posenc_workflow.train_config" in import_graph("posenc_workflow")["posenc_workflow.row_names"]


def test_a_cycle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_the_package_has_no_import_cycle(package):
    cycle = find_cycle(import_graph(package))
    assert cycle is None, f"import cycle in {package}: " + " -> ".join(cycle)
