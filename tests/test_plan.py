"""fairseq_posenc/recipe/plan.py: the batch per update whatever the GPU count, updates per epoch from the
binarized corpus, which interval checkpoints get averaged (and refusing when too few), the
device flags of training and decoding, and whether a run reached its target."""
import os
import sys

import numpy as np
import pytest
import torch

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fairseq_posenc", "recipe", "plan.py")
from fairseq_posenc.recipe import plan as train_plan  # noqa: E402


class _Proc:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run(capsys):
    """plan.py's main in this process (a fairseq import per call would cost seconds)."""
    def call(*args):
        capsys.readouterr()
        try:
            train_plan.main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code
        out, err = capsys.readouterr()
        return _Proc(code, out, err)
    return call


def _data_bin(path, src_sizes, tgt_sizes, src="en", tgt="fr", vocab=100):
    """A binarized training set with these token counts (</s> included), as fairseq-preprocess writes."""
    from fairseq.data.indexed_dataset import MMapIndexedDatasetBuilder

    os.makedirs(path, exist_ok=True)
    for lang, sizes in ((src, src_sizes), (tgt, tgt_sizes)):
        prefix = os.path.join(path, f"train.{src}-{tgt}.{lang}")
        builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
        for n in sizes:
            builder.add_item(torch.full((int(n),), 5, dtype=torch.int32))
        builder.finalize(prefix + ".idx")
        with open(os.path.join(path, f"dict.{lang}.txt"), "w") as f:
            f.writelines(f"w{i} 1\n" for i in range(vocab - 4))
    return str(path)


@pytest.fixture(scope="module")
def en_fr_like(tmp_path_factory):
    """En-Fr's ratio at 1/1000 scale: ~38k updates an epoch at 100k updates -> 38 at 100. 1520
    pairs of 25 tokens a side at --max-tokens 1000 x update-freq 1: 40 pairs (1000 tokens) a
    batch, 38 batches an epoch."""
    return _data_bin(tmp_path_factory.mktemp("enfr"), [25] * 1520, [25] * 1520)


@pytest.mark.parametrize("gpus", [*range(1, 17), 24, 32, 64])
def test_the_chosen_batch_is_the_papers_at_any_gpu_count(gpus):
    max_tokens, update_freq, deviation = train_plan.batch_for(None, gpus)
    assert max_tokens <= 4096 and abs(max_tokens * gpus * update_freq - 32768) <= gpus * update_freq / 2
    assert abs(deviation) < 1e-3  # max_tokens rounded to a token: at most half a token per batch


@pytest.mark.parametrize("gpus, max_tokens, update_freq, tokens", [
    (1, 4096, 8, 32768), (3, 3641, 3, 32769), (5, 3277, 2, 32770), (6, 2731, 2, 32772), (16, 2048, 1, 32768)])
def test_the_chosen_batch_for_a_few_gpu_counts(gpus, max_tokens, update_freq, tokens):
    assert train_plan.batch_for(None, gpus)[:2] == (max_tokens, update_freq)
    assert max_tokens * gpus * update_freq == tokens


def test_a_given_max_tokens_keeps_its_deviation_which_the_plan_states():
    # fairseq's 4096 a GPU on 3 GPUs: update-freq round(8/3) = 3 -> 36864 tokens, +12.5%
    assert train_plan.batch_for(4096, 3) == (4096, 3, 0.125)
    assert train_plan.batch_for(4096, 16)[2] == 1.0  # 2x: update-freq cannot go below 1


@pytest.mark.parametrize("gpus, update_freq", [(1, 8), (2, 4), (3, 3), (4, 2), (8, 1), (16, 1)])
def test_update_freq_keeps_about_25k_tokens_an_update_on_any_gpu_count(gpus, update_freq):
    assert train_plan.update_freq_for(4096, gpus) == update_freq
    tokens = 4096 * gpus * update_freq
    assert 24576 <= tokens <= 65536 and (gpus > 8 or abs(tokens - 32768) <= 4096)


def test_updates_per_epoch_shares_batches_over_gpus_then_groups_them():
    assert train_plan.updates_per_epoch(38, 1, 1) == 38
    assert train_plan.updates_per_epoch(38, 8, 1) == 5  # 38 batches over 8 GPUs: 5 each, the last padded
    assert train_plan.updates_per_epoch(38, 1, 8) == 5
    assert train_plan.updates_per_epoch(304_000, 1, 8) == 38_000  # En-Fr-size: 38k updates an epoch


def test_interval_checkpoints_skip_those_due_at_an_epoch_end():
    # fairseq names a checkpoint due exactly at an epoch's end checkpointE.pt, not checkpoint_E_U.pt
    assert train_plan.interval_checkpoints(100, 15, 38) == [15, 30, 45, 60, 75, 90]
    assert train_plan.interval_checkpoints(100, 19, 38) == [19, 57, 95]


def test_en_fr_like_corpus_plans_interval_checkpoints_and_refuses_epoch_size_intervals(en_fr_like, tmp_path, run):
    env = tmp_path / "plan.env"
    base = ["plan", "--data-bin", en_fr_like, "--stage", "train", "100", "-", "--max-tokens", "1000",
            "--update-freq", "1", "--gpus", "0", "--device", "cpu", "--precision=", "--average", "5"]
    proc = run(*base, "--save-interval-updates", "15", "--env-out", str(env))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "| training set: 1520 pairs, 76000 tokens (source + target, with </s>), 38 batches of --max-tokens 1000" in out
    assert "| updates per epoch: 38" in out
    assert "| stage train: ends at its update 100 (2.63 epochs, --max-update)" in out
    assert "| averaged: updates 30, 45, 60, 75, 90 (the last 75 updates of training)" in out
    assert "| note: updates 91-100 come after the last interval checkpoint" in out
    values = dict(line.split("=", 1) for line in env.read_text().splitlines())
    assert values["UPDATE_FREQ"] == "1" and values["SAVE_INTERVAL_UPDATES"] == "15"
    assert values["UPDATES_PER_EPOCH"] == "38" and values["STAGE1_END"] == "100"
    assert values["TRAIN_DEVICE_FLAGS"] == "--cpu" and values["GEN_DEVICE_FLAGS"] == "--cpu"
    # an interval near an epoch (what averaging by epoch amounts to) leaves 2 checkpoints: refused
    proc = run(*base, "--save-interval-updates", "38")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "plan.py: error: stage train ends at update 100 and writes 0 checkpoints every 38 updates "
        "(2 more fall at an epoch's end): too few to average the last 5; lower SAVE_INTERVAL_UPDATES "
        "(at most 20) or AVERAGE, or train longer")


