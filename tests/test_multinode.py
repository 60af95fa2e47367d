"""The recipes on several nodes, as far as one CPU machine can run them.

Two launchers start a recipe's training on N nodes: SLURM (srun runs train.sh in every task;
fairseq-train reads SLURM's environment and asks ``scontrol show hostnames`` for the first node)
and torchrun (the recipe, run once per node with NNODES, NODE_RANK, MASTER_ADDR and LAUNCH_ID,
wraps fairseq-train in torchrun, whose environment fairseq-train reads). Here every "node" is this
machine: SLURM's variables are set as srun sets them, with a stand-in ``scontrol`` on the PATH
that names localhost for every node, and the processes meet over loopback with gloo. GPU
launches (a task a node, fairseq-train spawning a process per GPU) cannot run here: their
arithmetic is checked in tests/test_plan.py. fairseq's launcher code needs a GPU where
these run: compat.launchers_without_cuda, tested at the end, lets it run on the CPU.
"""
import os
import re
import shutil
import signal
import socket
import subprocess

import pytest
import torch
from omegaconf import OmegaConf

from fairseq_posenc import compat, pipeline, toy_data

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(REPO, "recipes", "wmt14_en_de", "train.sh")
TINY = ("--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
        "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 4 "
        "--decoder-attention-heads 4")
# one thread a process: up to six share the machine's cores
RUN_ENV = {"MODEL_FLAGS": TINY, "EXTRA_FLAGS": "--num-workers 0 --seed 1", "MAX_TOKENS": "500", "UPDATE_FREQ": "1",
           "MAX_EPOCH": "", "MAX_UPDATE": "6", "AVERAGE": "2", "WARMUP": "10", "LR": "1e-3",
           "SAVE_INTERVAL_UPDATES": "1", "DEVICE": "cpu", "ENC": "sinusoidal", "ARCH": "base",
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "STAGE_WAIT": "120"}
SCONTROL = """#!/bin/sh
# SLURM's scontrol, as far as fairseq asks it: every node of the allocation is this machine
[ "$1 $2" = "show hostnames" ] || { echo "stand-in scontrol: only 'show hostnames'" >&2; exit 1; }
echo localhost
echo localhost
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """What prepare.sh leaves for train.sh: corpus.env and a data-bin (a toy corpus)."""
    root = tmp_path_factory.mktemp("multinode")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (400, 3, 10), "valid": (20, 3, 10)})
    pipeline.preprocess(prefixes, str(root / "data" / "data-bin"))
    (root / "data" / "corpus.env").write_text("RECIPE=wmt14_en_de\nSRC=src\nTGT=tgt\nBPE=subword-nmt\nBPE_SIZE=60\n"
                                              "VALID_NAME=toy\nTEST_NAME=toy\n")
    return root / "data"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_environ():
    """This process's environment without anything a launcher sets."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "TORCHELASTIC")) and k not in (
                "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NNODES", "NODE_RANK", "LAUNCH_ID")}


def _start(env, log, trace=None):
    """train.sh in a process of its own; with ``trace``, under strace, which records every file it
    opens (openat) in that file."""
    command = ["bash", TRAIN]
    if trace:
        command = ["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=openat,creat,rename,renameat,renameat2",
                   "-o", str(trace)] + command
    out = open(log, "w")
    # a session of its own: a failed run is stopped with everything it started (torchrun, fairseq-train)
    return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True), out


TEARDOWN_ABORT = "terminate called without an active exception"


def _wait(procs, logs, timeout=600, tolerated=lambda text: False):
    """Every process's output once all have ended; the others are stopped as soon as one fails
    (they would wait for it at the rendezvous), or at ``timeout``: a hung rendezvous, not a slow
    machine (four fairseq-train processes on a loaded 2-core machine took over 240 s)."""
    import time

    deadline = time.monotonic() + timeout
    while any(proc.poll() is None for proc, _ in procs) and time.monotonic() < deadline:
        if any(proc.poll() not in (None, 0) and not tolerated(open(log).read()) for (proc, _), log in zip(procs, logs)):
            break
        time.sleep(0.5)
    for proc, out in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.close()
    texts = [open(log).read() for log in logs]
    for (proc, _), log, text in zip(procs, logs, texts):
        assert proc.returncode == 0 or tolerated(text), f"{log}:\n" + text[-3000:]
    return texts


