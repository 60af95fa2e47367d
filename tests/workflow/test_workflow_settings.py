"""recipes/Snakefile's refusals before any job, through Snakemake and recipes/run.sh as a user runs
them: a configuration the schema refuses (one line per error naming its file, no schema), a study of
train.device gpu run here on a machine without a GPU (its dry run plans it), the corpus's own file's
values as that corpus's defaults (not refused as the user's), study files among run.sh's options."""
import os
import re
import subprocess
import sys

import yaml

from helpers import snakemake_server
from helpers.snakemake_runs import REPO, STUDY, calls, ok, run_sh_call, study, target
# Snakemake in a process kept warm (its imports paid once)
from helpers.snakemake_server import run_sh, snakemake
from helpers.toy_archives import write_plain_pairs

# no GPU here, whatever the machine has: CUDA_VISIBLE_DEVICES empty, as recipes/run.sh counts them
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


def test_a_misspelled_key_is_one_line_naming_the_close_match_not_the_schema(tmp_path):
    config = study(train__max_updates=5, evaluate__beam=0)
    config["modles"] = {}
    proc = snakemake(str(tmp_path), config, "-n")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    errors = out.split("configuration refused by recipes/conf/schema.yaml:\n")[1].splitlines()[:3]
    assert errors == ["modles (study.yaml): not a setting; did you mean models?",
                      "evaluate.beam (study.yaml): 0 is less than the minimum of 1",
                      "train.max_updates (study.yaml): not a setting of train; did you mean max_update?"]
    # no schema: its descriptions and keywords are nowhere in the output, which is a few lines
    assert "description" not in out and "additionalProperties" not in out and len(out.splitlines()) < 20, out


def write(path, data):
    with open(path, "w") as f:
        yaml.safe_dump(data, f)


def jobs(out):
    """The dry run's job counts, by rule."""
    return dict(re.findall(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[1].split("Reasons")[0], re.M))


def test_a_gpu_study_run_here_without_a_gpu_is_refused_before_any_job_but_planned(tmp_path):
    # through run.sh, which passes --resources=gpus=0 here: Snakemake cuts each job's gpus to it
    work = str(tmp_path)
    write(tmp_path / "gpu.yaml", study(train__device="gpu"))
    # the dry run and the run in one Snakemake process (helpers/snakemake_server.py)
    planned, proc = snakemake_server.runs([run_sh_call(REPO, work, "demo", "gpu.yaml", target("sinusoidal"), *dry,
                                                     env=NO_GPU, stub=True) for dry in (["-n"], [])])
    planned = ok(planned)
    assert "--resources=gpus=0" in planned
    assert "| plan: no GPU on this machine: the trainings and decodes run through a profile or executor" in planned
    assert "rule train:" in planned
    out = proc.stdout + proc.stderr
    refusal = [line for line in out.splitlines() if "configuration refused" in line]
    assert proc.returncode != 0 and refusal == [
        "configuration refused: train.device gpu, and no GPU on this machine for its train jobs: set train.device: "
        "cpu to run them on the CPU, or run the study where its GPUs are (--profile recipes/profiles/slurm)"], out
    # before any job: not even the corpus, which the training needs first
    assert not os.path.exists(os.path.join(work, STUDY["corpus"]["data"])) and calls(work) == []
    # train.device cpu (the demo's) runs here: the corpus, then the training
    write(tmp_path / "cpu.yaml", study(train__device="cpu"))
    ok(run_sh(REPO, work, "demo", "cpu.yaml", target("sinusoidal"), env=NO_GPU, stub=True))
    assert [c["to"] for c in calls(work)] == [STUDY["train"]["max_update"]]
    assert os.path.exists(os.path.join(work, target("sinusoidal")))


def run_args(cwd, *args):
    return subprocess.run([sys.executable, os.path.join(REPO, "recipes", "posenc_workflow", "run_args.py"), *args],
                          cwd=cwd, capture_output=True, text=True)