def test_en_fr_like_plan_on_8_gpus_uses_update_freq_1_and_counts_disk(en_fr_like, run):
    proc = run("plan", "--data-bin", en_fr_like, "--stage", "train", "40", "-", "--max-tokens", "4096",
               "--gpus", "8", "--device", "auto", "--precision=--bf16", "--save-interval-updates", "3",
               "--average", "5")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "| device: 8 GPU(s) (--bf16); decoding on 1 GPU (bf16)" in out
    assert "| tokens per update: 4096 x 8 GPU x update-freq 1 = 32768 padded tokens at most" in out
    # 160 pairs of 25 tokens a batch (163 fit, cut to a multiple of 8 as fairseq does): 10 batches, 2 per
    # GPU (the last GPUs get empty ones), 2 updates an epoch
    assert "10 batches of --max-tokens 4096" in out and "| updates per epoch: 2" in out
    assert "| averaged: updates 15, 21, 27, 33, 39 (the last 27 updates of training)" in out
    # 100 tokens (vocab) x 512 + 6 x 3,152,384 + 6 x 4,204,032 parameters = 44.19M, 12 bytes each;
    # 5 kept + last + best + average
    params = 100 * 512 + 6 * (4 * 512 * 512 + 4 * 512 + 2 * 512 * 2048 + 2048 + 512 + 4 * 512) \
        + 6 * (8 * 512 * 512 + 8 * 512 + 2 * 512 * 2048 + 2048 + 512 + 6 * 512)
    assert train_plan.parameters("base", 100) == params
    assert f"{params / 1e6:.1f}M parameters" in out
    assert f"| disk for checkpoints: about {train_plan.human_bytes(8 * 12 * params)}" in out


def test_stage_with_no_end_is_refused(en_fr_like, run):
    proc = run("plan", "--data-bin", en_fr_like, "--stage", "train", "-", "-", "--gpus", "1")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("plan.py: error: stage train has neither a maximum update nor a maximum "
                                   "epoch: it would never end")


@pytest.mark.parametrize("device, gpus, precision, train, gen", [
    ("auto", 1, "--fp16", "--fp16", "--fp16"),
    ("auto", 1, "--bf16", "--bf16", "--bf16"),
    ("auto", 2, "--fp16 --memory-efficient-fp16", "--fp16 --memory-efficient-fp16", "--fp16"),
    ("gpu", 1, "--memory-efficient-bf16", "--memory-efficient-bf16", "--bf16"),
    ("auto", 1, "--amp", "--amp", ""),  # autocast is a training option: decoding in fp32
    ("cpu", 0, "", "--cpu", "--cpu"),
    ("cpu", 4, "", "--cpu", "--cpu"),  # asked for the CPU although GPUs are visible
    ("cpu", 0, "--bf16", "--cpu --bf16", "--cpu --bf16"),  # compat.bf16_without_tpu
    ("cpu", 0, "--memory-efficient-bf16", "--cpu --memory-efficient-bf16", "--cpu --bf16"),
    ("cpu", 0, "--cpu --bf16", "--cpu --bf16", "--cpu --bf16"),  # --cpu said twice, passed once
    # fairseq's fp16 without a flat fp32 copy on a CUDA device trains on the CPU
    ("cpu", 0, "--memory-efficient-fp16", "--cpu --memory-efficient-fp16", "--cpu --fp16"),
    ("cpu", 0, "--fp16 --fp16-no-flatten-grads", "--cpu --fp16 --fp16-no-flatten-grads",
     "--cpu --fp16 --fp16-no-flatten-grads"),
])
def test_device_flags_of_training_and_decoding(device, gpus, precision, train, gen):
    values = train_plan.device_settings(device, gpus, precision)
    assert values["TRAIN_DEVICE_FLAGS"] == train and values["GEN_DEVICE_FLAGS"] == gen


@pytest.mark.parametrize("device, gpus, precision, desc", [
    ("cpu", 0, "", "CPU (DEVICE=cpu asked for it; fp32)"),
    ("cpu", 0, "--bf16", "CPU (DEVICE=cpu asked for it; --bf16); decoding on the CPU (bf16)"),
    ("cpu", 0, "--memory-efficient-bf16",
     "CPU (DEVICE=cpu asked for it; --memory-efficient-bf16); decoding on the CPU (bf16)"),
    ("cpu", 0, "--memory-efficient-fp16",
     "CPU (DEVICE=cpu asked for it; --memory-efficient-fp16); decoding on the CPU (fp16)"),
    ("auto", 2, "--bf16", "2 GPU(s) (--bf16); decoding on 1 GPU (bf16)"),
    ("auto", 1, "--amp", "1 GPU(s) (--amp); decoding on 1 GPU (fp32)"),
])
def test_device_line_says_how_training_and_decoding_run(device, gpus, precision, desc):
    # --bf16 decodes in bf16: the plugin's models cast themselves in prepare_for_inference_
    # (tests/test_bf16.py); fairseq-generate itself casts only for --fp16
    assert train_plan.device_settings(device, gpus, precision)["DEVICE_DESC"] == desc


@pytest.mark.parametrize("device, gpus, precision, message", [
    ("auto", 0, "--fp16", "no GPU visible (torch.cuda.device_count() is 0): a WMT-size stage would take weeks on "
                          "CPU; set DEVICE=cpu to run it there anyway"),
    ("cpu", 0, "--fp16", "DEVICE=cpu with --fp16: fairseq's --fp16 keeps its fp32 weights on a CUDA device; on the "
                         "CPU use --bf16, --memory-efficient-fp16 or --fp16 --fp16-no-flatten-grads"),
    ("cpu", 0, "--amp", "DEVICE=cpu with --amp: --amp autocasts on CUDA only (on the CPU torch turns it off and "
                        "fairseq-train runs fp32); use --bf16"),
    ("auto", 1, "--cpu", "DEVICE_FLAGS=--cpu asks for the CPU while 1 GPU(s) are visible: set DEVICE=cpu instead"),
    ("tpu", 1, "", "DEVICE must be auto, gpu or cpu, got 'tpu'"),
])
def test_device_refusals(device, gpus, precision, message):
    with pytest.raises(train_plan.PlanError) as e:
        train_plan.device_settings(device, gpus, precision)
    assert str(e.value) == message


