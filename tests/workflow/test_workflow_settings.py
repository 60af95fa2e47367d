"""recipes/Snakefile's refusals before any job, through Snakemake and recipes/run.sh as a user runs
them: a configuration the schema refuses (one line per error, no schema), and a study of
train.device gpu run here on a machine without a GPU (its dry run plans it)."""
import os

import yaml

from helpers.snakemake_runs import REPO, STUDY, calls, ok, run_sh, snakemake, study, target

# no GPU here, whatever the machine has: CUDA_VISIBLE_DEVICES empty, as recipes/run.sh counts them
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


def test_a_misspelled_key_is_one_line_naming_the_close_match_not_the_schema(tmp_path):
    config = study(train__max_updates=5, evaluate__beam=0)
    config["modles"] = {}
    proc = snakemake(str(tmp_path), config, "-n")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    errors = out.split("configuration refused by recipes/conf/schema.yaml:\n")[1].splitlines()[:3]
    assert errors == ["modles: not a setting; did you mean models?",
                      "evaluate.beam: 0 is less than the minimum of 1",
                      "train.max_updates: not a setting of train; did you mean max_update?"]
    # no schema: its descriptions and keywords are nowhere in the output, which is a few lines
    assert "description" not in out and "additionalProperties" not in out and len(out.splitlines()) < 20, out


def write(path, data):
    with open(path, "w") as f:
        yaml.safe_dump(data, f)


def test_a_gpu_study_run_here_without_a_gpu_is_refused_before_any_job_but_planned(tmp_path):
    # through run.sh, which passes --resources=gpus=0 here: Snakemake cuts each job's gpus to it
    work = str(tmp_path)
    write(tmp_path / "gpu.yaml", study(train__device="gpu"))
    planned = ok(run_sh(REPO, work, "demo", "gpu.yaml", target("sinusoidal"), "-n", env=NO_GPU, stub=True))
    assert "--resources=gpus=0" in planned
    assert "| plan: no GPU on this machine: the trainings and decodes run through a profile or executor" in planned
    assert "rule train:" in planned
    proc = run_sh(REPO, work, "demo", "gpu.yaml", target("sinusoidal"), env=NO_GPU, stub=True)
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
