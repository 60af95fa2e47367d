"""docs/development.md's table "What the plugin changes in fairseq, torch and Python" against what
the plugin's source touches, found by walking its syntax trees: an attribute of fairseq, torch or
Python that it replaces, sets or deletes, a private one (``x._name``, ``from m import _name``) it
reads, a process-wide hook it installs (``atexit.register``, a torch function mode). A touch without
a row fails, and so does a row whose name the code no longer touches.

A touch is named as its row names it: a module's attribute in full, through the imports
(``fairseq.trainer.Trainer.train_step``); an object fairseq hands the plugin as the code calls it
(``trainer._model``, ``optimizer.multiply_grads``), ``self`` in a wrapper installed on a class being
that class; and where: the module and its top-level function or class (``update_hooks.install``).
``python tests/unit/test_patch_table.py`` lists them."""
import ast
import pathlib
import re
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fairseq_posenc"
DOC = ROOT / "docs" / "development.md"
SECTION = "## What the plugin changes in fairseq, torch and Python"

#: the packages whose attributes count (the plugin's own, imported relatively, never do)
FOREIGN = {"fairseq", "fairseq_cli", "torch", "argparse", "sys", "atexit", "os", "signal", "threading",
           "numpy", "omegaconf", "warnings", "faulthandler", "builtins", "logging"}
#: the plugin's names for fairseq's objects it is handed: writes to their attributes count (its
#: own model configuration, ``args``, which fairseq's architecture functions fill, does not)
FOREIGN_PARAMETERS = {"trainer", "optimizer", "cfg", "common", "parser", "embedding"}
#: calls that change the whole process
HOOK_CALLS = {"atexit.register", "signal.signal", "sys.settrace", "sys.setprofile", "threading.settrace",
              "threading.setprofile", "faulthandler.enable", "warnings.filterwarnings", "warnings.simplefilter",
              "os.putenv", "os.environ.update", "os.environ.setdefault",
              "torch.serialization.add_safe_globals", "torch.set_default_dtype", "torch.set_default_device",
              "torch.set_num_threads", "torch.use_deterministic_algorithms", "torch.set_grad_enabled",
              "torch.autograd.set_detect_anomaly", "torch.nn.modules.module.register_module_forward_hook",
              "torch.nn.modules.module.register_module_forward_pre_hook",
              "torch.nn.modules.module.register_module_full_backward_hook"}