def test_device_command_prints_the_device_and_the_flags(tmp_path, run):
    proc = run("device", "--gpus", "1", "--precision=--bf16", "--env-out", str(tmp_path / "d.env"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "| device: 1 GPU(s) (--bf16); decoding on 1 GPU (bf16)"
    assert "GEN_DEVICE_FLAGS=--bf16\n" in (tmp_path / "d.env").read_text()


def _checkpoint(path, updates, next_epoch):
    torch.save({"model": {}, "optimizer_history": [{"num_updates": updates}],
                "extra_state": {"train_iterator": {"epoch": next_epoch, "iterations_in_epoch": 0}}}, path)
    return str(path)


def test_check_finished_by_update_and_by_epoch(tmp_path, run):
    ckpt = _checkpoint(tmp_path / "c.pt", updates=100, next_epoch=4)
    assert train_plan.check_finished(ckpt, 100, None) == f"{ckpt}: finished (update 100 of 100)"
    assert train_plan.check_finished(ckpt, 500, 3) == f"{ckpt}: finished (epoch 3 of 3, update 100)"
    proc = run("check-finished", "--checkpoint", ckpt, "--max-update", "300000", "--max-epoch", "30")
    assert proc.returncode == 3
    assert proc.stderr.strip() == (f"plan.py: error: {ckpt} stopped at update 100 (epoch 3 finished) before "
                                   "update 300000 or epoch 30: training is unfinished")
    proc = run("check-finished", "--checkpoint", str(tmp_path / "none.pt"), "--max-update", "1")
    assert proc.returncode == 3 and f"no checkpoint {tmp_path}/none.pt: has training run?" in proc.stderr


@pytest.mark.parametrize("max_tokens", [300, 1000, 4096, 2000])
def test_batches_per_epoch_are_the_ones_fairseq_makes(tmp_path, max_tokens):
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    from fairseq_posenc import compat

    compat.keep_last_batch()  # what fairseq-train --user-dir fairseq_posenc runs with

    rng = np.random.default_rng(0)
    src, tgt = rng.integers(2, 120, 700), rng.integers(2, 120, 700)
    data_bin = _data_bin(tmp_path, src, tgt)
    task = TranslationTask.setup_task(TranslationConfig(data=data_bin, source_lang="en", target_lang="fr",
                                                        dataset_impl="mmap"))
    task.load_dataset("train")
    iterator = task.get_batch_iterator(task.dataset("train"), max_tokens=max_tokens, max_positions=(1024, 1024),
                                       required_batch_size_multiple=8, seed=1, epoch=1)
    assert train_plan.batches_per_epoch(*train_plan.dataset_sizes(data_bin, "en", "fr"), max_tokens) == len(iterator)


# ------------------------------------------------------------------------------------------------
# the world of several processes and nodes: the plan's count against fairseq's own inference
def test_a_chosen_batch_states_its_exact_deviation():
    assert train_plan.batch_for(None, 3)[2] == pytest.approx(1 / 32768)  # 3641 x 3 x 3 = 32769
    assert train_plan.batch_for(None, 6)[2] == pytest.approx(4 / 32768)  # 2731 x 6 x 2 = 32772
    assert train_plan.batch_for(None, 64) == (512, 1, 0.0)


def test_a_world_too_large_for_the_longest_pair_overshoots_and_the_plan_says_so(tmp_path, run, monkeypatch):
    # 64 GPUs want 512 tokens a batch; a pair of 600 tokens needs 600: 38400 tokens an update, +17.2%
    assert train_plan.batch_for(None, 64, longest=600) == (600, 1, pytest.approx(600 * 64 / 32768 - 1))
    data_bin = _data_bin(tmp_path / "long", [20] * 300 + [600], [20] * 301)
    plan = ["plan", "--data-bin", data_bin, "--stage", "train", "100", "-", "--gpus", "64", "--save-interval-updates",
            "10", "--average", "1"]
    proc = run(*plan)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "plan.py: error: 38400 tokens per update is +17.2% from the papers' 32768 at 64 GPU(s) with "
        "MAX_TOKENS=600, the longest training pair: train on fewer, or ALLOW_BATCH=1 to train with it (the lr and "
        "the update count stay the papers')")
    proc = run(*plan, "--allow-batch")  # (then refused for its checkpoints: every update ends an epoch here)
    assert "| tokens per update: 600 x 64 GPU x update-freq 1 = 38400 padded tokens at most (+17.2% from" in proc.stdout
    assert "| note: tokens per update +17.2% from the papers' (ALLOW_BATCH=1)" in proc.stdout


SLURM_TASKS = {"SLURM_JOB_ID": "91", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_NNODES": "2"}


@pytest.mark.parametrize("env, device, asked, visible, expected", [
    # one node: every GPU torch sees, or NUM_GPUS of them; the CPU: one process
    ({}, "auto", None, 8, ("node", 1, 8, ["--distributed-world-size", "8"])),
    ({}, "auto", 4, 8, ("node", 1, 4, ["--distributed-world-size", "4"])),
    ({}, "cpu", None, 0, ("node", 1, 1, [])),
    # SLURM, a task a node: fairseq spawns a process per visible GPU on each node
    ({**SLURM_TASKS, "SLURM_NTASKS": "2", "SLURM_NODEID": "1", "SLURM_PROCID": "1"}, "auto", None, 8,
     ("slurm", 2, 8, ["--distributed-world-size", "16", "--distributed-port"])),
    ({**SLURM_TASKS, "SLURM_NTASKS": "2"}, "auto", 16, 8, ("slurm", 2, 8, ["--distributed-world-size", "16"])),
    # SLURM, a task per GPU or CPU process
    ({**SLURM_TASKS, "SLURM_NTASKS_PER_NODE": "8", "SLURM_PROCID": "9", "SLURM_NODEID": "1"}, "auto", None, 8,
     ("slurm", 2, 8, ["--distributed-world-size", "16", "--distributed-port"])),
    ({**SLURM_TASKS, "SLURM_NTASKS": "4", "SLURM_PROCID": "2", "SLURM_NODEID": "1"}, "cpu", None, 0,
     ("slurm", 2, 2, ["--distributed-world-size", "4", "--distributed-port"])),
    ({**SLURM_TASKS, "SLURM_NNODES": "1", "SLURM_NTASKS": "1"}, "cpu", None, 0, ("slurm", 1, 1, [])),
])
def test_the_world_of_each_launcher(env, device, asked, visible, expected):
    world = train_plan.find_world(env, device, asked, visible, scontrol=True)
    launcher, nodes, per_node, flags = expected
    assert (world.launcher, world.nodes, world.per_node) == (launcher, nodes, per_node)
    assert world.flags[:len(flags)] == flags
    assert world.first == (env.get("SLURM_PROCID", "0") == "0")
    if launcher == "slurm":
        assert world.launch_id == f"slurm-91.0.0"
        if nodes * per_node > 1:  # the same port on every node, from the job and step
            port = world.flags[world.flags.index("--distributed-port") + 1]
            assert port == train_plan.find_world({**env, "SLURM_PROCID": "5"}, device, asked, visible,
                                                 scontrol=True).flags[world.flags.index("--distributed-port") + 1]
    if device == "cpu" and nodes * per_node > 1:
        assert world.flags[-2:] == ["--distributed-backend", "gloo"]


def test_torchrun_on_several_nodes_wraps_fairseq_train_and_counts_every_node():
    world = train_plan.find_world({}, "auto", None, 8, nnodes=2, node_rank=1, master_addr="10.0.0.1",
                                  master_port="29400", launch_id="job-7")
    assert (world.size, world.first, world.launch_id) == (16, False, "job-7")
    assert world.command == ["torchrun", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "8",
                             "--master-addr", "10.0.0.1", "--master-port", "29400"]
    assert world.flags == ["--distributed-world-size", "16"]
    # NUM_GPUS is the whole run's: 8 on 2 nodes is 4 a node
    assert train_plan.find_world({}, "auto", 8, 8, nnodes=2, master_addr="a", launch_id="x").per_node == 4
    # on the CPU: NPROC_PER_NODE processes a node, gloo
    world = train_plan.find_world({}, "cpu", None, 0, nnodes=2, nproc_per_node=3, master_addr="a", launch_id="x")
    assert world.size == 6 and world.flags == ["--distributed-world-size", "6", "--distributed-backend", "gloo"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(env={}, device="auto", asked=16, visible=8),
     "NUM_GPUS=16 is 16 GPUs a node but torch sees 8 here: for several nodes set NNODES, NODE_RANK and MASTER_ADDR "
     "(torchrun) or start the recipe with srun"),
    (dict(env={}, device="auto", asked=None, visible=8, nnodes=2, launch_id="x"),
     "NNODES=2 needs MASTER_ADDR: the address of the node with NODE_RANK=0, the same on every node"),
    (dict(env={}, device="auto", asked=None, visible=8, nnodes=2, master_addr="a"),
     "NNODES=2 needs LAUNCH_ID: an id every node of this launch shares and no earlier launch used (the scheduler's "
     "job id, say), so that the nodes act on the same decision"),
    (dict(env={}, device="auto", asked=None, visible=8, nnodes=2, node_rank=2, master_addr="a", launch_id="x"),
     "NODE_RANK=2 is not one of the 2 nodes (0 to 1)"),
    (dict(env={}, device="auto", asked=12, visible=8, nnodes=8, master_addr="a", launch_id="x"),
     "NUM_GPUS=12 (the GPUs of all nodes) does not divide into 8 nodes"),
    # torchrun's variables in the recipe's own environment
    (dict(env={"MASTER_ADDR": "a", "MASTER_PORT": "1", "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0",
               "LOCAL_WORLD_SIZE": "2"}, device="auto", asked=None, visible=2),
     "WORLD_SIZE and RANK are set (is the recipe running under torchrun?): fairseq-train would take them for its "
     "own; run the recipe once per node with NNODES, NODE_RANK and MASTER_ADDR (it starts torchrun itself), or "
     "unset them"),
    # issue 23 item 3: under SLURM fairseq takes every GPU it sees, whatever NUM_GPUS says
    (dict(env={**SLURM_TASKS, "SLURM_NNODES": "1", "SLURM_NTASKS": "1"}, device="auto", asked=4, visible=8),
     "NUM_GPUS=4, but under SLURM fairseq-train uses every GPU it sees on each node: 1 node(s) x 8 = 8; ask SLURM "
     "for 4 GPUs a node, or set NUM_GPUS=auto"),
    (dict(env={**SLURM_TASKS, "SLURM_NTASKS": "2"}, device="cpu", asked=None, visible=0),
     "under SLURM with one task a node fairseq-train starts a process per GPU, and on the CPU there is none: start "
     "a task per process (srun --ntasks-per-node=P)"),
    (dict(env={**SLURM_TASKS, "SLURM_NTASKS_PER_NODE": "8"}, device="auto", asked=None, visible=1),
     "SLURM starts 8 tasks a node and fairseq puts task SLURM_LOCALID on that GPU, but torch sees 1: give each task "
     "the node's GPUs (--gpus-per-node, not --gpus-per-task)"),
    (dict(env={**SLURM_TASKS, "SLURM_NTASKS_PER_NODE": "4"}, device="auto", asked=16, visible=4),
     "NUM_GPUS=16, but SLURM starts 2 node(s) x 4 tasks = 8 processes, one per GPU: set NUM_GPUS=auto or change "
     "srun's task count"),
    (dict(env={**SLURM_TASKS, "SLURM_NTASKS": "3"}, device="auto", asked=None, visible=4),
     "SLURM_NTASKS=3 tasks do not divide into SLURM_NNODES=2 nodes: give srun --ntasks-per-node"),
])
def test_worlds_that_cannot_work_are_refused_in_one_line(kwargs, message):
    with pytest.raises(train_plan.PlanError) as e:
        train_plan.find_world(**kwargs, scontrol=True)
    assert str(e.value) == message


