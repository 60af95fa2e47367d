"""The workflow under recipes/profiles/slurm, with stand-ins for SLURM's commands on PATH
(tests/helpers/stubs/slurm: sbatch records what it is asked and submits nothing): a big FLOATER model of
2 nodes x 8 GPUs is one SLURM job, one task a node, whose shell starts fairseq-train with srun."""
import json
import os
import shutil
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


def submit(work, config, target, env, *args):
    """Snakemake with the profile until the first sbatch (the stub records it), then stopped:
    what it printed."""
    with open(os.path.join(work, "study.yaml"), "w") as f:
        yaml.safe_dump(config, f)
    proc = subprocess.Popen([runs.SNAKEMAKE, "-s", runs.SNAKEFILE, "--configfile", runs.DEMO, "study.yaml", "--profile", PROFILE,
                             target, *args], cwd=work, env={**os.environ, **env}, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and not any(c["command"] == "sbatch" for c in _log(env["STUB_SLURM_LOG"])):
            time.sleep(1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.communicate()[0]


def test_a_big_floater_on_2_nodes_of_8_gpus_is_one_slurm_job_of_one_task_a_node(work):
    config = {**runs.STUDY, **BIG_2X8, "corpus": runs.STUDY["corpus"]}
    log = os.path.join(work, "slurm.jsonl")
    env = {"PATH": f"{SLURM}:{runs.STUBS}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "STUB_SLURM_LOG": log}
    # the vanilla stage here, as inside an allocation of two GPUs (its job's srun stand-in runs the
    # stub fairseq-train once)
    runs.ok(runs.snakemake(work, config, runs.target("vanilla"), env={**env, "CUDA_VISIBLE_DEVICES": "0,1"}))
    (srun,) = [c for c in _log(log) if c["command"] == "srun"]
    assert srun["argv"][:4] == ["--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=32", "fairseq-train"]
    argv = srun["argv"]
    assert argv[argv.index("--distributed-world-size") + 1] == "16" and "--distributed-port" in argv
    # the dry run with the profile lists the FLOATER job's resources
    dry = runs.ok(runs.snakemake(work, config, runs.target("floater"), "-n", "--profile", PROFILE, env=env))
    resources = next(line for line in dry.split("wildcards: name=floater, seed=1")[1].splitlines()
                     if "resources:" in line)
    for item in ("nodes=2", "tasks=2", "mpi=srun", "gres=gpu:8", "runtime=4320", "mem_mb=64000", "cpus_per_task=32",
                 "slurm_extra=--ntasks-per-node=1"):
        assert item in resources, resources
    # submitted with the profile: sbatch records its line, then Snakemake is stopped
    submit(work, config, runs.target("floater"), env)
    (sbatch,) = [c for c in _log(log) if c["command"] == "sbatch"]
    line = sbatch["argv"]
    assert "--nodes=2" in line and "--ntasks=2" in line and "--ntasks-per-node=1" in line
    assert "--gres=gpu:8" in line and "--cpus-per-task=32" in line and line[line.index("-t") + 1] == "4320"
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
    env = {"PATH": f"{SLURM}:{runs.STUBS}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "STUB_SLURM_LOG": log}
    out = submit(work, config, "wmt/data-bin", env)
    assert "localrule extract:" in out and os.path.getsize(os.path.join(work, "wmt", "raw", "train.en")) > 0
    (sbatch,) = [c for c in _log(log) if c["command"] == "sbatch"]
    assert "--target-jobs 'tokenize:'" in next(arg for arg in sbatch["argv"] if arg.startswith("--wrap="))


# a user's cluster, stated once (the study's cluster section): every job's account and partition,
# the training's time limit; the GPU jobs' CPUs from cluster.cpus_per_gpu (4)
CLUSTER = {"account": "nlp", "gpu_partition": "a100", "cpu_partition": "cpu", "train_minutes": 600}
SHAPE = {"models": {"arch": "tiny", "encodings": ["sinusoidal"]}, "cluster": CLUSTER,
         "train": {"recipe": "toy", "device": "gpu", "max_update": 6, "max_tokens": 1000, "threads": 1}}


def _shape(nodes, gpus, **train):
    return {**runs.STUDY, **SHAPE, "train": {**SHAPE["train"], "nodes": nodes, "gpus_per_node": gpus, **train}}


def _sbatch(line):
    """sbatch's argument list without what names one run (job name, log, comment, directory, the job's command)."""
    out, skip = [], False
    for arg in line:
        if skip:
            skip = False
        elif arg in ("--job-name", "--output", "--comment", "-D"):
            skip = True
        elif not arg.startswith("--wrap="):
            out.append(arg)
    return out


def _env(work, **more):
    log = os.path.join(work, "slurm.jsonl")
    return {"PATH": f"{SLURM}:{runs.STUBS}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "STUB_SLURM_LOG": log,
            "STUB_LOG": os.path.join(work, "calls.jsonl"), "OMP_NUM_THREADS": "1", **more}


def test_a_preempted_1x8_training_is_requeued_by_slurm_and_resumes_from_its_checkpoint(work):
    """The whole run under the profile, sbatch running the jobs: the training of 1 node x 8 GPUs is
    preempted after update 3 (sacct reports PREEMPTED), SLURM requeues it (the profile's --requeue),
    and its second run goes on from update 3."""
    env = _env(work, STUB_RUN_JOBS="1", STUB_PREEMPT_IN="train:name=sinusoidal", STUB_PREEMPT_AFTER="3",
               CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
    runs.ok(runs.snakemake(work, _shape(1, 8), runs.target("sinusoidal"), "--profile", PROFILE,
                           "--slurm-init-seconds-before-status-checks", "1", env=env))
    log = _log(env["STUB_SLURM_LOG"])
    (sbatch,) = [c for c in log if c["command"] == "sbatch"]
    assert _sbatch(sbatch["argv"]) == ["--parsable", "--export=ALL", "-A", "nlp", "-p", "a100", "-t", "600", "--mem",
                                       "64000", "--requeue", "--cpus-per-task=32", "--gres=gpu:8"]
    assert [(c["event"], c["job"]) for c in log if c["command"] == "slurm"] == [("preempted", "4242"),
                                                                                ("requeued", "4242")]
    assert any(c["command"] == "sacct" and "--name" in c["argv"] for c in log)
    # the job's step, twice (preempted, requeued): the job's 32 CPUs, 4 for each of the 8 GPUs' processes
    steps = [c for c in log if c["command"] == "srun"]
    assert [c["argv"][:5] for c in steps] == [["-n1", "--cpu-bind=q", "--cpus-per-task=32", "--gpus=8",
                                               "--nodes=1"]] * 2
    assert [c["cpus_per_task"] // 8 for c in steps] == [4, 4]
    trains = [(c["from"], c["to"]) for c in runs.calls(work) if c["command"] == "train"]
    assert trains == [(0, 3), (3, 6)]
    assert runs.record(work, "sinusoidal")["updates"] == 6


def test_2x8_and_4x4_are_one_job_a_training_and_two_at_once_listen_on_two_ports(corpus, tmp_path):
    """2 x 8 and 4 x 4 under the profile: their sbatch lines from the one cluster section, an override
    of one resource (--set-resources train:mem_mb=...) keeping the others, the plan's warning where
    the estimate outlasts the limit x the tries; then both jobs' commands run at once as SLURM would
    run them (SLURM_JOB_ID 4242 and 4243): each srun gives a node's task the job's CPUs, and rank 0
    listens on a port of its own job."""
    lines, works = {}, {}
    for nodes, gpus, job in ((2, 8, "4242"), (4, 4, "4243")):
        work = str(tmp_path / f"{nodes}x{gpus}")
        shutil.copytree(corpus, os.path.join(work, "corpus"))
        works[nodes] = work
        env = _env(work)
        # 0.001 target tokens a second a GPU: hundreds of hours on 16 GPUs, past 600 min x 3 tries
        printed = submit(work, _shape(nodes, gpus, tokens_per_second=0.001), runs.target("sinusoidal"), env,
                         "--set-resources", "train:mem_mb=128000")
        assert "no GPU on this machine" not in printed
        (sbatch,) = [c for c in _log(env["STUB_SLURM_LOG"]) if c["command"] == "sbatch"]
        lines[nodes] = _sbatch(sbatch["argv"])
        wrap = next(arg for arg in sbatch["argv"] if arg.startswith("--wrap="))[len("--wrap="):]
        works[nodes] = (work, wrap, job, printed)
    assert lines[2] == ["--parsable", "--export=ALL", "-A", "nlp", "-p", "a100", "-t", "600", "--mem", "128000",
                        "--nodes=2", "--requeue", "--ntasks=2", "--cpus-per-task=32", "--ntasks-per-node=1",
                        "--gres=gpu:8"]
    assert lines[4] == ["--parsable", "--export=ALL", "-A", "nlp", "-p", "a100", "-t", "600", "--mem", "128000",
                        "--nodes=4", "--requeue", "--ntasks=4", "--cpus-per-task=16", "--ntasks-per-node=1",
                        "--gres=gpu:4"]
    # 4315 GPU-hours on 16 GPUs: 270 h, past 600 min x (2 retries + 1)
    warning = ("| plan: warning: sinusoidal/seed1's estimate (270 h) exceeds cluster.train_minutes 600 x 3 tries "
               "(retries 2): raise cluster.train_minutes (at most the partition's MaxTime) or --retries, or it stops "
               "unfinished")
    assert [line for line in works[2][3].splitlines() if line.startswith("| plan: ")] == [warning]
    assert [line for line in works[4][3].splitlines() if line.startswith("| plan: ")] == [warning]
    jobs = [subprocess.Popen(["bash", "-c", wrap], cwd=work, start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, **_env(work, SLURM_JOB_ID=job, CUDA_VISIBLE_DEVICES="0,1,2,3")})
            for work, wrap, job, _ in works.values()]
    for proc in jobs:
        assert proc.wait(timeout=240) == 0, proc.stdout.read()[-3000:]
    for nodes, cpus, port in ((2, 32, "24242"), (4, 16, "24243")):
        work = works[nodes][0]
        (srun,) = [c for c in _log(os.path.join(work, "slurm.jsonl")) if c["command"] == "srun"]
        argv = srun["argv"]
        assert argv[:4] == [f"--nodes={nodes}", "--ntasks-per-node=1", f"--cpus-per-task={cpus}", "fairseq-train"]
        assert argv[argv.index("--distributed-port") + 1] == port and srun["cpus_per_task"] == cpus
