"""The workflow under recipes/profiles/slurm, with stand-ins for SLURM's commands on PATH
(tests/helpers/stubs/slurm: sbatch records what it is asked and submits nothing): a big FLOATER model of
2 nodes x 8 GPUs is one SLURM job, one task a node, whose shell starts fairseq-train with srun."""
import json
import os
import signal
import subprocess
import sys
import time

import yaml

from helpers import snakemake_runs as runs

PROFILE = os.path.join(runs.REPO, "recipes", "profiles", "slurm")
SLURM = os.path.join(runs.STUBS, "slurm")
BIG_2X8 = {"models": {"arch": "big", "encodings": ["floater"]},
           "train": {"recipe": "scaling_nmt", "device": "gpu", "nodes": 2, "gpus_per_node": 8, "max_update": 6,
                     "max_tokens": "auto"},
           "warm_start": {"enabled": True, "start": "vanilla", "control": False,
                          "vanilla": {"max_update": 6, "max_epoch": None}, "second": {"max_update": 3, "max_epoch": None}},
           "evaluate": {"checkpoints": "update", "average": 1}}


def _log(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def submit(work, config, target, env):
    """Snakemake with the profile until the first sbatch (the stub records it), then stopped:
    what it printed."""
    with open(os.path.join(work, "study.yaml"), "w") as f:
        yaml.safe_dump(config, f)
    proc = subprocess.Popen([runs.SNAKEMAKE, "-s", runs.SNAKEFILE, "--configfile", runs.DEMO, "study.yaml", "--profile", PROFILE,
                             target], cwd=work, env={**os.environ, **env}, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and not any(c["command"] == "sbatch" for c in _log(env["SLURM_LOG"])):
            time.sleep(1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.communicate()[0]


def test_a_big_floater_on_2_nodes_of_8_gpus_is_one_slurm_job_of_one_task_a_node(work):
    config = {**runs.STUDY, **BIG_2X8, "corpus": runs.STUDY["corpus"]}
    log = os.path.join(work, "slurm.jsonl")
    env = {"PATH": f"{SLURM}:{runs.STUBS}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "SLURM_LOG": log}
    # the vanilla stage here, as inside an allocation of two GPUs (its job's srun stand-in runs the
    # stub fairseq-train once)
    runs.ok(runs.snakemake(work, config, runs.target("vanilla"), env={**env, "CUDA_VISIBLE_DEVICES": "0,1"}))
    (srun,) = [c for c in _log(log) if c["command"] == "srun"]
    assert srun["argv"][:3] == ["--nodes=2", "--ntasks-per-node=1", "fairseq-train"]
    argv = srun["argv"]
    assert argv[argv.index("--distributed-world-size") + 1] == "16" and "--distributed-port" in argv
    # the dry run with the profile lists the FLOATER job's resources
    dry = runs.ok(runs.snakemake(work, config, runs.target("floater"), "-n", "--profile", PROFILE, env=env))
    resources = next(line for line in dry.split("wildcards: name=floater, seed=1")[1].splitlines()
                     if "resources:" in line)
    for item in ("nodes=2", "tasks=2", "mpi=srun", "gres=gpu:8", "runtime=4320", "mem_mb=64000", "cpus_per_gpu=4",
                 "slurm_extra=--ntasks-per-node=1"):
        assert item in resources, resources
    # submitted with the profile: sbatch records its line, then Snakemake is stopped
    submit(work, config, runs.target("floater"), env)
    (sbatch,) = [c for c in _log(log) if c["command"] == "sbatch"]
    line = sbatch["argv"]
    assert "--nodes=2" in line and "--ntasks=2" in line and "--ntasks-per-node=1" in line
    assert "--gres=gpu:8" in line and "--cpus-per-gpu=4" in line and line[line.index("-t") + 1] == "4320"
    assert not any(arg.startswith("--ntasks-per-gpu") for arg in line)
    # the job runs the floater model's train job alone (its shell, inside, starts srun)
    wrap = next(arg for arg in line if arg.startswith("--wrap="))
    assert "--target-jobs 'train:name=floater,seed=1'" in wrap


def test_downloads_and_extraction_run_on_the_submitting_host_under_the_profile(tmp_path):
    """Compute nodes often have no internet: under the profile the archives are checked and
    extracted where Snakemake runs; the tokenizer is the first SLURM job."""
    from helpers.toy_archives import write_archives

    work = str(tmp_path)
    write_archives("wmt14_en_de", os.path.join(work, "archives"), "en", "de")
    config = {**runs.STUDY, "out": "wmt", "corpus": {"name": "wmt14_en_de", "data": "wmt", "archives": "archives",
                                                   "download": False, "verify_checksums": False},
              "models": {"arch": "tiny", "encodings": ["sinusoidal"]}}
    log = os.path.join(work, "slurm.jsonl")
    env = {"PATH": f"{SLURM}:{runs.STUBS}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "SLURM_LOG": log}
    out = submit(work, config, "wmt/data-bin", env)
    assert "localrule extract:" in out and os.path.getsize(os.path.join(work, "wmt", "raw", "train.en")) > 0
    (sbatch,) = [c for c in _log(log) if c["command"] == "sbatch"]
    assert "--target-jobs 'tokenize:'" in next(arg for arg in sbatch["argv"] if arg.startswith("--wrap="))
