"""recipes/posenc_workflow/plan.py: the batch per update whatever the GPU count, updates per epoch from the
binarized corpus, which interval checkpoints get averaged, and the plan the workflow prints of a
model from its resolved fairseq configuration."""
import os

import numpy as np
import pytest
import torch

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "recipes", "posenc_workflow", "plan.py")
from posenc_workflow import plan as train_plan  # noqa: E402


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


def test_a_chosen_batch_states_its_exact_deviation():
    assert train_plan.batch_for(None, 3)[2] == pytest.approx(1 / 32768)  # 3641 x 3 x 3 = 32769
    assert train_plan.batch_for(None, 6)[2] == pytest.approx(4 / 32768)  # 2731 x 6 x 2 = 32772
    assert train_plan.batch_for(None, 64) == (512, 1, 0.0)


BASE = {"model.encoder_embed_dim": 512, "model.encoder_ffn_embed_dim": 2048, "model.encoder_layers": 6,
        "model.decoder_embed_dim": 512, "model.decoder_ffn_embed_dim": 2048, "model.decoder_layers": 6}


def test_a_models_plan_counts_fairseqs_batches_and_the_checkpoints_it_averages(en_fr_like):
    # 8 GPUs at 4096 tokens each: 38 batches of 1000 tokens an epoch... here at --max-tokens 1000 on
    # one process, update-freq 2: 19 updates an epoch; 100 updates end mid-epoch 6
    config = {"dataset.max_tokens": 1000, "optimization.update_freq": [2], "optimization.max_update": 100,
              "distributed_training.distributed_world_size": 1, "checkpoint.save_interval_updates": 15, **BASE}
    plan = train_plan.model_plan(en_fr_like, config, 5, False, 25000.0)
    assert plan["lines"][0] == "tokens per update: 1000 x 1 process(es) x update-freq 2 = 2000 padded tokens at most"
    assert "updates per epoch: 19" in plan["lines"][1] and plan["lines"][2] == "ends at update 100 (5.26 epochs, --max-update)"
    # 15, 30, ... 90, none at an epoch's end (19 x k): the last 5
    assert plan["lines"][3] == "averaged: updates 30, 45, 60, 75, 90 (checkpoints every 15)"
    # Transformer base, 100 embedding rows: the embeddings and 6 + 6 layers
    assert train_plan.parameters(config, 100) == 100 * 512 + 6 * 3_152_384 + 6 * 4_204_032
    assert plan["updates"] == 100 and plan["disk"] == 8 * train_plan.parameters(config, 100) * 12
    # 100 updates x 1520 x 25 / 19 target tokens an update / 25000 a second
    assert plan["gpu_hours"] == pytest.approx(100 * (1520 * 25 / 19) / 25000 / 3600)
    config["optimization.max_update"], config["optimization.max_epoch"] = 0, 2
    plan = train_plan.model_plan(en_fr_like, config, 5, False, None)
    assert plan["updates"] == 38 and plan["lines"][3].startswith("WARNING: 2 interval checkpoints every 15 updates")
    # before the corpus is prepared: the budget alone
    plan = train_plan.model_plan(en_fr_like + "/missing", config, 5, False, None)
    assert plan["updates"] is None and "once " in plan["lines"][1]


def test_gpu_hours_are_the_same_on_16_gpus_and_the_time_is_a_sixteenth(en_fr_like):
    """tokens_per_second is a GPU's: the same 100 updates of 2000 tokens take the same GPU-hours on
    1 GPU (1000 x update-freq 2) and on 16 (125 tokens each), in a sixteenth of the time."""
    one = {"dataset.max_tokens": 1000, "optimization.update_freq": [2], "optimization.max_update": 100,
           "distributed_training.distributed_world_size": 1, "checkpoint.save_interval_updates": 15, **BASE}
    sixteen = {**one, "dataset.max_tokens": 125, "optimization.update_freq": [1],
               "distributed_training.distributed_world_size": 16}
    plans = [train_plan.model_plan(en_fr_like, config, 5, False, 25000.0) for config in (one, sixteen)]
    hours = 100 * (1520 * 25 / 19) / 25000 / 3600
    assert [p["gpu_hours"] for p in plans] == pytest.approx([hours, hours])
    # 8 GPU-seconds: under a minute, not 0.0 h
    assert plans[1]["lines"][-1].startswith("time: under a minute on 16 GPU(s) at 25,000 target tokens a second a "
                                            "GPU (under a GPU-minute; ")