def test_without_scontrol_fairseq_ignores_slurm_and_so_does_the_plan():
    world = train_plan.find_world({**SLURM_TASKS, "SLURM_NTASKS": "2"}, "auto", None, 8, scontrol=False)
    assert (world.launcher, world.size) == ("node", 8)


@pytest.fixture
def fake_gpus(monkeypatch):
    """torch.cuda.device_count() as on a GPU node, for fairseq's inference of its world."""
    def set_count(count):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    return set_count


def _fairseq_infers(env, monkeypatch, world_size, port=-1):
    """(world size, rank, device id) that fairseq's own infer_init_method takes from ``env``."""
    from fairseq.dataclass.configs import FairseqConfig
    from fairseq.distributed import utils as distributed_utils
    from omegaconf import OmegaConf

    for key in list(os.environ):
        if key.startswith("SLURM_") or key in train_plan.TORCHRUN_ENV + ("LOCAL_RANK",):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = OmegaConf.structured(FairseqConfig).distributed_training
    cfg.distributed_world_size, cfg.distributed_port = world_size, port
    original = getattr(distributed_utils.infer_init_method, "__wrapped__", distributed_utils.infer_init_method)
    original(cfg)
    return cfg.distributed_world_size, cfg.distributed_rank, cfg.device_id


