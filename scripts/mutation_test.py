#!/usr/bin/env python
"""Mutation testing of the position encodings, kept tables, update hooks, study report and stage
decision (developer tool, run by hand, not in CI): which changes to the code no test notices.

    .venv/bin/python scripts/mutation_test.py [--per-file 4] [--files kept.py,t5.py] [--rev HEAD]
        [--tests-from worktree|REV] [--with-tests tests/a.py,...] [--out /tmp/posenc-mutation]

Mutates a copy, never the checkout: ``git archive REV`` (default HEAD) is unpacked into --out,
its tests replaced by the work tree's (``--tests-from worktree``, the default) or another
revision's, and then the files named in --with-tests by the work tree's. The copy has no FLOATER C++ loops (``_floater_rk4*.so`` is not in git, none is built
there, and a stub keeps the checkout's from being imported), so FLOATER runs the mutated Python; the copy is first on PYTHONPATH, so
the tests and the fairseq-train/-generate processes they start (``--user-dir`` is the imported
package's folder) load the mutated files. Both are checked before any mutant runs.

Two kinds of mutants, for each file in ``TARGETS`` with the tests listed for it there:

- cosmic-ray's (pinned in requirements.txt), restricted to the operators in ``OPERATORS``
  (flip a sign, + <-> -, a comparison's bound, True <-> False, a condition negated, a number
  changed: "change a default"), sampled: at most --per-file mutants a file, chosen with a fixed
  seed, so that the run fits its budget (about 30 minutes on 2 idle cores at the default 2);
- ``NAMED``: mutations that matter here, written out (swap left and right, drop a term of an
  equation, skip a cache check, change a default), each run against its file's tests.

Each mutant runs its file's tests with ``pytest -x`` under a timeout. Only a failing test
(pytest's exit status 1) kills a mutant; a timeout, cosmic-ray's "incompetent", an interruption,
an error of pytest's own or no test collected says nothing of the tests: each is counted in a
column of its own, out of the kill rate. Prints the kill rate per file and every surviving mutant
as a diff, and writes them to --out/report.json.
"""
import argparse
import ast
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
P = "fairseq_posenc/positions/"