def test_before_the_corpus_is_prepared_the_plan_is_estimated_from_its_published_size(en_fr_like):
    config = {"dataset.max_tokens": 1000, "optimization.update_freq": [2], "optimization.max_update": 0,
              "optimization.max_epoch": 2, "distributed_training.distributed_world_size": 1,
              "checkpoint.save_interval_updates": 15, **BASE}
    estimate = train_plan.CorpusEstimate(pairs=1520, target_tokens_per_pair=25, vocab=100, source="the test's")
    plan = train_plan.model_plan(en_fr_like + "/missing", config, 5, False, 25000.0, estimate=estimate)
    # 1520 x 25 target tokens an epoch, an update of 2000 padded tokens holds ~1526 of them: 25 an epoch
    assert plan["lines"][1].startswith("updates per epoch: ~25 (an estimate: 1,520 pairs (the test's) of ~25 target")
    assert plan["updates"] == 50 and plan["disk"] == 8 * train_plan.parameters(config, 100) * 12
    assert plan["gpu_hours"] == pytest.approx(50 * 2000 * 25000 / 32768 / 25000 / 3600)
    assert all(line.endswith("(estimated)") for line in plan["lines"][2:] if line.startswith(("ends", "disk", "time")))


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
        f"5.0 GB free on the filesystem of {tmp_path}/data: free some, use another directory, or pass "
        "--allow-low-disk to go on")
    assert train_plan.prepare_space(str(tmp_path / "data"), "wmt14_en_de", [str(archive)], allow=True).endswith(
        ": short (a run stops here without --allow-low-disk)")
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
        "directory, or pass --allow-low-disk to go on")


def test_a_training_set_prepared_again_is_estimated_or_said_to_be_the_previous_preparations(en_fr_like):
    config = {"dataset.max_tokens": 1000, "optimization.update_freq": [2], "optimization.max_update": 2000,
              "distributed_training.distributed_world_size": 1, "checkpoint.save_interval_updates": 500, **BASE}
    stale = "sources newer than data/x/data-bin"
    plan = train_plan.model_plan(en_fr_like, config, 3, False, 25000.0, stale=stale)
    assert plan["lines"][1] == ("training set: 1520 pairs, 38 batches of --max-tokens 1000; updates per epoch: 19 (the "
                                "previous preparation's; prepared again: sources newer than data/x/data-bin)")
    # 2000 updates of 2000 target tokens at 25,000 a second: 160 s, in minutes
    assert plan["lines"][-1] == ("time: 3 min on 1 GPU(s) at 25,000 target tokens a second a GPU (3 GPU-minutes; an "
                                 "assumption: set train.tokens_per_second from fairseq's wps)")
    estimate = train_plan.CorpusEstimate(pairs=1520, target_tokens_per_pair=25, vocab=100, source="the test's")
    plan = train_plan.model_plan(en_fr_like, config, 3, False, 25000.0, estimate=estimate, stale=stale)
    assert plan["lines"][1] == ("updates per epoch: ~25 (prepared again: sources newer than data/x/data-bin; an "
                                "estimate: 1,520 pairs (the test's) of ~25 target subwords, 100 embedding rows; exact "
                                "once the corpus is prepared)")


def test_the_cpus_auto_speed_is_the_measured_rate_over_six_flops_a_parameter_and_none_for_narrow_models():
    iwslt = {"model.encoder_embed_dim": 512, "model.encoder_ffn_embed_dim": 1024, "model.encoder_layers": 6,
             "model.decoder_embed_dim": 512, "model.decoder_ffn_embed_dim": 1024, "model.decoder_layers": 6}
    # the measurement: files.yaml's IWSLT model with its 104-row dictionary, 367 target tokens a second a thread
    assert train_plan.parameters(iwslt, 104) == 31_596_544
    assert train_plan.cpu_tokens_per_second(iwslt, 104) == pytest.approx(367)
    assert train_plan.cpu_tokens_per_second(iwslt, 104, threads=4) == pytest.approx(4 * 367)
    small = {key: value // 4 for key, value in iwslt.items()}
    assert train_plan.cpu_tokens_per_second(small, 104) is None
    plan = train_plan.model_plan("missing", {**small, "dataset.max_tokens": 1000, "optimization.max_update": 10},
                                 2, True, "auto", cpu=True,
                                 estimate=train_plan.CorpusEstimate(1000, 20, 104, "the test's"))
    assert plan["lines"][-1] == ("time on the CPU: unknown (auto assumes no speed for a model under 512 wide); set "
                                 "train.tokens_per_second from fairseq's wps (train.log)")


@pytest.mark.parametrize("hours, cores, threads, jobs, said", [
    ([2.0], 4, 1, None, "one training (--cores 4, 1 thread(s) each)"),
    ([2.0, 1.0], 1, 1, None, "one model after another (--cores 1, 1 thread(s) each)"),
    ([2.0, 1.0], 4, 4, None, "one model after another (--cores 4, 4 thread(s) each)"),
    ([2.0, 1.0, 1.0], 4, 2, None, "2 at a time (--cores 4, 2 thread(s) each): about 2.0 h from the first start"),
    ([0.5, 0.5, 0.5], 16, 1, None, "3 at a time (--cores 16, 1 thread(s) each): about 30 min from the first start"),
    # --jobs (a profile or executor, or -j here) limits the jobs, not --cores
    ([2.0, 1.0, 1.0], 1, 1, 8, "3 at a time (--jobs 8, 1 thread(s) each): about 2.0 h from the first start"),
])
def test_the_cpu_trainings_run_as_many_at_once_as_cores_hold_jobs_of_their_threads(hours, cores, threads, jobs, said):
    assert train_plan.cpu_schedule(hours, threads, cores, jobs) == said
