"""scripts/benchmark.py measures what it says: fairseq's own batches, the same decoding work for
every model, models taking turns in a shuffled order, ratios per round, and a profile window of
exactly one decoding step. Nothing here is timed."""
import importlib.util
import os

import pytest
import torch

from helpers.toy import TINY

pytestmark = pytest.mark.slow  # scripts/benchmark.py's fairseq task, built once: about 35 s

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts", "benchmark.py")


@pytest.fixture(scope="module")
def benchmark():
    spec = importlib.util.spec_from_file_location("benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def task(benchmark, tmp_path_factory):
    data_bin = benchmark.toy_data_bin(str(tmp_path_factory.mktemp("bench")), vocab=40, lengths=(2, 30),
                                      sentences=600)
    return benchmark.translation_task(data_bin)


def test_training_batches_are_fairseqs_left_padded_and_within_max_tokens(benchmark, task):
    pad = task.source_dictionary.pad()
    batches = benchmark.fairseq_batches(task, "train", 20, max_tokens=256)
    widths = {b["net_input"]["src_tokens"].size(1) for b in batches}
    assert len(widths) > 5  # an epoch's batches in a shuffled order: many lengths
    for b in batches:
        src, lengths = b["net_input"]["src_tokens"], b["net_input"]["src_lengths"]
        # batch_by_size's limit: sentences x the longest sentence, source or target
        assert src.size(0) * max(src.size(1), b["target"].size(1)) <= 256
        for row, n in zip(src, lengths):  # padding on the left, as fairseq's translation task
            assert row[: src.size(1) - n].eq(pad).all() and row[src.size(1) - n:].ne(pad).all()
            assert row[-1] == task.source_dictionary.eos()
        # the decoder's input is the target shifted right, as the dataset's collater builds it
        assert b["net_input"]["prev_output_tokens"][:, 0].eq(task.target_dictionary.eos()).all()
    padded = benchmark.fairseq_batches(task, "train", 5, max_tokens=256, only_padded=True)
    assert all(b["net_input"]["src_tokens"][:, 0].eq(pad).any() for b in padded)
    assert not all(b["net_input"]["src_tokens"][:, 0].eq(pad).any() for b in batches)


def test_decoding_batches_spread_over_the_lengths_in_fairseq_generates_order(benchmark, task):
    batches = benchmark.fairseq_batches(task, "test", 4, max_sentences=8, shuffle=False)
    widths = [b["net_input"]["src_tokens"].size(1) for b in batches]
    assert len(batches) == 4 and widths == sorted(widths) and widths[-1] - widths[0] >= 10
    assert all(b["net_input"]["src_tokens"].size(0) <= 8 for b in batches)


def test_every_model_decodes_the_same_steps(benchmark, task):
    batches = benchmark.fairseq_batches(task, "test", 2, max_sentences=4, shuffle=False)
    for name in (benchmark.STOCK, "sinusoidal", "shaw"):
        torch.manual_seed(0)
        model = benchmark.build_from_flags(
            "transformer" if name == benchmark.STOCK else "transformer_posenc",
            TINY + ([] if name == benchmark.STOCK else ["--position-encoding", name]), task, 64)
        model = benchmark.for_inference(model, task)
        assert not model.training and not model.decoder.layers[-1].need_attn  # as fairseq-generate's
        for beam in (1, 3):
            for sample, hypos in zip(batches, benchmark.decode(model, task, batches, beam, torch.device("cpu"),
                                                               torch.float32)):
                # the longest reference's words and </s>, for every hypothesis of every sentence
                assert {len(h["tokens"]) for sent in hypos for h in sent} == {sample["target"].size(1)}
                assert all(len(sent) == beam for sent in hypos)


def test_rounds_shuffle_the_order_and_ratios_are_per_round(benchmark):
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abcd"}
    times = benchmark.interleaved_rounds(fns, 6, torch.device("cpu"), seed=3)
    assert calls[:4] == list("abcd")  # the untimed warm-up round
    rounds = [calls[4 + 4 * r: 8 + 4 * r] for r in range(6)]
    assert all(sorted(r) == list("abcd") for r in rounds) and len({tuple(r) for r in rounds}) > 1
    assert all(len(t) == 6 for t in times.values())
    # a machine twice as slow in one round changes no ratio of that round
    times = {"ref": [1.0, 2.0, 1.0], "x": [1.1, 2.2, 1.3]}
    assert benchmark.median_ratio(times, "x", "ref") == pytest.approx(1.1)
    assert benchmark.median_ratio(times, "x", "absent") is None


def test_the_profile_holds_one_decoding_step(benchmark, task):
    """A tiny stock model: one step runs each of its layers' 8 biased projections once (self-attention
    q, k, v, out; encoder-decoder attention q, out, its keys and values cached; fc1, fc2)."""
    sample = benchmark.fairseq_batches(task, "test", 1, max_sentences=4, shuffle=False)[0]
    model = benchmark.for_inference(benchmark.build_from_flags("transformer", TINY, task, 64), task)
    ops, calls = benchmark._profile_one_step(model, task, sample, 3)
    counts = {e.key: e.count for e in ops.key_averages()}
    assert counts["aten::addmm"] == 2 * 8
    steps = [nc for (f, _, fn), (_, nc, _, _, _) in calls.stats.items() if fn == "extract_features_scriptable"]
    assert steps == [1]


def test_callgrind_counting_is_refused_without_models_to_count(benchmark, capsys):
    with pytest.raises(SystemExit) as exit:
        benchmark.main(["--callgrind-steps", "4"])
    assert exit.value.code == 2
    assert "--callgrind-steps counts the steps of the --profile-step models: name them" in capsys.readouterr().err