def _writes_under(trace, directory):
    """The files under ``directory`` that the traced processes opened to write, or renamed."""
    written = set()
    for line in open(trace):
        paths = re.findall(r'"([^"]*)"', line)
        if ("openat(" in line and re.search(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND", line)) or "creat(" in line \
                or "rename" in line:
            written.update(p for p in paths if p.startswith(str(directory)))
    return written


def _trained(out):
    state = torch.load(os.path.join(out, "checkpoint_last.pt"), map_location="cpu", weights_only=False)
    return state["optimizer_history"][-1]["num_updates"], state["cfg"]["distributed_training"]


# ------------------------------------------------------------------------------------------------
def test_the_recipe_trains_under_slurm_on_two_nodes_of_two_tasks_and_only_the_first_writes(data, tmp_path):
    """srun --nodes 2 --ntasks-per-node 2 bash recipes/wmt14_en_de/train.sh, with a task per
    process (fairseq's SLURM_NTASKS_PER_NODE > 1 branch: rank SLURM_PROCID, device
    SLURM_LOCALID). fairseq reads SLURM_STEP_NODELIST or SLURM_JOB_NODELIST, SLURM_NNODES,
    SLURM_NTASKS_PER_NODE (else SLURM_NTASKS), SLURM_NODEID, SLURM_PROCID and SLURM_LOCALID; the
    others are what srun sets besides."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    # strace, where it is installed and may trace (containers can forbid ptrace)
    trace = shutil.which("strace") is not None and subprocess.run(
        ["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=openat", "-o", os.devnull, "true"],
        capture_output=True).returncode == 0
    out, port = tmp_path / "run", str(_free_port())
    texts = _launch_slurm_tasks(data, tmp_path, bin_dir, out, port, trace)
    _check_slurm_run(texts, out, port, trace, tmp_path)


def _launch_slurm_tasks(data, tmp_path, bin_dir, out, port, trace):
    base = {**_clean_environ(), **RUN_ENV, "DATA": str(data), "OUT": str(out), "MASTER_PORT": port,
            "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    procs, logs = [], []
    for rank in range(4):
        env = {**base, "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "node[0-1]",
               "SLURM_STEP_NODELIST": "node[0-1]", "SLURM_NODELIST": "node[0-1]", "SLURM_NNODES": "2",
               "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_NTASKS": "4",
               "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2(x2)",
               "SLURM_NODEID": str(rank // 2), "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank % 2),
               "SLURMD_NODENAME": f"node{rank // 2}"}
        logs.append(tmp_path / f"task{rank}.log")
        procs.append(_start(env, logs[-1], trace=(tmp_path / f"task{rank}.strace") if trace and rank else None))
    # A known teardown abort of gloo's on this CPU stack: a task other than the first, after
    # training finished for all (fairseq's "done training" in the first node's log), aborts at
    # exit (one run in three before compat.process_group_destroyed_at_exit, one in 16 after on an
    # idle machine, more under load). It is tolerated there and only there; the first task must
    # succeed, and every check below runs.
    def tolerated(text):
        log = out / "train.log"
        return TEARDOWN_ABORT in text and "this is node 0, which writes" not in text and log.is_file() \
            and "done training" in log.read_text()

    return _wait(procs, logs, tolerated=tolerated)


def _check_slurm_run(texts, out, port, trace, tmp_path):
    # the plan counted the whole world: 4 processes, 500 x 4 tokens an update
    assert "| world: 4 processes = 2 node(s) x 2 (SLURM, a task per process); this is node 0, which writes the " \
           "shared files (FIRST_NODE=1)" in texts[0]
    assert "| tokens per update: 500 x 4 CPU processes x update-freq 1 = 2000 padded tokens at most" in texts[0]
    for rank in (1, 2, 3):
        assert (f"this is node {rank // 2}, which leaves the shared files to the first process (FIRST_NODE=0)"
                in texts[rank])
    per_epoch = int(re.search(r"\| updates per epoch: (\d+)", texts[0]).group(1))
    # and fairseq-train ran it: 4 ranks met at the first node's port, trained to MAX_UPDATE
    updates, distributed = _trained(out)
    assert updates == 6 and distributed["distributed_world_size"] == 4
    assert distributed["distributed_port"] == int(port) and distributed["distributed_backend"] == "gloo"
    log = (out / "train.log").read_text()
    assert len(re.findall(r"^== .* UTC fairseq-train ", log, re.M)) == 1  # one run's header, the first task's
    assert "distributed init (rank 0)" in log and "distributed init (rank 1)" not in log
    assert f"num_updates {min(per_epoch, 6)} " in log  # fairseq's epoch line, at the plan's updates per epoch
    assert (out / "train.env").read_text() == "TRAINED_MAX_UPDATE=6\nTRAINED_MAX_EPOCH=\n"
    if trace:  # the other three opened nothing under OUT to write (fairseq's other ranks save nothing)
        for rank in (1, 2, 3):
            assert _writes_under(tmp_path / f"task{rank}.strace", out) == set(), rank


def test_the_recipe_starts_torchrun_on_each_of_two_nodes(data, tmp_path):
    """NNODES=2 NODE_RANK=r MASTER_ADDR MASTER_PORT LAUNCH_ID bash train.sh on every node: the
    recipe wraps fairseq-train in torchrun (one process a node here, NPROC_PER_NODE on the CPU;
    on GPUs one per GPU) and fairseq-train reads torchrun's environment (env://). fairseq's own
    code divides by the GPU count there: compat.launchers_without_cuda makes it run on the CPU."""
    out = tmp_path / "run"
    base = {**_clean_environ(), **RUN_ENV, "DATA": str(data), "OUT": str(out), "NNODES": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "LAUNCH_ID": "test-launch-1"}
    logs = [tmp_path / f"node{rank}.log" for rank in (0, 1)]
    procs = [_start({**base, "NODE_RANK": str(rank)}, logs[rank]) for rank in (0, 1)]
    texts = _wait(procs, logs)
    assert ("| world: 2 processes = 2 node(s) x 1 (torchrun on each node, meeting at 127.0.0.1:"
            in texts[0]) and "this is node 1, which leaves the shared files" in texts[1]
    assert "| tokens per update: 500 x 2 CPU processes x update-freq 1 = 1000 padded tokens at most" in texts[0]
    updates, distributed = _trained(out)
    assert updates == 6 and distributed["distributed_world_size"] == 2
    assert distributed["distributed_init_method"] == "env://"
    log = (out / "train.log").read_text()
    assert "torchrun --nnodes 2 --node-rank 0 --nproc-per-node 1" in log and "--node-rank 1" not in log


# ------------------------------------------------------------------------------------------------
# compat.launchers_without_cuda: fairseq's launcher inference, on a machine without a GPU
def _cfg(**overrides):
    from fairseq.dataclass.configs import FairseqConfig

    cfg = OmegaConf.structured(FairseqConfig).distributed_training  # its tpu is common.tpu
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


@pytest.fixture
def launcher_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("SLURM_") or key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK"):
            monkeypatch.delenv(key)

    def setenv(**values):
        for key, value in values.items():
            monkeypatch.setenv(key, value)
    return setenv


def _infer():
    from fairseq.distributed import utils as distributed_utils

    compat.launchers_without_cuda()
    patched = distributed_utils.infer_init_method
    assert patched.without_cuda
    return patched, patched.__wrapped__


@pytest.mark.skipif(torch.cuda.is_available(), reason="fairseq's own code runs where torch sees a GPU")
def test_torchruns_environment_gives_the_local_rank_as_device_without_a_gpu(launcher_env):
    launcher_env(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", WORLD_SIZE="4", RANK="3", LOCAL_RANK="1")
    patched, original = _infer()
    with pytest.raises(ZeroDivisionError):  # fairseq: RANK % torch.cuda.device_count()
        original(_cfg(distributed_world_size=4))
    cfg = _cfg(distributed_world_size=4)
    patched(cfg)
    assert (cfg.distributed_init_method, cfg.distributed_world_size, cfg.distributed_rank, cfg.device_id,
            cfg.distributed_no_spawn) == ("env://", 4, 3, 1, True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="fairseq's own code runs where torch sees a GPU")
def test_slurm_tasks_take_their_rank_and_set_no_cuda_device_without_a_gpu(launcher_env, tmp_path, monkeypatch):
    (tmp_path / "scontrol").write_text(SCONTROL)
    (tmp_path / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    launcher_env(SLURM_JOB_NODELIST="node[0-1]", SLURM_NNODES="2", SLURM_NTASKS_PER_NODE="2", SLURM_NODEID="1",
                 SLURM_PROCID="3", SLURM_LOCALID="1")
    patched, original = _infer()
    with pytest.raises(AttributeError):  # fairseq: torch.cuda.set_device(SLURM_LOCALID), no CUDA in this torch
        original(_cfg(distributed_world_size=4, distributed_port=29511))
    cfg = _cfg(distributed_world_size=4, distributed_port=29511)
    patched(cfg)
    assert (cfg.distributed_init_method, cfg.distributed_rank, cfg.device_id, cfg.distributed_no_spawn) == (
        "tcp://localhost:29511", 3, 1, True)
    with pytest.raises(compat.PosencError, match="give the same port to every task"):
        patched(_cfg(distributed_world_size=4))
    # a task a node: fairseq would spawn a process per GPU, here nodes x 0 of them
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "1")
    with pytest.raises(compat.PosencError, match=r"on the CPU start a task per process \(srun --ntasks-per-node=P\)"):
        patched(_cfg(distributed_world_size=2, distributed_port=29511))