#: base classes whose instances change what every torch call does while they are entered
HOOK_BASES = {"torch.overrides.TorchFunctionMode", "torch.utils._python_dispatch.TorchDispatchMode"}
#: torch's ways for a module to name attributes of its own
REGISTERS = {"register_buffer", "register_parameter", "add_module", "register_module"}
OWN = "<own>"  # what a name bound to the plugin's own module maps to
WRAPPED = "<wrapped>"  # the class a nested function with a ``self`` is installed on


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _imported(node) -> dict:
    """{local name: dotted path} of an import statement; the plugin's own modules: OWN."""
    found = {}
    if isinstance(node, ast.Import):
        for alias in node.names:
            found[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
    elif node.level == 0 and node.module.split(".")[0] != "fairseq_posenc":
        found = {alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names}
    else:
        found = {alias.asname or alias.name: OWN for alias in node.names}
    return {name: path if path == OWN or path.split(".")[0] in FOREIGN else OWN for name, path in found.items()}


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


class Walker:
    """The touches of one module's source: {(name, where): "path:line"}. ``own``: the private names
    the plugin defines itself (None: collect them, in ``self.defined``)."""

    def __init__(self, source: str, module: str, own=None, path="<source>"):
        self.tree, self.module, self.own, self.path = ast.parse(source), module, own, path
        self.touches, self.defined, self.imports = {}, set(), set()  # imports: names bound by an import

    def run(self):
        names = {}
        for node in self.tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update(_imported(node))
                self.imports.update(_imported(node))
        for node in self.tree.body:
            where = f"{self.module}.{node.name}" if hasattr(node, "name") else self.module
            self.statements([node], names, where, top=True)
        return self.touches

    def label(self, node, names):
        """``node``'s name where it is (an attribute of) something foreign, else None."""
        root = _root(node)
        if not isinstance(root, ast.Name) or names.get(root.id) in (None, OWN):
            return None
        text = ast.unparse(node)
        return names[root.id] + text[len(root.id):]

    def add(self, name, where, node):
        self.touches.setdefault((name, where), f"{self.path}:{node.lineno}")

    def statements(self, body, names, where, top=False):
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update(_imported(node))
                self.imports.update(_imported(node))
                for path in set(_imported(node).values()) - {OWN}:
                    if any(_private(part) for part in path.split(".")):
                        self.add(path, where, node)  # ``from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin``
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.defined.add(node.name)
                self.function(node, names, where, top)
            elif isinstance(node, ast.ClassDef):
                self.defined.add(node.name)
                self.klass(node, names, where, top)
            else:
                self.statement(node, names, where)

    def klass(self, node, names, where, top):
        for base in node.bases:
            self.expression(base, names, where)
            if self.label(base, names) in HOOK_BASES:
                self.add(self.label(base, names), where, base)
        inner = dict(names, self=None, cls=None)
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.defined.add(item.name)
                self.function(item, inner, where, top=False, method=True)
            elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                self.defined.update(t.id for t in targets if isinstance(t, ast.Name))
                self.statement(item, inner, where)
            else:
                self.statements([item], inner, where)

    def function(self, node, names, where, top, method=False):
        inner = dict(names)
        arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        for position, argument in enumerate(arguments):
            inner[argument.arg] = argument.arg if argument.arg in FOREIGN_PARAMETERS else None
            if position == 0 and argument.arg == "self" and not method and not top:
                inner["self"] = names.get(WRAPPED) or "self"  # a wrapper installed on a class
        for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            self.expression(default, names, where)
        installed = self.installed_on(node, inner)
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                classes = set(installed.values())
                owner = installed.get(item.name) or (classes.pop() if len(classes) == 1 else None)
                self.function(item, dict(inner, **{WRAPPED: owner or inner.get(WRAPPED)}), where, top=False)
            else:
                self.statements([item], inner, where)

    def installed_on(self, node, names):
        """{nested function: the foreign class it is installed on} (``Trainer.train_step = train_step``)."""
        local = dict(names)
        for item in ast.walk(node):
            if isinstance(item, (ast.Import, ast.ImportFrom)):
                local.update(_imported(item))
        found = {}
        for item in ast.walk(node):
            if isinstance(item, ast.Assign) and isinstance(item.value, ast.Name):
                for target in item.targets:
                    owner = self.label(target.value, local) if isinstance(target, ast.Attribute) else None
                    if owner and owner.rsplit(".", 1)[-1][:1].isupper():
                        found[item.value.id] = owner
        return found

    def statement(self, node, names, where):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is not None:
                self.expression(node.value, names, where)
            for target in targets:
                self.write(target, names, where)
                if node.value is not None:
                    self.bind(target, node.value, names)
            return
        if isinstance(node, ast.Delete):
            for target in node.targets:
                self.write(target, names, where)
            return
        if isinstance(node, (ast.For, ast.AsyncFor)):
            self.expression(node.iter, names, where)
            self.bind(node.target, node.iter, names)
        for field, value in ast.iter_fields(node):
            values = value if isinstance(value, list) else [value]
            if node.__class__ in (ast.For, ast.AsyncFor) and field in ("target", "iter"):
                continue
            for item in values:
                if isinstance(item, ast.stmt):
                    self.statements([item], names, where)
                elif isinstance(item, ast.expr):
                    self.expression(item, names, where)
                elif isinstance(item, ast.withitem):
                    self.expression(item.context_expr, names, where)
                    if item.optional_vars is not None:
                        self.bind(item.optional_vars, item.context_expr, names)
                elif isinstance(item, ast.ExceptHandler):
                    self.statements(item.body, names, where)

    def bind(self, target, value, names):
        """A local bound from an object the plugin was handed is foreign (``model = trainer._model``),
        and so is a module's attribute (``x = data_utils.batch_by_size``); what a call of a module's
        function returns (``argparse.ArgumentParser()``) is the plugin's own."""
        handed = any(isinstance(n, ast.Name) and names.get(n.id) not in (None, OWN) and n.id not in self.imports
                     for n in ast.walk(value))
        foreign = handed or isinstance(value, (ast.Attribute, ast.Subscript)) and self.label(value, names)
        for node in [target] if isinstance(target, ast.Name) else getattr(target, "elts", []):
            if isinstance(node, ast.Name):
                names[node.id] = node.id if foreign else None
                self.imports.discard(node.id)

    def write(self, target, names, where):
        if isinstance(target, (ast.Tuple, ast.List, ast.Starred)):
            for element in getattr(target, "elts", [getattr(target, "value", None)]):
                self.write(element, names, where)
        elif isinstance(target, (ast.Attribute, ast.Subscript)):
            self.expression(target.value, names, where)
            name = self.label(target if isinstance(target, ast.Attribute) else target.value, names)
            if name:
                self.add(name, where, target)
            elif isinstance(target, ast.Attribute) and _private(target.attr):
                self.defined.add(target.attr)

    def expression(self, node, names, where):
        inner = {id(n.value) for n in ast.walk(node) if isinstance(n, (ast.Attribute, ast.Subscript))}
        for item in ast.walk(node):
            if isinstance(item, ast.Call):
                if self.label(item.func, names) in HOOK_CALLS:
                    self.add(self.label(item.func, names), where, item)
                self.by_name(item, names, where)
            if isinstance(item, ast.Attribute) and id(item) not in inner:
                self.private(item, names, where)

    def foreign_private(self, name) -> bool:
        return _private(name) and self.own is not None and name not in self.own

    def private(self, chain, names, where):
        """A chain with a private link of another package's (``dist.distributed_c10d._get_default_store``)."""
        links, node = [], chain
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            if isinstance(node, ast.Attribute):
                links.append(node.attr)
            node = node.value
        if not any(self.foreign_private(link) for link in links):
            return
        if isinstance(node, ast.Call) or isinstance(node, ast.Name) and names.get(node.id) == OWN:
            return  # super()'s, or the plugin's own module's
        self.add(self.label(chain, names) or ast.unparse(chain), where, chain)

    def by_name(self, call, names, where):
        """``getattr(x, "_name")``; ``setattr(x, "name", v)`` on a foreign ``x``; a module's own
        ``register_buffer("_name", ...)``."""
        if isinstance(call.func, ast.Attribute) and call.func.attr in REGISTERS and call.args \
                and isinstance(call.args[0], ast.Constant):
            self.defined.add(call.args[0].value)
        if not (isinstance(call.func, ast.Name) and call.func.id in ("getattr", "hasattr", "setattr", "delattr")
                and len(call.args) >= 2):
            return
        receiver, attr = call.args[0], call.args[1]
        attr = attr.value if isinstance(attr, ast.Constant) and isinstance(attr.value, str) else "*"
        owner = self.label(receiver, names)
        if call.func.id in ("setattr", "delattr"):
            if owner:
                self.add(f"{owner}.{attr}", where, call)
            elif _private(attr):
                self.defined.add(attr)
        elif self.foreign_private(attr):
            self.add(f"{owner or ast.unparse(receiver)}.{attr}", where, call)


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        yield path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"


def touches():
    """{(name, where): "path:line"} of the whole plugin."""
    own = set()
    for path, module in _sources():
        walker = Walker(path.read_text(), module)
        walker.run()
        own |= walker.defined
    found = {}
    for path, module in _sources():
        found.update(Walker(path.read_text(), module, own, str(path.relative_to(ROOT))).run())
    return found


ROW = re.compile(r"^((?:`[^`]+`, )*`[^`]+`) \(`([\w.]+)`\)$")


def table():
    """The section's rows: [(first cell's names, where, last cell, line number)]."""
    lines = DOC.read_text().splitlines()
    start = lines.index(SECTION)
    rows = []
    for number, line in enumerate(lines[start + 1:], start + 2):
        if line.startswith("## "):
            break
        if not line.startswith("| ") or line.startswith("| Touched") or line.startswith("|---"):
            continue
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        found = ROW.match(cells[0])
        assert found and len(cells) == 5, f"docs/development.md:{number}: not `name`, ... (`where`) and 5 cells"
        rows.append((re.findall(r"`([^`]+)`", found.group(1)), found.group(2), cells[-1], number))
    return rows


def test_every_touch_has_a_row_and_every_row_a_touch():
    touched = touches()
    listed = {(name, where): number for names, where, _, number in table() for name in names}
    missing = [f"{at}: `{name}` (`{where}`) has no row in docs/development.md's table"
               for (name, where), at in sorted(touched.items(), key=lambda kv: kv[1]) if (name, where) not in listed]
    stale = [f"docs/development.md:{number}: `{name}` (`{where}`) is no longer touched there"
             for (name, where), number in sorted(listed.items(), key=lambda kv: kv[1]) if (name, where) not in touched]
    assert not missing + stale, "\n".join(missing + stale)


def test_each_row_names_tests_that_exist():
    """The last cell: `tests/...py` (the whole file) or `tests/...py`: `test_a`, `test_b`; ..."""
    wrong = []
    for names, where, cell, number in table():
        files = re.findall(r"`(tests/[\w/]+\.py)`", cell)
        if not files:
            wrong.append(f"docs/development.md:{number}: no test named")
        for part in cell.split("; "):
            path = re.findall(r"`(tests/[\w/]+\.py)`", part)
            source = (ROOT / path[0]).read_text() if path and (ROOT / path[0]).is_file() else ""
            if path and not source:
                wrong.append(f"docs/development.md:{number}: no file {path[0]}")
            for test in re.findall(r"`(test_\w+)`", part):
                if not re.search(rf"^def {test}\(", source, re.M):
                    wrong.append(f"docs/development.md:{number}: no {test} in {path[0] if path else '(no file)'}")
    assert not wrong, "\n".join(wrong)


def _touched(source: str, own=()):
    return set(Walker(textwrap.dedent(source), "m", set(own)).run())


def test_the_walk_finds_a_new_patch_and_a_private_read():
    """What the comparison rests on: each way of touching fairseq, torch or Python is found, and
    the plugin's own objects (its models, a parser it builds) are not."""
    assert _touched("""
        import atexit, os, sys
        import torch
        from fairseq import checkpoint_utils
        from fairseq.trainer import Trainer
        from torch.overrides import TorchFunctionMode
        from ..kept import kept

        class Mode(TorchFunctionMode):
            pass

        class Own(torch.nn.Module):
            def forward(self, ode):
                return self._cache, ode._solve, kept._hidden, super()._load_from_state_dict

        def install():
            from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin
            Trainer.foo = bar
            original = Trainer.train_step

            def train_step(self, samples):
                self.seen = True
                optimizer = self.optimizer
                del optimizer.multiply_grads
                return original(self, samples)

            Trainer.train_step = train_step
            setattr(checkpoint_utils, "load_checkpoint_to_cpu", None)
            sys.excepthook = print
            os.environ["X"] = "1"
            atexit.register(print)

        def read(trainer, parser):
            model = trainer._model
            model.ignored = []
            for action in parser._actions:
                action.__class__ = object
            return getattr(trainer, "_foo", None), torch.distributed.distributed_c10d._get_default_store()

        def own():
            import argparse
            parser = argparse.ArgumentParser()
            parser.prog = "x"
            args = parser.parse_args([])
            args.arch = "a"
    """, own={"_cache", "_solve", "_load_from_state_dict"}) == {
        ("torch.overrides.TorchFunctionMode", "m.Mode"),
        ("fairseq.optim.fp16_optimizer._FP16OptimizerMixin", "m.install"),
        ("fairseq.trainer.Trainer.foo", "m.install"), ("fairseq.trainer.Trainer.train_step", "m.install"),
        ("fairseq.trainer.Trainer.seen", "m.install"), ("optimizer.multiply_grads", "m.install"),
        ("fairseq.checkpoint_utils.load_checkpoint_to_cpu", "m.install"), ("sys.excepthook", "m.install"),
        ("os.environ", "m.install"), ("atexit.register", "m.install"),
        ("trainer._model", "m.read"), ("model.ignored", "m.read"), ("parser._actions", "m.read"),
        ("action.__class__", "m.read"), ("trainer._foo", "m.read"),
        ("torch.distributed.distributed_c10d._get_default_store", "m.read")}


if __name__ == "__main__":  # what the plugin touches, where
    for (name, where), at in sorted(touches().items(), key=lambda kv: kv[1]):
        print(f"{at}: `{name}` (`{where}`)")