ENCODINGS = ["tests/unit/test_position_encodings.py"]  # every registered encoding, its shared properties
FUNCTIONS = ["tests/unit/test_position_functions.py"]  # the bias functions against their papers' formulas
SCHEMES = ["tests/unit/test_position_schemes.py"]  # each scheme's equations, sharing, DIET's segment attention
DIET = ["tests/unit/test_diet_init.py"]  # DIET's initialisation, smallest distance, default segment count
BLOCKS = ["tests/unit/test_position_blocks.py"]  # --position-blocks all (learned, sinusoidal)
#: file -> the tests that cover it (fast ones first: pytest -x stops at the first failure). Seconds
#: for each test file alone, one thread, on a loaded 2-core machine (rough): functions 5, schemes 5,
#: encodings 8, diet_init 7-11, stage_launches 7, kept_tables 16, floater 23, floater_bounded 28,
#: alibi_encoder 42, position_blocks 44, rnn_positions 51, floater_schedule 78, train_config 240
TARGETS = {
    P + "__init__.py": ENCODINGS,
    P + "alibi.py": FUNCTIONS + ENCODINGS + ["tests/unit/test_alibi_encoder.py"],
    P + "base.py": FUNCTIONS + SCHEMES + ENCODINGS + ["tests/unit/test_kept_tables.py"],
    P + "bias_scale.py": ["tests/fairseq/test_labels.py", "tests/unit/test_position_bias_scale.py"],
    P + "diet_abs.py": DIET + SCHEMES + ENCODINGS,
    P + "diet_rel.py": DIET + SCHEMES + ENCODINGS,
    P + "floater/config.py": ["tests/unit/test_floater_bounded.py", "tests/unit/test_floater.py"],
    P + "floater/dynamics.py": ["tests/unit/test_floater.py", "tests/unit/test_floater_bounded.py"],
    P + "floater/encoding.py": ["tests/unit/test_floater.py", "tests/unit/test_floater_bounded.py", "tests/unit/test_plot_positions.py"],
    P + "floater/loading.py": ["tests/unit/test_floater.py", "tests/fairseq/test_floater_schedule.py"],
    P + "floater/loops.py": ["tests/unit/test_floater_solver.py", "tests/unit/test_floater_bounded.py"],
    P + "floater/ode.py": ["tests/unit/test_floater.py", "tests/unit/test_floater_bounded.py", "tests/unit/test_plot_positions.py"],
    P + "floater/schedule.py": ["tests/fairseq/test_floater_schedule.py", "tests/fairseq/test_fp16_overflow.py"],
    P + "floater/solver.py": ["tests/unit/test_floater_solver.py", "tests/unit/test_floater_bounded.py",
                              "tests/unit/test_plot_positions.py"],
    P + "floater/update.py": ["tests/unit/test_floater.py"],
    P + "fire.py": ["tests/unit/test_kerple_fire.py"] + ENCODINGS,
    P + "kept.py": ["tests/unit/test_kept_tables.py"],
    P + "kerple.py": ["tests/unit/test_kerple_fire.py"] + ENCODINGS,
    P + "learned.py": ENCODINGS + BLOCKS,
    P + "rnn.py": ["tests/unit/test_rnn_positions.py"],
    P + "rope.py": FUNCTIONS + ["tests/unit/test_rope_extensions.py"] + ENCODINGS,
    P + "rope_scaling.py": ["tests/unit/test_rope_extensions.py"],
    P + "xpos.py": ["tests/unit/test_rope_extensions.py"] + ENCODINGS,
    P + "segments.py": FUNCTIONS + DIET + SCHEMES,
    P + "sharing.py": SCHEMES + DIET,
    P + "shaw.py": ["tests/unit/test_shaw_offsets.py"] + SCHEMES + ENCODINGS,
    P + "sinusoidal.py": ENCODINGS + BLOCKS,
    P + "t5.py": FUNCTIONS + ENCODINGS,
    "fairseq_posenc/update_hooks.py": ["tests/unit/test_update_hooks.py", "tests/unit/test_kept_tables.py",
                                       "tests/fairseq/test_floater_schedule.py"],
    "recipes/posenc_workflow/significance.py": ["tests/unit/test_seed_interval.py", "tests/unit/test_study_report.py"],
    "recipes/posenc_workflow/length_report.py": ["tests/unit/test_study_report.py"],
    "fairseq_posenc/labels.py": ["tests/fairseq/test_labels.py"],
    "recipes/posenc_workflow/train_config.py": ["tests/workflow/test_train_config.py"],
}


def registered_files(root=ROOT):
    """The file of each encoding in the registry (every file of one that is a package), read from
    its ``SCHEMES`` as text: this process need not import the plugin."""
    tree = ast.parse(open(os.path.join(root, P, "__init__.py"), encoding="utf-8").read())
    schemes = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                   and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["SCHEMES"])
    files = []
    for where in ast.literal_eval(schemes).values():
        module = P + where.rsplit(".", 1)[0].replace(".", "/")
        if os.path.isdir(os.path.join(root, module)):
            files += sorted(f"{module}/{f}" for f in os.listdir(os.path.join(root, module)) if f.endswith(".py"))
        else:
            files.append(module + ".py")
    return files


# every registered encoding's file is a target: one not named above gets the tests that walk the registry
for _path in registered_files():
    TARGETS.setdefault(_path, ENCODINGS)
#: tests that check the build, not the code (the copy has no C++ loops on purpose)
DESELECT = ["tests/unit/test_floater_solver.py::test_the_c_plus_plus_loops_are_built_where_a_compiler_is_found"]

