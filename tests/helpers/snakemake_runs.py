"""What the workflow's tests share (tests/workflow): recipes/Snakefile run in a fresh Snakemake
process on the demo's configuration updated with a study, with the stub fairseq-train of
helpers/stubs unless a test asks for fairseq's own; the shipped configurations; a copy of the
checkout to edit. The fixtures over them (the prepared toy corpus, a copy of it for each test) are
in tests/workflow/conftest.py."""
import json
import os
import shutil
import subprocess
import sys

import torch
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUBS = os.path.join(REPO, "tests", "helpers", "stubs")
SNAKEMAKE = os.path.join(os.path.dirname(sys.executable), "snakemake")
SNAKEFILE = os.path.join(REPO, "recipes", "Snakefile")
DEMO = os.path.join(REPO, "recipes", "conf", "demo.yaml")

# the demo's corpus, smaller; the stub trains
STUDY = {"out": "study", "corpus": {"data": "corpus", "toy": {"train_size": 300, "test_size": 20}},
         "models": {"encodings": ["sinusoidal"]}, "train": {"max_update": 6}}


def snakemake(workdir, study, *args, env=None, timeout=300, stub=True, snakefile=SNAKEFILE):
    """Snakemake on the demo's configuration updated with ``study``, in ``workdir``; with the stub
    fairseq-train unless ``stub`` is False."""
    command, kwargs = snakemake_call(workdir, study, *args, env=env, stub=stub, snakefile=snakefile)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)


def snakemake_call(workdir, study, *args, env=None, stub=True, snakefile=SNAKEFILE, name="study.yaml"):
    """snakemake()'s command and subprocess.run's other arguments, ``study`` written to ``name``."""
    with open(os.path.join(workdir, name), "w") as f:
        yaml.safe_dump(study, f)
    path = f"{STUBS + ':' if stub else ''}{os.path.dirname(sys.executable)}:{os.environ['PATH']}"
    return [SNAKEMAKE, "-s", snakefile, "--configfile", DEMO, name, "-c1", "--rerun-incomplete", *args], dict(
        cwd=workdir, start_new_session=True, env={**os.environ, "PATH": path, "STUB_LOG": os.path.join(workdir, "calls.jsonl"),
                                                  "OMP_NUM_THREADS": "1", **(env or {})})


def run_sh(root, workdir, corpus, *args, timeout=900, env=None, stub=False, first=None):
    """``bash ROOT/recipes/run.sh CORPUS ARGS...`` in ``workdir``, fairseq's commands from this Python
    (with the stub fairseq-train first where ``stub``)."""
    command, kwargs = run_sh_call(root, workdir, corpus, *args, env=env, stub=stub)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)


def run_sh_call(root, workdir, corpus, *args, env=None, stub=False):
    """run_sh()'s command and subprocess.run's other arguments."""
    path = f"{STUBS + ':' if stub else ''}{os.path.dirname(sys.executable)}:{os.environ['PATH']}"
    return ["bash", os.path.join(root, "recipes", "run.sh"), corpus, *args], dict(
        cwd=workdir, start_new_session=True,
        env={**os.environ, "PATH": path, "OMP_NUM_THREADS": "1", "STUB_LOG": os.path.join(workdir, "calls.jsonl"),
             # the checkout's packages, as its own install imports them
             "PYTHONPATH": os.pathsep.join([str(root), os.path.join(root, "recipes")]), **(env or {})})


def ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + "\n---\n" + proc.stderr[-5000:]
    return proc.stdout + proc.stderr


def calls(workdir):
    path = os.path.join(workdir, "calls.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def record(workdir, name, seed=1):
    with open(os.path.join(workdir, "study", "models", name, f"seed{seed}", "trained.json")) as f:
        return json.load(f)


def target(name, seed=1):
    return f"study/models/{name}/seed{seed}/trained.json"


def updates(checkpoint):
    return torch.load(checkpoint, weights_only=False)["optimizer_history"][-1]["num_updates"]


def study(**changes):
    """STUDY with ``section__field=value`` changed (``section=value`` replaces a section)."""
    out = json.loads(json.dumps(STUDY))
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            out.setdefault(section, {})[field] = value
        else:
            out[section] = value
    return out


def shipped(*names, **sections):
    """The validated configuration of recipes/conf's files ``names`` (in order), then ``sections``."""
    from snakemake.utils import update_config, validate

    config = {}
    for name in names:
        with open(os.path.join(REPO, "recipes", "conf", f"{name}.yaml")) as f:
            update_config(config, yaml.safe_load(f))
    update_config(config, json.loads(json.dumps(sections)))
    validate(config, os.path.join(REPO, "recipes", "conf", "schema.yaml"))
    return config


def checkout(tmp_path):
    """A copy of the checkout's code: the package (the C++ extension's build included), the
    scripts and the recipes."""
    root = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("fairseq_posenc", "scripts", "recipes"):
        shutil.copytree(os.path.join(REPO, name), root / name, ignore=ignore)
    return root


def edit(path):
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n# edited\n")
