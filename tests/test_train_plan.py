"""scripts/train_plan.py: the batch per update whatever the GPU count, updates per epoch from the
binarized corpus, which interval checkpoints get averaged (and refusing when too few), the
device flags of training and decoding, and whether a run reached its target."""
import os
import sys

import numpy as np
import pytest
import torch

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "train_plan.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import train_plan  # noqa: E402


class _Proc:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run(capsys):
    """train_plan.py's main in this process (a fairseq import per call would cost seconds)."""
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
        "train_plan.py: error: stage train ends at update 100 and writes 0 checkpoints every 38 updates "
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
    assert proc.stderr.strip() == ("train_plan.py: error: stage train has neither a maximum update nor a maximum "
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
])
def test_device_flags_of_training_and_decoding(device, gpus, precision, train, gen):
    values = train_plan.device_settings(device, gpus, precision)
    assert values["TRAIN_DEVICE_FLAGS"] == train and values["GEN_DEVICE_FLAGS"] == gen


@pytest.mark.parametrize("device, gpus, precision, message", [
    ("auto", 0, "--fp16", "no GPU visible (torch.cuda.device_count() is 0): a WMT-size stage would take weeks on "
                          "CPU; set DEVICE=cpu to run it there anyway"),
    ("cpu", 0, "--fp16", "DEVICE=cpu with --fp16: fairseq-train runs fp16 and amp on a GPU only (--bf16 runs on the CPU)"),
    ("cpu", 0, "--amp", "DEVICE=cpu with --amp: fairseq-train runs fp16 and amp on a GPU only (--bf16 runs on the CPU)"),
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
    assert proc.stderr.strip() == (f"train_plan.py: error: {ckpt} stopped at update 100 (epoch 3 finished) before "
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