#: cosmic-ray's operators used (a regex each; the others are not run): the kinds of change the
#: position code is sensitive to, without its bit and floor-division variants
OPERATORS = [
    r"core/ReplaceBinaryOperator_(Add_Sub|Sub_Add|Mul_Div|Div_Mul)$",
    r"core/ReplaceUnaryOperator_(USub_UAdd|Delete_USub|Delete_Not)$",
    r"core/ReplaceComparisonOperator_(Lt_LtE|LtE_Lt|Gt_GtE|GtE_Gt|Eq_NotEq|NotEq_Eq|Is_IsNot|IsNot_Is)$",
    r"core/(ReplaceTrueWithFalse|ReplaceFalseWithTrue|AddNot|NumberReplacer|ReplaceAndWithOr|ReplaceOrWithAnd)$",
    r"core/ZeroIterationForLoop$",
]

#: (file, what, old text, new text): mutations that matter here, beside cosmic-ray's
NAMED = [
    (P + "alibi.py", "swap left and right: split ALiBi's two slopes trade sides",
     "torch.where(offsets[None, :] > 0, right[:, None]", "torch.where(offsets[None, :] < 0, right[:, None]"),
    (P + "t5.py", "swap left and right: T5's buckets of keys after the query read as before it",
     "buckets += (relative_position > 0).long() * num_buckets", "buckets += (relative_position < 0).long() * num_buckets"),
    (P + "floater/loops.py", "drop a term of an equation: RK4's k4 (the hidden-space loops, h narrower than 2d)",
     "u = u + (q1 + 3 * (q2 + q3) + q4) * (h * 0.125)", "u = u + (q1 + 3 * (q2 + q3)) * (h * 0.125)"),
    (P + "kept.py", "skip a cache check: kept tables never compare the parameters' values",
     "torch.equal(t.detach(), v) for t, v in zip(tensors, self._values)", "True for t, v in zip(tensors, self._values)"),
    (P + "base.py", "skip a cache check: kept tables are never dropped",
     "            self._tables.clear()\n", "            pass\n"),
    (P + "floater/encoding.py", "flip a sign in a bias: FLOATER's biases subtracted",
     "x + self._bias(rows, self._state(layer, role, i)) for i, x in enumerate((q, k, v))",
     "x - self._bias(rows, self._state(layer, role, i)) for i, x in enumerate((q, k, v))"),
    (P + "shaw.py", "swap left and right: Shaw's offsets j - i read as i - j",
     "(pos.k_frame[None, :] - pos.q_frame[:, None])", "(pos.q_frame[:, None] - pos.k_frame[None, :])"),
    (P + "rnn.py", "change a default: the RNN's scalar input is i, not i * dt",
     "dtype=torch.float32) * self.dt)", "dtype=torch.float32))"),
    ("recipes/posenc_workflow/significance.py", "change a default: the interval's 97.5% quantile of the t test",
     "scipy_stats.t.ppf(0.975, dof)", "scipy_stats.t.ppf(0.95, dof)"),
    (P + "t5.py", "flip a sign in a bias: T5's scalars subtracted",
     "return self.bias(buckets).t() * self.bias_scale", "return -self.bias(buckets).t() * self.bias_scale"),
    (P + "diet_rel.py", "flip a sign in a bias: DIET-REL's scalars subtracted",
     "bias = self.weight[group][:, (-offsets)", "bias = -self.weight[group][:, (-offsets)"),
    (P + "diet_rel.py", "swap left and right: DIET-REL's offsets i - j read as j - i",
     "(-offsets).clamp(-k, k) + k]", "(offsets).clamp(-k, k) + k]"),
    (P + "floater/dynamics.py", "drop a term of an equation: the bounded FLOATER's -lambda p (--floater-dissipation, "
     "torchdiffeq's solvers and the adjoint)", "out = torch.tanh(out) - self.dissipation * p", "out = torch.tanh(out)"),
    (P + "floater/solver.py",
     "drop a term of an equation: the bounded FLOATER's -lambda p (--floater-dissipation, rk4)",
     "return squashed[s, stage] - dissipation * x", "return squashed[s, stage]"),
    (P + "rope.py", "swap left and right: RoPE rotates by -m theta (q_m . k_n still depends on m - n only)",
     "cast(x32 * cos + x32.roll(half, -1) * signed_sin", "cast(x32 * cos - x32.roll(half, -1) * signed_sin"),
    (P + "alibi.py", "swap left and right: split ALiBi's even heads see the right, odd ones the left",
     "% 2 == 0", "% 2 == 1"),
]


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def make_copy(out: str, rev: str, tests_from: str, with_tests=()) -> str:
    tree = os.path.join(out, "tree")
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    if tests_from == "worktree":
        shutil.rmtree(os.path.join(tree, "tests"))
        shutil.copytree(os.path.join(ROOT, "tests"), os.path.join(tree, "tests"),
                        ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    elif tests_from != rev:
        shutil.rmtree(os.path.join(tree, "tests"))
        archive = subprocess.run(["git", "-C", ROOT, "archive", tests_from, "tests"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    for name in with_tests:  # "tests/x.py", or "SOURCE:tests/x.py" for another file in its place
        source, _, name = name.rpartition(":") if ":" in name else (os.path.join(ROOT, name), "", name)
        shutil.copy(source, os.path.join(tree, name))
    # FLOATER's C++ loops (_floater_rk4*.so) are not in git, so not in the copy; but the editable
    # install's import finder looks a module of the package up in the checkout when the copy has
    # none, and would load the checkout's build: a module of that name that refuses to import
    # sends FLOATER's solver to its Python loops, the ones mutated
    with open(os.path.join(tree, "fairseq_posenc", "_floater_rk4.py"), "w") as f:
        f.write('raise ImportError("mutation testing runs the Python loops")\n')
    return tree


def environment(tree: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.path.join(tree, "recipes"), os.path.join(tree, "tests")]),
               OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    # the work tree's venv on PATH: fairseq-train and fairseq-generate (and pytest) from it
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def out_of_tree(tree: str) -> str:
    return os.path.dirname(tree)


def check_copy(tree: str, env: dict):
    """The copy is what runs: its package, its --user-dir, FLOATER's Python loops."""
    code = ("import fairseq_posenc, posenc_workflow.pipeline as p, fairseq_posenc.positions.floater.loops as s;"
            "print(fairseq_posenc.__file__); print(p.USER_DIR); print(s._floater_rk4)")
    package, user_dir, loops = run([sys.executable, "-c", code], cwd=tree, env=env).stdout.splitlines()[-3:]
    assert package.startswith(tree), f"fairseq_posenc is imported from {package}, not the copy"
    assert os.path.realpath(user_dir).startswith(os.path.realpath(tree)), f"--user-dir {user_dir} is not the copy"
    assert loops == "None", "FLOATER's C++ loops are loaded in the copy"
    # what fairseq-train and fairseq-generate do with --user-dir, in a process of their own
    code = ("import argparse, sys; from fairseq import utils;"
            f"utils.import_user_module(argparse.Namespace(user_dir={user_dir!r}));"
            "print(sys.modules['fairseq_posenc'].__file__)")
    loaded = run([sys.executable, "-c", code], cwd=out_of_tree(tree), env=env).stdout.splitlines()[-1]
    assert loaded.startswith(tree), f"fairseq's --user-dir import loads {loaded}, not the copy"
    print(f"| copy {tree}: fairseq_posenc from {package}, --user-dir {user_dir}, C++ loops: none", flush=True)


def pytest_command(tests, timeout):
    """The tests' command line; it prints pytest's exit status last (``pytest exit N``), which
    cosmic-ray does not record (it counts every non-zero status as a kill)."""
    deselect = [a for d in DESELECT if d.split("::")[0] in tests for a in ("--deselect", d)]
    pytest = (f"timeout {int(timeout)} {sys.executable} -m pytest -x -q -p no:cacheprovider -p no:randomly "
              f"-o addopts= {' '.join(tests)} {' '.join(deselect)}")
    return f"sh -c {shlex.quote(pytest + '; code=$?; echo pytest exit $code; exit $code')}"


#: what a test run's exit status says of a mutant: only a test that fails (pytest's status 1)
#: kills it; a timeout, an interruption, an error of pytest's own or no test collected says nothing
#: of the tests, and is counted apart, out of the kill rate
def outcome(status: int) -> str:
    if status == 0:
        return "survived"
    if status == 1:
        return "killed"
    return "timeout" if status in (124, 137) else f"exit {status}"


def _cosmic_outcome(result) -> str:
    from cosmic_ray.work_item import TestOutcome

    if result.test_outcome == TestOutcome.SURVIVED:
        return "survived"
    if result.test_outcome == TestOutcome.INCOMPETENT:
        return "incompetent"
    if (result.output or "").strip() == "timeout":  # cosmic-ray's own timeout
        return "timeout"
    found = re.findall(r"^pytest exit (\d+)$", result.output or "", re.M)
    return outcome(int(found[-1])) if found else "no status"


def baseline(tree, env, tests, limit):
    start = time.time()
    result = subprocess.run(pytest_command(tests, limit), shell=True, cwd=tree, env=env, capture_output=True, text=True)
    return result.returncode, time.time() - start, result.stdout[-2000:]


def cosmic_ray_file(tree, env, path, tests, per_file, timeout, seed, out):
    """cosmic-ray over one file: init, keep a sample of the allowed operators' mutants, exec."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    tag = path.replace("/", "_")
    config, session = os.path.join(out, f"{tag}.toml"), os.path.join(out, f"{tag}.sqlite")
    with open(config, "w") as f:
        f.write("[cosmic-ray]\n"
                f'module-path = "{path}"\n'
                f"timeout = {timeout}\n"
                "excluded-modules = []\n"
                f"test-command = {json.dumps(pytest_command(tests, timeout))}\n"
                '[cosmic-ray.distributor]\nname = "local"\n')
    if os.path.exists(session):
        os.remove(session)
    cosmic = [os.path.join(os.path.dirname(sys.executable), "cosmic-ray")]
    run(cosmic + ["init", config, session], cwd=tree, env=env)
    allowed = re.compile("|".join(f"(?:{o})" for o in OPERATORS))
    with use_db(session, WorkDB.Mode.open) as db:
        items = list(db.pending_work_items)
        eligible = [i for i in items if all(allowed.match(m.operator_name) for m in i.mutations)]
        # in the order of the source (job ids are random): the same seed picks the same mutants
        eligible.sort(key=lambda i: [(m.start_pos, m.end_pos, m.operator_name, m.occurrence) for m in i.mutations])
        chosen = set(w.job_id for w in random.Random(f"{seed}:{path}").sample(eligible, min(per_file, len(eligible))))
        for item in items:
            if item.job_id not in chosen:
                db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
    run(cosmic + ["exec", config, session], cwd=tree, env=env)
    results = []
    with use_db(session, WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                continue
            m = item.mutations[0]
            results.append({"file": path, "mutant": f"{m.operator_name} line {m.start_pos[0]}",
                            "outcome": _cosmic_outcome(result), "diff": result.diff or ""})
    return results


def named_mutant(tree, env, path, what, old, new, tests, timeout):
    source_path = os.path.join(tree, path)
    source = open(source_path).read()
    if old not in source:
        return {"file": path, "mutant": what, "outcome": None, "diff": f"(not applied: {old!r} is not in {path})"}
    open(source_path, "w").write(source.replace(old, new))
    try:
        result = subprocess.run(pytest_command(tests, timeout), shell=True, cwd=tree, env=env, capture_output=True)
    finally:
        open(source_path, "w").write(source)
    return {"file": path, "mutant": what, "outcome": outcome(result.returncode),
            "diff": f"- {old.strip()}\n+ {new.strip()}"}


def _counts(results) -> dict:
    counts = {}
    for r in results:
        name = r["outcome"] or "not applied"
        counts[name] = counts.get(name, 0) + 1
    return counts


def _tally(results) -> str:
    return ", ".join(f"{n} {name}" for name, n in _counts(results).items())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", default="HEAD", help="the source code mutated (default HEAD)")
    parser.add_argument("--tests-from", default="worktree", help="worktree (default) or a revision")
    parser.add_argument("--with-tests", default="", help="comma-separated test files taken from the work tree")
    parser.add_argument("--out", default="/tmp/posenc-mutation")
    parser.add_argument("--per-file", type=int, default=2, help="cosmic-ray mutants run per file (a sample)")
    parser.add_argument("--files", default="", help="comma-separated file names (default: every target)")
    parser.add_argument("--no-named", action="store_true", help="cosmic-ray's mutants only")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trust-baseline", type=float, default=0, metavar="SECONDS",
                        help="skip the unmutated run (it passed before, in SECONDS): the mutants' timeout")
    args = parser.parse_args(argv)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    tree = make_copy(out, args.rev, args.tests_from, [t for t in args.with_tests.split(",") if t])
    env = environment(tree)
    check_copy(tree, env)
    wanted = [w for w in args.files.split(",") if w]
    targets = {path: tests for path, tests in TARGETS.items()
               if not wanted or any(path.endswith("/" + w) or path == w for w in wanted)}
    results, times, started = [], {}, time.time()
    every = sorted({t for tests in targets.values() for t in tests})
    if args.trust_baseline:  # the same tests and sources passed unmutated in an earlier run
        code, took, tail = 0, args.trust_baseline, ""
    else:
        code, took, tail = baseline(tree, env, every, 3600)
    print(f"| the unmutated tests ({len(every)} files): {'pass' if code == 0 else 'FAIL'} in {took:.0f} s", flush=True)
    if code != 0:
        sys.exit(f"the tests fail without a mutation; fix that first:\n{tail}")
    timeout = max(120, took)  # every file's tests together, unmutated: a mutant past it is a timeout, not a kill
    for path, tests in targets.items():
        start = time.time()
        if not os.path.exists(os.path.join(tree, path)):
            continue
        found = cosmic_ray_file(tree, env, path, tests, args.per_file, timeout, args.seed, out)
        if not args.no_named:
            found += [named_mutant(tree, env, path, what, old, new, tests, timeout)
                      for file, what, old, new in NAMED if file == path]
        results += found
        times[path] = time.time() - start
        print(f"| {path}: {_tally(found)} ({times[path]:.0f} s)", flush=True)
    print(f"\n{'file':45} {'killed':>7} {'survived':>8} {'rate':>5}  {'other (out of the rate)'}")
    for path in [*targets, None]:
        mine = [r for r in results if path is None or r["file"] == path]
        if mine:
            counts = _counts(mine)
            other = ", ".join(f"{n} {name}" for name, n in counts.items() if name not in ("killed", "survived"))
            decided = counts.get("killed", 0) + counts.get("survived", 0)
            rate = f"{counts.get('killed', 0) / decided:5.0%}" if decided else "    -"
            print(f"{path or 'all':45} {counts.get('killed', 0):7} {counts.get('survived', 0):8} {rate}  {other}")
    print(f"({time.time() - started:.0f} s)\nsurvivors:")
    for r in results:
        if r["outcome"] == "survived":
            print(f"- {r['file']}: {r['mutant']}\n{r['diff'].strip()}\n")
    for r in results:
        if r["outcome"] not in ("killed", "survived"):
            print(f"- {r['outcome'] or 'not run'}: {r['file']}: {r['mutant']}: {r['diff'].strip()[:300]}")
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump({"rev": args.rev, "tests_from": args.tests_from, "per_file": args.per_file, "seed": args.seed,
                   "results": results, "seconds": times}, f, indent=1)


if __name__ == "__main__":
    main()