def test_torchruns_workers_get_the_world_the_plan_counted(fake_gpus, monkeypatch):
    """What torchrun sets for each worker of the plan's command, read by fairseq (its GPU path:
    torch faked to see 8 GPUs)."""
    fake_gpus(8)
    for node in (0, 1):
        world = train_plan.find_world({}, "auto", None, 8, nnodes=2, node_rank=node, master_addr="10.0.0.1",
                                      launch_id="x")
        for local in range(world.per_node):
            env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": str(world.size),
                   "RANK": str(node * world.per_node + local), "LOCAL_RANK": str(local),
                   "LOCAL_WORLD_SIZE": str(world.per_node), "GROUP_RANK": str(node)}
            assert _fairseq_infers(env, monkeypatch, world.size) == (16, node * 8 + local, local)


def test_slurm_with_a_task_a_node_gets_the_world_the_plan_counted(fake_gpus, monkeypatch, tmp_path):
    (tmp_path / "scontrol").write_text("#!/bin/sh\necho gpu01\necho gpu02\n")
    (tmp_path / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    fake_gpus(8)
    env = {**SLURM_TASKS, "SLURM_NTASKS": "2", "SLURM_NODEID": "1", "SLURM_PROCID": "1"}
    world = train_plan.find_world(env, "auto", None, 8)
    port = int(world.flags[world.flags.index("--distributed-port") + 1])
    assert _fairseq_infers(env, monkeypatch, world.size, port) == (16, 8, 0)  # node 1's first rank is 8
    # what the plan refuses (NUM_GPUS=4 on two 8-GPU nodes): fairseq would run 16, not 4
    assert _fairseq_infers(env, monkeypatch, 4, port)[0] == 16
    with pytest.raises(train_plan.PlanError, match="NUM_GPUS=4, but under SLURM fairseq-train uses every GPU"):
        train_plan.find_world(env, "auto", 4, 8)


def test_the_plan_under_slurm_writes_the_world_and_who_writes(en_fr_like, tmp_path, run, monkeypatch):
    (tmp_path / "scontrol").write_text("#!/bin/sh\necho n1\necho n2\n")
    (tmp_path / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    for key, value in {**SLURM_TASKS, "SLURM_NTASKS_PER_NODE": "2", "SLURM_NODEID": "1", "SLURM_PROCID": "3",
                       "SLURM_LOCALID": "1"}.items():
        monkeypatch.setenv(key, value)
    env = tmp_path / "plan.env"
    proc = run("plan", "--data-bin", en_fr_like, "--stage", "train", "100", "-", "--device", "cpu", "--precision=",
               "--save-interval-updates", "3", "--average", "2", "--master-port", "29512", "--env-out", str(env))
    assert proc.returncode == 0, proc.stderr
    assert ("| world: 4 processes = 2 node(s) x 2 (SLURM, a task per process); this is node 1, which leaves the "
            "shared files to the first process (FIRST_NODE=0)") in proc.stdout
    assert "| tokens per update: 4096 x 4 CPU processes x update-freq 2 = 32768 padded tokens" in proc.stdout
    values = dict(line.split("=", 1) for line in env.read_text().splitlines())
    assert values["WORLD_SIZE"] == "4" and values["FIRST_NODE"] == "0" and values["LAUNCH_ID"] == "slurm-91.0.0"
    assert values["TRAIN_DEVICE_FLAGS"] == ("'--cpu --distributed-world-size 4 --distributed-port 29512 "
                                            "--distributed-backend gloo'")
    assert values["TRAIN_LAUNCHER"] == "''" and values["MAX_TOKENS"] == "4096"


# ------------------------------------------------------------------------------------------------
# the budget of a multi-stage plan, and disk
def test_a_two_stage_plan_states_its_budget_against_the_baseline_and_keeps_3_checkpoints_of_stage_1(en_fr_like, run):
    """FLOATER on En-Fr (1/1000 scale: 38 updates an epoch, the baseline's 100k updates -> 100):
    30 vanilla epochs and 1 FLOATER epoch are 1178 updates, 11.78x the baseline's (at ~32k tokens
    an update, 30 En-Fr epochs are ~1.2M updates, 12x the baseline's 100k)."""
    proc = run("plan", "--data-bin", en_fr_like, "--stage", "vanilla", "-", "30", "--stage", "floater", "-", "1",
               "--baseline-updates", "100", "--max-tokens", "1000", "--update-freq", "1", "--device", "cpu",
               "--precision=", "--save-interval-updates", "5", "--average", "5")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "| stage vanilla: ends at its update 1140 (30.00 epochs, --max-epoch)" in out
    assert "| stage floater: ends at its update 38 (1.00 epochs, --max-epoch)" in out
    assert ("| budget: 1178 updates in all (31.00 epochs); the baseline trains 100 (2.63 epochs): 11.78x its "
            "updates") in out
    each = train_plan.parameters("base", 100) * 12
    assert f"| disk for checkpoints: about {train_plan.human_bytes((3 + 5 + 3) * each)}" in out


def test_floaters_control_stage_is_counted_in_the_budget_and_the_disk(en_fr_like, run):
    """VANILLA_CONTINUED=1: the vanilla model trained on with FLOATER's stage-2 schedule costs as
    much as that stage (38 more updates at this scale) and keeps as many checkpoints."""
    proc = run("plan", "--data-bin", en_fr_like, "--stage", "vanilla", "-", "30", "--stage", "floater", "-", "1",
               "--control-stage", "vanilla_continued", "--baseline-updates", "100", "--max-tokens", "1000",
               "--update-freq", "1", "--device", "cpu", "--precision=", "--save-interval-updates", "5", "--average", "5")
    assert proc.returncode == 0, proc.stderr
    assert ("| control stage vanilla_continued: stage floater's schedule from the same start, without it: 38 more "
            "updates (1.00 epochs), the last 5 averaged") in proc.stdout
    assert "| budget: 1216 updates in all (32.00 epochs); the baseline trains 100 (2.63 epochs): 12.16x" in proc.stdout
    each = train_plan.parameters("base", 100) * 12
    assert f"| disk for checkpoints: about {train_plan.human_bytes((3 + 5 + 3 + 5 + 3) * each)}" in proc.stdout


def test_the_plan_refuses_checkpoints_that_do_not_fit_the_disk(en_fr_like, tmp_path, run, monkeypatch):
    plan = ["plan", "--data-bin", en_fr_like, "--stage", "train", "100", "-", "--max-tokens", "1000", "--update-freq",
            "1", "--device", "cpu", "--precision=", "--save-interval-updates", "15", "--average", "5",
            "--out", str(tmp_path / "runs" / "x")]
    need = 8 * train_plan.parameters("base", 100) * 12  # 5 kept + last + best + average: 4.24 GB
    monkeypatch.setattr(train_plan, "disk_free", lambda path: 3 * 10**9)
    proc = run(*plan)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"plan.py: error: the checkpoints need about {train_plan.human_bytes(need)}; 3.0 GB free on the "
        f"filesystem of {tmp_path}/runs/x: free some, use another directory, or set ALLOW_LOW_DISK=1 to go on")
    assert ": short (a run stops here unless ALLOW_LOW_DISK=1)" in run(*plan, "--allow-low-disk").stdout
    # checkpoints already there (a run resumed) are replaced, not added
    os.makedirs(tmp_path / "runs" / "x")
    with open(tmp_path / "runs" / "x" / "checkpoint_last.pt", "wb") as f:
        f.truncate(2 * 10**9)
    proc = run(*plan)
    assert proc.returncode == 0, proc.stderr
    assert f"(2.0 GB already in {tmp_path}/runs/x); 3.0 GB free" in proc.stdout


def test_preparing_a_corpus_is_refused_when_its_estimate_does_not_fit(tmp_path, run, monkeypatch):
    archive = tmp_path / "a.tgz"
    with open(archive, "wb") as f:
        f.truncate(10**9)
    monkeypatch.setattr(train_plan, "disk_free", lambda path: 5 * 10**9)
    # 1 GB of En-De archives: ~0.8 GB of text, 9.2x that prepared
    with pytest.raises(train_plan.PlanError) as e:
        train_plan.prepare_space(str(tmp_path / "data"), "wmt14_en_de", [str(archive)])
    assert str(e.value) == (
        "the prepared corpus (an estimate: 9.2x the text, itself ~0.8x the 1.0 GB of archives) needs about 7.4 GB; "
        f"5.0 GB free on the filesystem of {tmp_path}/data: free some, use another directory, or set "
        "ALLOW_LOW_DISK=1 to go on")
    assert train_plan.prepare_space(str(tmp_path / "data"), "wmt14_en_de", [str(archive)], allow=True).endswith(
        ": short (a run stops here unless ALLOW_LOW_DISK=1)")
    monkeypatch.setattr(train_plan, "disk_free", lambda path: 10 * 10**9)
    raw = tmp_path / "data" / "raw"
    raw.mkdir(parents=True)
    with open(raw / "train.en", "wb") as f:
        f.truncate(2 * 10**9)
    proc = run("prepare-space", "--work", str(tmp_path / "data"), "--raw-text", str(raw))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"plan.py: error: the prepared corpus (9.2x the 2.0 GB of extracted text) needs about 18.4 GB (2.0 GB "
        f"already in {tmp_path}/data); 10.0 GB free on the filesystem of {tmp_path}/data: free some, use another "
        "directory, or set ALLOW_LOW_DISK=1 to go on")


