"""fairseq's own distributed training runs every encoding as it runs stock models.

Two ``fairseq-train`` processes on this machine (gloo over loopback, ``--cpu``) must train the
model a single process trains with the same total batch: with ``--update-freq 2`` one process
sees batches (0, 1), (2, 3), ... per update, and rank r of two sees batch 2u + r of update u.
Dropout is 0, so the batches are the only input. The ranks' gradients are averaged with gloo
and the single process sums the same two gradients: a sum of two floats does not depend on the
order, so the runs agree to the last bit: the losses as fairseq logs them (rounded to 3
decimals) are identical, and so are the parameters after 5 Adam updates, for every encoding but
FLOATER. With FLOATER the two ways differ by up to 1e-5 (measured 9.8e-6, tolerance 1e-4), only
in the attention key biases. Under --update-freq one process solves the ODE once per update and
backpropagates it once with the two passes' gradients added (``FloaterODE.begin_update``), while
each rank backpropagates its own solve: the same gradient up to rounding. The key biases' exact
gradient is 0 (a key bias adds the same q.b to every logit of a row, which softmax ignores), so
what is computed for them is rounding noise of ~1e-8, which Adam normalises into an update of up
to its learning rate.

``--ddp-backend pytorch_ddp`` (fairseq's default, torch's DistributedDataParallel) runs without
``--find-unused-parameters``: it fails at the second update if any parameter was left out of
the first one's backward graph. That proves every parameter is in the graph, not that its
gradient is non-zero; tests/unit/test_position_gradients.py checks that. fairseq passes CUDA
device ids to it even with ``--cpu``, which torch refuses; ``compat.ddp_on_cpu`` drops them.
``legacy_ddp`` (fairseq's own all-reduce) is checked too. torchrun does not work on CPU
(fairseq derives a CUDA device from the rank), so the two processes are started by hand, as a
node's launcher would.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from posenc_workflow import pipeline, toy_data
from fairseq_posenc.positions import POSITION_ENCODINGS
from fairseq_posenc.positions.randomized import RandomizedConfig
from helpers.fairseq_runs import preprocess_here

UPDATES = 5
#: after 5 Adam updates at lr 1e-3 (each parameter moves by up to 5e-3); see FLOATER below
PARAMETER_TOLERANCE = 1e-4
MODEL = [
    "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (400, 3, 10), "valid": (20, 3, 10)})
    return preprocess_here(prefixes, str(root / "bin"))


def _rendezvous(path) -> str:
    """The ranks meet through a file (torch's FileStore), not a TCP port: a port found free when the
    cases are laid out may be taken by another process before a later case starts (EADDRINUSE left
    the other rank waiting)."""
    return f"file://{path}"


def _command(data_bin, save_dir, encoding, *extra):
    return [pipeline.executable("fairseq-train"), data_bin, "--user-dir", pipeline.USER_DIR,
            "--save-dir", save_dir, "--arch", "transformer_posenc", "--position-encoding", encoding, "--cpu",
            *MODEL, "--dropout", "0", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "300",
            "--max-update", str(UPDATES), "--disable-validation", "--no-epoch-checkpoints",
            "--log-format", "json", "--log-interval", "1", "--no-progress-bar", "--seed", "1",
            "--num-workers", "0", *extra]


def _start(cmd, log):
    # one thread each: three processes share the machine's cores
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


def _finish(proc, log):
    proc.wait(timeout=300)
    text = open(log).read()
    assert proc.returncode == 0, f"{log}:\n" + "\n".join(text.splitlines()[-15:])
    return text


def _losses(log_text):
    """[loss of update 1, 2, ...] as fairseq logs them (json lines of train_inner)."""
    rows = [json.loads(line.split("| train_inner | ", 1)[1]) for line in log_text.splitlines()
            if "| train_inner | " in line]
    assert [int(r["num_updates"]) for r in rows] == list(range(1, len(rows) + 1))
    return [r["loss"] for r in rows]


def _parameters(save_dir):
    return torch.load(os.path.join(save_dir, "checkpoint_last.pt"), map_location="cpu")["model"]


#: fairseq-train runs in one process one after another (console entry point, own command line each):
#: a rank's process runs its part of every case, the ranks meet again for each case on a port of
#: its own, and the process group is taken down between cases, so that the next initialises afresh
RUNNER = """
import json, logging, sys, traceback
from fairseq_cli import train  # first: it sets up the logging that the test reads
import torch.distributed as dist
from fairseq.distributed import utils as distributed_utils

fairseq_format = logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s", "%Y-%m-%d %H:%M:%S")
for log, argv in json.load(open(sys.argv[1])):
    handler = logging.FileHandler(log)
    handler.setFormatter(fairseq_format)
    logging.getLogger().addHandler(handler)
    sys.argv = ["fairseq-train", *argv]
    try:
        train.cli_main()
        status = "RUN OK"
    except BaseException:
        status = "RUN FAILED\\n" + traceback.format_exc()
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
        logging.getLogger().setLevel(logging.INFO)  # fairseq quiets the ranks but 0
        with open(log, "a") as f:
            f.write(status + "\\n")
        if dist.is_initialized():
            dist.destroy_process_group()
        if hasattr(distributed_utils.get_global_group, "_global_group"):  # fairseq caches the group
            del distributed_utils.get_global_group._global_group
"""

#: (encoding, --ddp-backend, its flags) of each case: every encoding under torch's DDP, FLOATER under
#: legacy_ddp, and each encoding that takes --randomized-positions with it (each sentence's draw is its
#: own: the same whichever rank holds it)
RANDOMIZED = ["--randomized-positions", "--randomized-decoder"]  # both stacks draw
CASES = [(encoding, "pytorch_ddp", []) for encoding in POSITION_ENCODINGS] + [("floater", "legacy_ddp", [])] + [
    (encoding, "pytorch_ddp", RANDOMIZED) for encoding, scheme in POSITION_ENCODINGS.items()
    if scheme.config is not None and issubclass(scheme.config, RandomizedConfig)]


def _case(encoding, ddp_backend, flags):
    return "-".join([encoding, ddp_backend, *(f.strip("-") for f in flags)])


@pytest.fixture(scope="module")
def trained(data_bin, tmp_path_factory):
    """Every case's two ranks and its single-process run with --update-freq 2, the three processes
    at once, each running its part of every case in turn."""
    root = tmp_path_factory.mktemp("ddp")
    parts = {"rank0": [], "rank1": [], "single": []}
    for encoding, backend, flags in CASES:
        case = root / _case(encoding, backend, flags)
        init = _rendezvous(case.with_name(case.name + ".rendezvous"))
        for rank in (0, 1):
            parts[f"rank{rank}"].append((str(case / f"rank{rank}.log"), _command(
                data_bin, str(case / "ddp"), encoding, "--distributed-world-size", "2", "--distributed-rank", str(rank),
                "--distributed-init-method", init, "--distributed-no-spawn", "--distributed-backend", "gloo",
                "--ddp-backend", backend, *flags)[1:]))
        parts["single"].append((str(case / "single.log"),
                                _command(data_bin, str(case / "single"), encoding, "--update-freq", "2", *flags)[1:]))
        case.mkdir()
    procs = {}
    for name, jobs in parts.items():
        spec = root / f"{name}.json"
        spec.write_text(json.dumps(jobs))
        procs[name] = _start([sys.executable, "-c", RUNNER, str(spec)], root / f"{name}.out")
    for name, proc in procs.items():
        try:
            proc.wait(timeout=900)
        except subprocess.TimeoutExpired:
            for other in procs.values():
                other.kill()
            pytest.fail(f"the {name} process did not finish: {(root / f'{name}.out').read_text()[-3000:]}")
    return root


def _log(path):
    text = open(path).read()
    assert "RUN OK" in text, f"{path}:\n" + "\n".join(text.splitlines()[-15:])
    return text


def _assert_same_training(root, encoding, ddp_backend, flags=()):
    case = root / _case(encoding, ddp_backend, flags)
    rank0_log, single_log = _log(case / "rank0.log"), _log(case / "single.log")
    _log(case / "rank1.log")
    assert "distributed init (rank 0)" in rank0_log and "'distributed_world_size': 2" in rank0_log
    assert f"'ddp_backend': '{ddp_backend}'" in rank0_log and "'find_unused_parameters': False" in rank0_log
    distributed, single = _losses(rank0_log), _losses(single_log)
    assert len(single) == UPDATES
    assert distributed == single
    trained, reference = _parameters(case / "ddp"), _parameters(case / "single")
    assert trained.keys() == reference.keys()
    differences = {name: (trained[name].float() - reference[name].float()).abs().max().item()
                   for name in reference if reference[name].is_floating_point() and reference[name].numel()}
    largest = sorted(differences.items(), key=lambda kv: -kv[1])[:3]
    print(f"{encoding} {ddp_backend}: largest parameter differences {largest}")
    assert largest[0][1] <= PARAMETER_TOLERANCE, largest
    if encoding != "floater":
        assert largest[0][1] == 0.0, largest


@pytest.mark.parametrize("encoding", list(POSITION_ENCODINGS))
def test_two_processes_train_exactly_as_one_with_the_same_total_batch(trained, encoding):
    _assert_same_training(trained, encoding, "pytorch_ddp")


@pytest.mark.parametrize("encoding", [encoding for encoding, _, flags in CASES if flags == RANDOMIZED])
def test_two_processes_train_exactly_as_one_with_randomized_positions(trained, encoding):
    _assert_same_training(trained, encoding, "pytorch_ddp", RANDOMIZED)


def test_fairseqs_legacy_ddp_trains_exactly_as_one_process(trained):
    _assert_same_training(trained, "floater", "legacy_ddp")


# FLOATER with --floater-solve-every N > 1: each rank accumulates the gradient of its own passes on
# the kept solution, and at the cycle's last update the ranks all-reduce it once (sum / ranks, as
# DDP averages every other gradient) and backpropagate it through one solve each. torch's DDP is
# told to ignore the flow model's parameters, which the passes never use: it runs without
# --find-unused-parameters. Each rank writes its flow model at the end (only rank 0 saves a
# checkpoint), so that the test sees that every rank holds the same h.
FLOW_RECORD = """
import os, sys
import torch
from fairseq_cli.train import cli_main  # first: it sets up the logging that the test reads
from fairseq.trainer import Trainer
import fairseq_posenc

trainers, init = [], Trainer.__init__

def record_init(self, *args, **kwargs):
    init(self, *args, **kwargs)
    trainers.append(self)

Trainer.__init__ = record_init
sys.argv[0] = "fairseq-train"
cli_main()
ode = trainers[0].get_model().encoder.position_encoding.ode
torch.save({n: p.detach().clone() for n, p in ode.named_parameters()},
           os.environ["FLOW_OUT"] + str(trainers[0].data_parallel_rank) + ".pt")
"""

SOLVE_EVERY = ["--floater-solve-every", "2", "--max-update", "5"]  # 5: the last cycle is cut by --max-update


def _flow_run(cmd, log, flow_out):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "FLOW_OUT": flow_out}
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-c", FLOW_RECORD, *cmd[1:]], stdout=out, stderr=subprocess.STDOUT,
                                env=env)


def test_floaters_flow_update_every_n_updates_trains_two_processes_as_one(data_bin, tmp_path):
    """Both DDP backends (legacy_ddp fills a missing gradient with zeros, which the schedule takes
    back: Adam would move h at every update), and the single process, all five at once."""
    backends, procs = ("pytorch_ddp", "legacy_ddp"), {}
    for backend in backends:
        init = _rendezvous(tmp_path / f"{backend}.rendezvous")
        for rank in (0, 1):
            procs[backend, rank] = _flow_run(_command(
                data_bin, str(tmp_path / backend), "floater", *SOLVE_EVERY, "--distributed-world-size", "2",
                "--distributed-rank", str(rank), "--distributed-init-method", init, "--distributed-no-spawn",
                "--distributed-backend", "gloo", "--ddp-backend", backend), tmp_path / f"{backend}{rank}.log",
                str(tmp_path / f"{backend}_flow"))
    procs["single"] = _flow_run(_command(data_bin, str(tmp_path / "single"), "floater", *SOLVE_EVERY, "--update-freq",
                                         "2"), tmp_path / "single.log", str(tmp_path / "single_flow"))
    logs = {key: _finish(p, tmp_path / (f"{key[0]}{key[1]}.log" if key != "single" else "single.log"))
            for key, p in procs.items()}
    reference = _losses(logs["single"])
    single_flow = torch.load(tmp_path / "single_flow0.pt")
    expected = _parameters(tmp_path / "single")
    assert len(reference) == 5
    for backend in backends:
        rank0_log = logs[backend, 0]
        assert "'distributed_world_size': 2" in rank0_log and "'find_unused_parameters': False" in rank0_log
        assert ("DDP ignores the flow model's parameters" in rank0_log) == (backend == "pytorch_ddp")
        assert _losses(rank0_log) == reference, backend
        # every rank holds the same flow model, bit for bit
        flows = [torch.load(tmp_path / f"{backend}_flow{rank}.pt") for rank in (0, 1)]
        assert flows[0].keys() == flows[1].keys() == single_flow.keys()
        assert all(torch.equal(flows[0][n], flows[1][n]) for n in flows[0]), backend
        # and as the single process trained it, as every other parameter (the module doc: to
        # rounding, which Adam normalises into steps of up to lr on the key biases' near-zero gradients)
        trained = _parameters(tmp_path / backend)
        differences = {name: (trained[name].float() - expected[name].float()).abs().max().item()
                       for name in expected if expected[name].is_floating_point() and expected[name].numel()}
        largest = max(differences.items(), key=lambda kv: kv[1])
        print(f"floater N=2 {backend}: largest parameter difference {largest}")
        assert largest[1] <= PARAMETER_TOLERANCE, (backend, largest)
        # the flow model moved at updates 2, 4 and at the last, 5: no gradient is left pending
        assert not trained["encoder.position_encoding.ode.pending_gradient"].any(), backend