def test_run_sh_takes_study_files_among_its_options_not_an_options_value(tmp_path):
    for name in ("a.yaml", "b.yml", "p.yaml", "c.yaml"):
        write(tmp_path / name, {"out": name})
    # (positions from 0) -n takes nothing, --profile and --report one, --config KEY=VALUE words
    # only, --configfile every word up to the next option; missing.yaml is no file, a target
    args = ["-n", "a.yaml", "--profile", "p.yaml", "--config", "x=1", "b.yml", "-c2", "c.yaml", "--report",
            "p.yaml", "--configfile", "p.yaml", "c.yaml", "-p", "missing.yaml", "--", "a.yaml"]
    assert run_args(tmp_path, *args).stdout == "1 6 8\n"
    assert run_args(tmp_path, "a.yaml", "b.yml", "-n").stdout == "0 1\n"  # no option before them: no parser read
    assert run_args(tmp_path, "--dry", "a.yaml", "-c", "4", "b.yml", "-j4", "c.yaml").stdout == "1 4 6\n"
    # through run.sh: a study file after -n plans as before it
    write(tmp_path / "study.yaml", STUDY)
    after, before = (ok(proc) for proc in snakemake_server.runs(
        [run_sh_call(REPO, str(tmp_path), "demo", *order) for order in (["study.yaml", "-n"], ["-n", "study.yaml"])]))
    assert jobs(after) == jobs(before) == {"toy_corpus": "1", "train": "1", "average": "1", "decode": "1",
                                           "label": "1", "study_config": "1", "demo_report": "1", "all": "1",
                                           "total": "8"}, after


def test_a_study_files_syntax_error_is_one_line_naming_its_file_and_line(tmp_path):
    (tmp_path / "mine.yaml").write_text("models:\n  arch: tiny\n  encodings: [rope, alibi\ntrain: {}\n")
    proc = run_sh(REPO, str(tmp_path), "files", "-n", "mine.yaml")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == "run.sh: mine.yaml line 4: expected ',' or ']', but got ':'\n"
    (tmp_path / "list.yaml").write_text("- models\n")
    proc = run_sh(REPO, str(tmp_path), "files", "list.yaml", "-n")
    assert proc.stderr == "run.sh: list.yaml: a list, not settings (section: {field: value})\n"


FILES = {"out": "study", "corpus": {"pair": "de-en", "train": {"src": "train.de", "tgt": "train.en"},
                                    "test": {"mine": {"src": "test.de", "tgt": "test.en"}}}}


def test_the_corpus_files_values_are_its_defaults_not_the_users_and_a_refusal_names_its_file(tmp_path):
    work = str(tmp_path)
    for part, count in (("train", 100), ("test", 5)):
        write_plain_pairs(str(tmp_path / part), count, "de", "en")
    # files.yaml's batch_target 4096 and baseline sinusoidal are the corpus's: the user's batch
    # (max_tokens and update_freq) and rows without sinusoidal are not refused for them; the
    # report's baseline is the schema's default's (sinusoidal if a row, else the first)
    write(tmp_path / "mine.yaml", {**FILES, "models": {"encodings": ["rope", "alibi"]},
                                   "train": {"max_tokens": 256, "update_freq": 1}})
    # the three dry runs in one Snakemake process (helpers/snakemake_server.py)
    write(tmp_path / "given.yaml", {"train": {"batch_target": 4096}, "models": {"baseline": "sinusoidal"}})
    out, given, recipe = snakemake_server.runs([run_sh_call(REPO, work, "files", "mine.yaml", *args) for args in (
        ["-n", "-p"], ["given.yaml", "-n"], ["-n", "--config", "train={'recipe': 'toy', 'max_tokens': 256}"])])
    out = ok(out)
    assert jobs(out)["train"] == "2" and "--max-tokens 256 --update-freq 1" in out
    assert '"baseline": null' in out  # the report's record (study.json)
    # the same given by the user: refused, naming the file
    refusal = [line for line in given.stdout.splitlines() + given.stderr.splitlines() if "configuration refused" in line]
    assert given.returncode != 0 and refusal == [
        "configuration refused: train.batch_target 4096 (given.yaml): train.max_tokens and train.update_freq are "
        "both set: nothing is chosen for it"]
    # a value of the corpus's file that the user's settings cannot run with: refused, naming that file
    refusal = [line for line in recipe.stdout.splitlines() + recipe.stderr.splitlines() if "configuration refused" in line]
    assert recipe.returncode != 0 and refusal == [
        "configuration refused: models.arch iwslt (recipes/conf/files.yaml): train.recipe toy trains "
        "transformer_posenc at the sizes tiny, small, medium, base (scaling_nmt trains fairseq's iwslt)"]