def test_prepare_checks_the_space_and_keep_intermediates_0_removes_what_no_recipe_reads(tmp_path):
    """prepare.sh states the space its corpus needs before extracting (from the archives) and
    after (from the text); KEEP_INTERMEDIATES=0 keeps what train.sh, evaluate.sh and the
    extrapolation recipe read, and a re-run with other settings redoes everything from the archives."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_recipes import run, write_archives

    write_archives("wmt14_en_de", str(tmp_path / "raw"), "en", "de", train_pairs=90)
    args = ["--raw-dir", str(tmp_path / "raw"), "--out", str(tmp_path / "data"), "--valid", "newstest2013"]
    env = {"BPE_SIZE": "40", "WORKERS": "1", "VERIFY_CHECKSUMS": "0", "KEEP_INTERMEDIATES": "0"}
    proc = run("wmt14_en_de/prepare.sh", args, env)
    assert proc.returncode == 0, proc.stderr
    assert "| disk: the prepared corpus (an estimate: 9.2x the text, itself ~0.8x the " in proc.stdout
    assert "| disk: the prepared corpus (9.2x the " in proc.stdout and " of extracted text) needs about " in proc.stdout
    assert "== KEEP_INTERMEDIATES=0: removed raw/, tok/, split/ and bpe/'s segmented copies" in proc.stdout
    data = tmp_path / "data"
    kept = {f for f in os.listdir(data) if not f.startswith(".")}
    assert kept == {"bpe", "corpus.env", "data-bin", "intermediates.removed", "preprocess.log"} | {
        f"{name}.{lang}" for name in ("train", "train.tok", "valid", "test", "test.raw") for lang in ("en", "de")}
    assert sorted(os.listdir(data / "bpe")) == ["code", "vocab.de", "vocab.en"]
    again = run("wmt14_en_de/prepare.sh", args, env)
    assert again.returncode == 0 and again.stdout.count("done before, skipping") == 7
    assert "| disk:" not in again.stdout and "removed raw/" not in again.stdout
    other = run("wmt14_en_de/prepare.sh", args, {**env, "BPE_SIZE": "30"})
    assert other.returncode == 0, other.stderr
    assert ("== the intermediate files were removed (valid=newstest2013 bpe=subword-nmt size=40): redoing every step "
            "from the archives") in other.stdout and "done before" not in other.stdout
    assert "BPE_SIZE=30" in (data / "corpus.env").read_text()
    assert (data / "intermediates.removed").read_text() == "valid=newstest2013 bpe=subword-nmt size=30\n"


# ------------------------------------------------------------------------------------------------
# IWSLT'14 De-En: fairseq's example trains at 4096 tokens an update on one GPU, not WMT's 32768
@pytest.fixture(scope="module")
def iwslt_like(tmp_path_factory):
    """1/10 of IWSLT'14's 160k pairs, 20 German and 21 English subwords a pair (+ </s>), with a
    dictionary per language (8000 and 6000 entries), as recipes/iwslt14_de_en prepares them."""
    path = _data_bin(tmp_path_factory.mktemp("iwslt"), [21] * 16000, [22] * 16000, src="de", tgt="en")
    for lang, size in (("de", 8000), ("en", 6000)):
        with open(os.path.join(path, f"dict.{lang}.txt"), "w") as f:
            f.writelines(f"{lang}{i} 1\n" for i in range(size - 4))
    return path


def test_the_iwslt_plan_keeps_fairseqs_4096_tokens_and_prints_the_time_on_one_gpu(iwslt_like, run):
    """4096 tokens x 1 GPU x update-freq 1 (the WMT target would make it 8x that); 22-token
    samples: 186 fit 4096 tokens, cut to 184 (a multiple of 8), so 16000 pairs are 87 batches an
    epoch; 50000 updates at 16000 x 22 / 87 = 4046 target tokens an update and 25000 a second:
    8092 s = 2.2 h. Two embeddings (8000 + 6000 rows), not one shared."""
    proc = run("plan", "--data-bin", iwslt_like, "--arch", "iwslt", "--stage", "train", "50000", "-",
               "--average", "10", "--gpus", "1", "--precision=", "--batch-target", "4096",
               "--batch-source", "fairseq's IWSLT example's", "--tokens-per-second", "25000")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert ("| tokens per update: 4096 x 1 GPU x update-freq 1 = 4096 padded tokens at most (+0.0% from fairseq's "
            "IWSLT example's 4096)") in out
    assert "| updates per epoch: 87" in out
    assert "| checkpoints: every 1000 updates -> 50 interval checkpoints in stage train" in out
    assert "| averaged: updates 41000, 42000, 43000, 44000, 45000, 46000, 47000, 48000, 49000, 50000 (" in out
    assert ("| expected time on one GPU: 50000 updates x ~4046 target tokens an update (this corpus) / 25000 target "
            "tokens a second = 2.2 h") in out
    params = train_plan.parameters("iwslt", 8000 + 6000)
    assert params == 14000 * 512 + 6 * (4 * 512 * 512 + 4 * 512 + 2 * 512 * 1024 + 1024 + 512 + 4 * 512) \
        + 6 * (2 * (4 * 512 * 512 + 4 * 512) + 2 * 512 * 1024 + 1024 + 512 + 6 * 512)
    assert f"| disk for checkpoints: about {train_plan.human_bytes(13 * params * 12)}" in out
    assert f"| memory: {train_plan.human_bytes(params * 16)} of GPU memory" in out
    # two GPUs share the same 4096 tokens
    proc = run("plan", "--data-bin", iwslt_like, "--arch", "iwslt", "--stage", "train", "50000", "-",
               "--average", "10", "--gpus", "2", "--precision=", "--batch-target", "4096")
    assert "| tokens per update: 2048 x 2 GPU x update-freq 1 = 4096 padded tokens" in proc.stdout


# ------------------------------------------------------------------------------------------------
# many GPUs: a small batch on each is warned about; LARGE_BATCH=1, fairseq's scaling_nmt batch
@pytest.fixture(scope="module")
def wmt_like(tmp_path_factory):
    """40,000 pairs with the length distribution of tests/test_papers_doc.py's WMT14 En-De corpus
    (lognormal, ~29 subwords a side, 1-250), a corpus.env beside the data-bin, as prepare.sh writes."""
    from test_papers_doc import _write_split

    root = tmp_path_factory.mktemp("wmt")
    rng = np.random.default_rng(0)
    src = np.clip(rng.lognormal(3.2, 0.55, 40000).astype(np.int32), 1, 250)
    tgt = np.clip((src * rng.uniform(0.8, 1.25, 40000)).astype(np.int32), 1, 250)
    data_bin = root / "data-bin"
    data_bin.mkdir()
    for split, n in (("train", 40000), ("valid", 300), ("test", 300)):
        _write_split(str(data_bin / f"{split}.en-de.en"), src[:n] + 1)
        _write_split(str(data_bin / f"{split}.en-de.de"), tgt[:n] + 1)
    for lang in ("en", "de"):
        (data_bin / f"dict.{lang}.txt").write_text("".join(f"w{i} {1000 - i}\n" for i in range(996)))
    (root / "corpus.env").write_text("RECIPE=wmt14_en_de\nSRC=en\nTGT=de\nBPE=subword-nmt\nBPE_SIZE=40000\n"
                                     "VALID_NAME=split\nTEST_NAME=newstest\n")
    return root


def test_a_small_batch_on_each_gpu_is_warned_with_what_an_update_then_holds(wmt_like, run):
    """32768 tokens an update over 64 GPUs are 512 a GPU: every step all-reduces every gradient for
    a GPU's few sentences, and whole sentences (a multiple of 8 a batch) fill 512 tokens less than
    4096, so an update holds fewer padded tokens and an epoch takes more updates (here 49, not 42;
    on the 4.5M pairs of tests/test_papers_doc.py's WMT14 En-De corpus 5413, not 4396: -18.9%).
    16 GPUs (2048 each) are not warned about, 24 (1365 each) are."""
    data_bin = str(wmt_like / "data-bin")
    plan = ["plan", "--data-bin", data_bin, "--stage", "train", "100000", "-", "--allow-low-disk"]
    out = run(*plan, "--gpus", "8").stdout
    assert "| updates per epoch: 42" in out
    assert ("| padded tokens per update: 30662 on average (-6.4% from the 32768 cap: a batch holds whole sentences, "
            "a multiple of 8 of them)") in out
    assert "warning" not in out
    out = run(*plan, "--gpus", "16").stdout
    assert "| tokens per update: 2048 x 16 GPU x update-freq 1 = 32768" in out and "warning" not in out
    out = run(*plan, "--gpus", "24").stdout
    assert "| warning: 1365 tokens a batch on each of 24 GPUs, below ~2048" in out
    proc = run(*plan, "--gpus", "64")
    assert proc.returncode == 0, proc.stderr  # a warning, not a refusal
    out = proc.stdout
    assert "| tokens per update: 512 x 64 GPU x update-freq 1 = 32768 padded tokens at most" in out
    assert "| updates per epoch: 49" in out
    assert "| padded tokens per update: 25253 on average (-22.9% from the 32768 cap" in out
    assert ("| warning: 512 tokens a batch on each of 64 GPUs, below ~2048: a step computes little against the "
            "all-reduce of every gradient, which does not shrink with the batch (expect it communication-bound), and "
            "an update holds 25253 padded tokens on average, -17.6% from 30662 with 4096-token batches") in out
    assert ("|   train on 16 GPUs or fewer for the same update with 2048 tokens or more a GPU, or with a larger "
            "update: LARGE_BATCH=1") in out
    # the batch of LARGE_BATCH=1 (16x) on the same 64 GPUs: 4096 tokens a GPU, two batches an update
    out = run(*plan[:5], "6250", "-", "--allow-low-disk", "--gpus", "64", "--batch-target", "524288",
              "--save-interval-updates", "125").stdout
    assert "| tokens per update: 4096 x 64 GPU x update-freq 2 = 524288 padded tokens at most (+0.0%" in out
    assert "warning" not in out
    # no warning on the CPU (no all-reduce over GPUs to weigh it against)
    out = run(*plan, "--device", "cpu", "--precision=", "--max-tokens", "512", "--update-freq", "64",
              "--allow-batch").stdout
    assert "| tokens per update: 512 x 1 CPU process x update-freq 64" in out and "warning" not in out


def _dry_run(wmt_like, tmp_path, **env):
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.dirname(SCRIPT)))
    env = {**os.environ, "DATA": str(wmt_like), "OUT": str(tmp_path / "out"), "OMP_NUM_THREADS": "1",
           "ENC": "sinusoidal", **env}
    return subprocess.run(["bash", "recipes/wmt14_en_de/train.sh", "--dry-run"], cwd=repo, env=env,
                          capture_output=True, text=True)


def _would_run(stdout):
    import shlex

    line = next(l for l in stdout.splitlines() if l.startswith("== --dry-run: would run "))
    return shlex.split(line[len("== --dry-run: would run "):])[1:]  # without fairseq-train itself


def test_large_batch_mode_is_fairseqs_scaling_nmt_batch_and_lr_and_reaches_the_stages_configuration(wmt_like,
                                                                                                   tmp_path):
    """LARGE_BATCH=1: fairseq's examples/scaling_nmt README trains big batches with --update-freq
    16 on its 8 GPUs (16x the batch) and lr 0.001. The recipe's update counts are divided by 16,
    so that each stands for the same tokens: 100k base updates -> 6250, 300k big -> 18750, warmup
    4000 -> 250, checkpoints every 1250 -> 125 (base) and 600 -> 50 (big). All are fairseq-train
    flags, so the stage's resolved configuration holds them and a run into the same OUT without
    the mode is another run (fairseq_posenc/recipe/train_config.differences)."""
    from fairseq_posenc.recipe import train_config

    default = _dry_run(wmt_like, tmp_path, ARCH="base", NUM_GPUS="64")
    large = _dry_run(wmt_like, tmp_path, ARCH="base", NUM_GPUS="64", LARGE_BATCH="1")
    assert default.returncode == 0 and large.returncode == 0, default.stderr + large.stderr
    assert "| warning: 512 tokens a batch on each of 64 GPUs" in default.stdout
    assert ("| tokens per update: 4096 x 64 GPU x update-freq 2 = 524288 padded tokens at most (+0.0% from "
            "LARGE_BATCH=1's 524288)") in large.stdout
    assert "warning" not in large.stdout
    assert "| stage train: ends at its update 6250" in large.stdout
    assert "| checkpoints: every 125 updates -> 34 interval checkpoints in stage train" in large.stdout
    args = _would_run(large.stdout)
    for flag, value in (("--lr", "1e-3"), ("--max-update", "6250"), ("--warmup-updates", "250"),
                        ("--save-interval-updates", "125"), ("--max-tokens", "4096"), ("--update-freq", "2"),
                        ("--distributed-world-size", "64")):
        assert args[args.index(flag) + 1] == value, flag
    old, new = train_config.resolve(_would_run(default.stdout)), train_config.resolve(args)
    assert new["optimization.lr"] == [0.001] and new["lr_scheduler.warmup_updates"] == 250
    assert train_config.tokens_per_update(old) == 32768 and train_config.tokens_per_update(new) == 524288
    changed = train_config.differences(old, new)
    assert "lr: [0.0007] -> [0.001] (lr_scheduler, model, optimization, optimizer)" in changed
    assert "tokens per update (max_tokens x update_freq x world size): 32768 -> 524288" in changed
    assert any(line.startswith("warmup_updates: 4000 -> 250") for line in changed)
    # big on one node of 8 GPUs: fairseq's own layout, update-freq 16 (of 4096 tokens, not its 3584)
    big = _dry_run(wmt_like, tmp_path, ARCH="big", NUM_GPUS="8", LARGE_BATCH="1")
    assert big.returncode == 0, big.stderr
    assert "| tokens per update: 4096 x 8 GPU x update-freq 16 = 524288" in big.stdout
    args = _would_run(big.stdout)
    for flag, value in (("--lr", "1e-3"), ("--max-update", "18750"), ("--warmup-updates", "250"),
                        ("--save-interval-updates", "50"), ("--update-freq", "16")):
        assert args[args.index(flag) + 1] == value, flag
    # a setting given wins; another value of the mode is refused in one line
    mine = _dry_run(wmt_like, tmp_path, ARCH="base", NUM_GPUS="64", LARGE_BATCH="1", LR="2e-3", WARMUP="4000")
    args = _would_run(mine.stdout)
    assert args[args.index("--lr") + 1] == "2e-3" and args[args.index("--warmup-updates") + 1] == "4000"
    refused = _dry_run(wmt_like, tmp_path, LARGE_BATCH="2")
    assert refused.returncode == 2 and refused.stderr.strip().endswith("LARGE_BATCH must be 0 or 1, got '2'")


def test_totals_count_a_stage_shared_by_several_models_once(tmp_path, run):
    """FLOATER's and RNN's variants (Table 2's input/all rows, Table 6's RNN rows) start from one
    vanilla stage in one directory: the dry run's totals count its updates and checkpoints once."""
    plans = tmp_path / "plans"
    shared = str(tmp_path / "shared" / "vanilla-base-abc")
    plans.write_text(f"{tmp_path}/sinusoidal 400 1000\n"
                     f"{tmp_path}/floater 700 3000 {shared} 600 900\n"
                     f"{tmp_path}/rnn 700 3000 {shared} 600 900\n"
                     f"{tmp_path}/other 650 2900 {tmp_path}/shared/vanilla-base-def 550 800\n")
    proc = run("totals", "--plans", str(plans), "--out", str(tmp_path), "--allow-low-disk")
    assert proc.returncode == 0, proc.stderr
    # 400 + 700 + (700 - 600) + 650; 1000 + 3000 + (3000 - 900) + 2900 bytes
    assert (f"| total for 4 model(s): 1850 updates, about {train_plan.human_bytes(9000)} of checkpoints; "
            "vanilla-base-abc (600 updates) shared by 2 models, counted once\n") in proc.stdout
