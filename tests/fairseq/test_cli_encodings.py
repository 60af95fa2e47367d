"""Every encoding through fairseq's own CLI: a short fairseq-train, then fairseq-generate on the
checkpoint, whose scores must be those of the model that saved it."""
import math
import os

import pytest
import torch

from posenc_workflow import pipeline, toy_data
from fairseq_posenc.positions import POSITION_ENCODINGS
from helpers.fairseq_runs import generate_command, outcome, preprocess_here, run_all, train_command
from helpers.tolerances import float32_tolerance, transformer_terms
from helpers.toy import TINY, model_that_saved


TRAIN = ["--arch", "transformer_posenc", "--cpu", *TINY, "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "1000",
         "--max-update", "15", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
         "--no-epoch-checkpoints", "--no-progress-bar", "--seed", "3", "--num-workers", "0"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Every encoding's fairseq-train, its fairseq-generate (beam 4) and its fairseq-generate
    --score-reference, all through the console scripts' entry points in one process
    (tests/helpers/fairseq_runs.py: the imports once, each run from its own command line)."""
    root = tmp_path_factory.mktemp("cli")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (600, 3, 10), "valid": (40, 3, 10),
                                                              "test": (20, 3, 14)})
    data = preprocess_here(prefixes, str(root / "bin"))
    jobs = []
    for encoding in POSITION_ENCODINGS:
        save_dir = str(root / encoding)
        checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
        jobs += [(f"{encoding} train", "fairseq-train",
                  train_command(data, save_dir, [*TRAIN, "--position-encoding", encoding])),
                 (f"{encoding} generate", "fairseq-generate",
                  generate_command(data, checkpoint, ["--beam", "4", "--lenpen", "0.6", "--batch-size", "64"])),
                 (f"{encoding} score", "fairseq-generate",
                  generate_command(data, checkpoint, ["--score-reference", "--batch-size", "8"]))]
    return {"root": root, "bin": data, "raw": prefixes, "runs": run_all(jobs, str(root / "runs"))}


def _parse_positional_scores(text):
    scores = {}
    for line in text.splitlines():
        if line.startswith("P-"):
            idx, values = line[2:].split("\t", 1)
            scores[int(idx)] = [float(x) for x in values.split()]
    return scores


@pytest.mark.parametrize("encoding", list(POSITION_ENCODINGS))
def test_train_and_generate_reload_the_same_model(corpus, encoding):
    runs = corpus["runs"]
    outcome(runs, f"{encoding} train")
    checkpoint = os.path.join(corpus["root"], encoding, "checkpoint_last.pt")
    generation = pipeline.parse_generate_output(outcome(runs, f"{encoding} generate")["stdout"])
    assert len(generation.hypotheses) == 20

    out = outcome(runs, f"{encoding} score")["stdout"]
    cli_scores = _parse_positional_scores(out)
    model, dictionary = model_that_saved(checkpoint, corpus["bin"])
    with open(corpus["raw"]["test"] + ".src") as fs, open(corpus["raw"]["test"] + ".tgt") as ft:
        pairs = list(zip(fs, ft))
    assert sorted(cli_scores) == list(range(len(pairs)))
    with torch.no_grad():
        for i, (src, tgt) in enumerate(pairs):
            src_tokens = dictionary.encode_line(src, add_if_not_exist=False).long()[None]
            target = dictionary.encode_line(tgt, add_if_not_exist=False).long()[None]
            prev = torch.cat([target.new_tensor([[dictionary.eos()]]), target[:, :-1]], dim=1)
            lprobs = model.get_normalized_probs(model(src_tokens, torch.tensor([src_tokens.size(1)]), prev),
                                                log_probs=True)
            expected = (lprobs[0].gather(-1, target[0, :, None])[:, 0] / math.log(2)).tolist()
            # fairseq-generate prints 4 decimals (up to 5e-5 off), of a float32 forward in a batch
            # of 8 (another summation order than this one sentence alone), in bits
            model_tolerance = float32_tolerance(transformer_terms(model, src_tokens.size(1), target.size(1)),
                                                max(1.0, lprobs.abs().max().item())) / math.log(2)
            assert cli_scores[i] == pytest.approx(expected, abs=0.5e-4 + model_tolerance), f"sentence {i}"
