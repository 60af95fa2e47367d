"""What an edit of the checkout reruns (docs/reuse.md): a model's code key
(recipes/posenc_workflow/workflow.py code_key) covers the files fairseq's --user-dir runs to train
it, read from the source whatever the process imported; each rule's inputs hold the files its
scripts run (recipes/posenc_workflow/sources.py). Edits are made in a copy of the checkout."""
import os
import re
import subprocess
import sys

from helpers import snakemake_runs as runs
from helpers.snakemake_runs import checkout, edit
from posenc_workflow import workflow
from posenc_workflow.sources import sources


def test_the_code_key_is_the_same_with_or_without_the_preflight():
    # the preflight imports labels.py and models/from_flags.py (as does a SLURM job's process not)
    script = ("from posenc_workflow import workflow as wf\n"
              "before = wf.code_key('alibi')\n"
              "wf.preflight_label('alibi', [])\n"
              "wf._CODE_CACHE.clear()\n"
              "print(before, wf.code_key('alibi'))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=runs.REPO)
    before, after = out.stdout.split()[-2:]
    assert before == after == workflow.code_key("alibi")


def test_an_edit_retrains_the_models_whose_training_runs_the_file(tmp_path):
    root = str(checkout(tmp_path))
    encodings = ("sinusoidal", "learned", "alibi", "floater", "rnn")

    def keys():
        workflow._CODE_CACHE.clear()
        return {e: workflow.code_key(e, root) for e in encodings}

    files = {os.path.relpath(f, root) for f in workflow.code_files(root)}
    # what `import fairseq_posenc` runs, a function's import (the FLOATER solver's) included
    assert {"fairseq_posenc/__init__.py", "fairseq_posenc/positions/alibi.py", "fairseq_posenc/positions/floater/solver.py",
            "fairseq_posenc/models/transformer_posenc.py", "fairseq_posenc/csrc/floater_rk4.cpp"} <= files
    trains_nothing = ("fairseq_posenc/labels.py", "fairseq_posenc/models/from_flags.py",
                      "recipes/posenc_workflow/pipeline.py", "recipes/posenc_workflow/workflow.py")
    assert not files & set(trains_nothing)
    first = keys()
    assert len(set(first.values())) == 5
    # modules that train nothing: no key changes
    for name in trains_nothing:
        edit(os.path.join(root, name))
    assert keys() == first
    # an encoding's own file: its models' key only
    edit(os.path.join(root, "fairseq_posenc", "positions", "alibi.py"))
    second = keys()
    assert [e for e in encodings if second[e] != first[e]] == ["alibi"]
    # FLOATER's solver: floater's key, and rnn's (trained by FLOATER's package too)
    edit(os.path.join(root, "fairseq_posenc", "positions", "floater", "solver.py"))
    third = keys()
    assert [e for e in encodings if third[e] != second[e]] == ["floater", "rnn"]
    # another scheme's file that a scheme imports itself (learned.py imports sinusoidal.py's
    # newest_positions): both keys, not the others that only the registry imports beside it
    edit(os.path.join(root, "fairseq_posenc", "positions", "sinusoidal.py"))
    fourth = keys()
    assert [e for e in encodings if fourth[e] != third[e]] == ["sinusoidal", "learned"]
    # the shared model code: every key
    edit(os.path.join(root, "fairseq_posenc", "models", "transformer_posenc.py"))
    assert all(v != fourth[k] for k, v in keys().items())


def test_a_rules_inputs_are_the_files_its_script_runs():
    rel = lambda *paths: {os.path.relpath(f, runs.REPO) for f in sources(*paths)}  # noqa: E731
    recipe = os.path.join(runs.REPO, "recipes", "posenc_workflow")
    # the steps of a corpus: prepare.py and the text.py it runs; the short-to-long split's own script
    # adds the length_split.py it runs (an edit of it redoes the split, not the corpus before it)
    assert rel(os.path.join(recipe, "prepare.py")) == {"recipes/posenc_workflow/prepare.py", "recipes/posenc_workflow/text.py"}
    assert rel(os.path.join(recipe, "short_to_long.py")) == {
        "recipes/posenc_workflow/short_to_long.py", "recipes/posenc_workflow/prepare.py", "recipes/posenc_workflow/text.py",
        "scripts/length_split.py", "recipes/posenc_workflow/length_bins.py"}
    assert rel(os.path.join(recipe, "rerank.py")) == {"recipes/posenc_workflow/rerank.py", "recipes/posenc_workflow/text.py"}
    assert rel(os.path.join(recipe, "train_job.py")) == {"recipes/posenc_workflow/train_job.py",
                                                         "recipes/posenc_workflow/checkpoint_pick.py"}
    # a script importing the plugin's module: that module, not the plugin's registration
    assert rel(os.path.join(runs.REPO, "scripts", "average_checkpoints.py")) == {
        "scripts/average_checkpoints.py", "fairseq_posenc/compat.py", "fairseq_posenc/positions/kept.py"}


def test_what_a_file_names_is_kept_by_its_bytes_and_reads_back_as_parsed(tmp_path, monkeypatch):
    """sources.py keeps what each file names on disk, under the digest of its bytes: an edited file
    is parsed anew whatever its path and time, and every file of the checkout reads back from the
    cache as it parses."""
    from posenc_workflow import sources as module

    monkeypatch.setattr(module, "_CACHE", str(tmp_path / "cache"))
    package = tmp_path / "root" / "pkg"
    package.mkdir(parents=True)
    for name in ("__init__", "b", "c"):
        (package / f"{name}.py").write_text("")
    main = package / "a.py"

    def found():
        module._imported.cache_clear()
        return sorted(os.path.basename(f) for f in sources(str(main), root=str(tmp_path / "root")))

    main.write_text("from pkg import b\n")
    assert found() == ["a.py", "b.py"] and len(os.listdir(tmp_path / "cache")) == 2
    stat = os.stat(main)
    main.write_text("from pkg import c\n")  # the same size; its time set back: only its bytes differ
    os.utime(main, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert found() == ["a.py", "c.py"]
    # the checkout's files: what the cache holds is what a parse finds (a second read is the cache's)
    files = [os.path.join(d, f) for d, _, names in os.walk(runs.REPO) for f in names
             if f.endswith(".py") and not d.startswith(os.path.join(runs.REPO, ".venv"))]
    assert len(files) > 100
    for path in files:
        with open(path, "rb") as f:
            parsed = module._parse(f.read(), path)
        assert module._named(path) == module._named(path) == parsed, path


STUDY = {**runs.STUDY, "models": {"arch": "tiny", "encodings": ["sinusoidal"]},
         "train": {"recipe": "scaling_nmt", "device": "cpu", "max_update": 6, "save_interval_updates": 3, "lr": 0.003,
                   "dropout": 0.1, "max_tokens": 1000, "update_freq": 1},
         "evaluate": {"checkpoints": "update", "average": 1}}


def test_an_edit_of_a_rules_script_runs_that_rule_and_an_unrelated_edit_nothing(work, tmp_path):
    root = checkout(tmp_path)
    snakefile = str(root / "recipes" / "Snakefile")
    # the copy's packages, as an install of the copy would import them
    env = {"PYTHONPATH": os.pathsep.join([str(root), str(root / "recipes")])}
    averaged = "study/models/sinusoidal/seed1/averaged.pt"
    runs.ok(runs.snakemake(work, STUDY, averaged, snakefile=snakefile, env=env))
    # average_checkpoints.py, what the average rule runs: that rule runs again, nothing before it;
    # labels.py, rerank.py and wmt_data.py run no job of this target; a file only touched, nothing
    edit(root / "scripts" / "average_checkpoints.py")
    for name in ("fairseq_posenc/labels.py", "recipes/posenc_workflow/rerank.py", "recipes/posenc_workflow/wmt_data.py"):
        edit(root / name)
    os.utime(root / "recipes" / "posenc_workflow" / "train_job.py")
    dry = runs.ok(runs.snakemake(work, STUDY, averaged, "-n", snakefile=snakefile, env=env))
    assert re.findall(r"^rule (\w+):", dry, re.M) == ["average"]
    assert re.search(r"reason: Updated input files: \S*/scripts/average_checkpoints\.py", dry)
    # the sinusoidal encoding's file: its model's code key, so its training job
    edit(root / "fairseq_posenc" / "positions" / "sinusoidal.py")
    dry = runs.ok(runs.snakemake(work, STUDY, averaged, "-n", snakefile=snakefile, env=env))
    assert re.findall(r"^rule (\w+):", dry, re.M) == ["train", "average"]
    assert re.search(r"rule train:(.|\n)*?reason: Params have changed", dry)
