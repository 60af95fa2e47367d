"""What fairseq-train reports while it trains is what a fresh fairseq-validate and fairseq-generate
of the checkpoint give, for every position encoding, through fairseq's own trainer and optimizer.

Position schemes keep tables (relative biases, DIET-ABS's P_Q P_K^T, RoPE's cos/sin, FLOATER's
ODE solution) across no-grad forwards. fairseq's optimizers write parameters through ``p.data``,
which leaves a tensor's version counter alone, so a kept table that trusts that counter goes
stale after the first validation of a process. Each run here therefore validates twice in each
process (``--validate-interval-updates``), with ``--eval-bleu`` decoding in process, and is
resumed once: the checked validation is the second of the resumed process.

A stale table is only visible if the position parameters move between validations and the model
relies on them: hence a large learning rate, no dropout and a dozen updates between validations
(measured on the code before the fix: the stale schemes' losses were off by 35 to 675 times the
tolerance below, and 13 to 16 of the 32 hypotheses differed).

Everything runs in this one Python process (fairseq costs seconds to import): fairseq_cli's
``train``/``validate``/``generate`` mains are called with argument lists, and "fresh" means what
fairseq-validate and fairseq-generate build from the checkpoint file: a new task, new model
objects, nothing shared with the trainer's model.
"""
import json
import math
import os

import pytest
import torch
from fairseq import checkpoint_utils, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.tasks.translation import TranslationTask
import fairseq_cli.generate
import fairseq_cli.train
import fairseq_cli.validate

from posenc_workflow import pipeline, toy_data
from fairseq_posenc.positions import POSITION_ENCODINGS
from helpers.fairseq_runs import preprocess_here

MODEL = [
    "--encoder-layers", "2", "--decoder-layers", "1",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
]
EXTRA = {"floater": ["--floater-step", "0.1"]}  # one RK4 step per position: the cheap solver
MAX_TOKENS = "300"
VALID_SENTENCES = 32
LR = 1e-2
VALIDATE_EVERY = 12  # updates
FIRST_CALL_UPDATES, RESUMED_UPDATES = 2 * VALIDATE_EVERY, 4 * VALIDATE_EVERY  # two validations in each call
# the in-training --eval-bleu decoding and fairseq-generate: the same beam and length limits
BEAM, MAX_LEN_A, MAX_LEN_B = 2, 1.2, 4
EPS32 = torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("consistency")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (400, 3, 10), "valid": (VALID_SENTENCES, 3, 10)})
    return preprocess_here(prefixes, str(root / "bin"))


class Recorder:
    """What each validation saw: its batches' summed losses and the hypotheses decoded for them.
    ``current`` is the record that fairseq's calls are written into (None: not recorded)."""

    def __init__(self):
        self.current = None
        self.validations = []  # the trainer's, in order

    def start(self, **info):
        self.current = {**info, "batches": [], "hypotheses": {}}
        return self.current


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    validate, valid_step, inference_step = (fairseq_cli.train.validate, TranslationTask.valid_step,
                                            TranslationTask.inference_step)

    def recorded_validate(cfg, trainer, task, epoch_itr, subsets):
        record = rec.start(updates=trainer.get_num_updates(), model=trainer.model)
        rec.validations.append(record)
        try:
            record["returned"] = validate(cfg, trainer, task, epoch_itr, subsets)
        finally:
            rec.current = None
        return record["returned"]

    def recorded_valid_step(self, sample, model, criterion, **kwargs):
        loss, sample_size, log = valid_step(self, sample, model, criterion, **kwargs)
        if rec.current is not None:
            rec.current["batches"].append((tuple(sample["id"].tolist()), float(log["loss"]), int(log["ntokens"]),
                                           float(log["sample_size"])))
        return loss, sample_size, log

    def recorded_inference_step(self, generator, models, sample, *args, **kwargs):
        out = inference_step(self, generator, models, sample, *args, **kwargs)
        if rec.current is not None:
            for i, hyps in zip(sample["id"].tolist(), out):
                rec.current["hypotheses"][i] = hyps[0]["tokens"].tolist()
        return out

    monkeypatch.setattr(fairseq_cli.train, "validate", recorded_validate)
    monkeypatch.setattr(TranslationTask, "valid_step", recorded_valid_step)
    monkeypatch.setattr(TranslationTask, "inference_step", recorded_inference_step)
    # fairseq keeps the best validation loss seen in this process on a function: not across runs
    monkeypatch.delattr(checkpoint_utils.save_checkpoint, "best", raising=False)
    yield rec


def _train(data_bin, save_dir, encoding, max_update):
    argv = [
        data_bin, "--user-dir", pipeline.USER_DIR, "--save-dir", save_dir,
        "--arch", "transformer_posenc", "--position-encoding", encoding, *EXTRA.get(encoding, []), *MODEL,
        "--cpu", "--dropout", "0", "--optimizer", "adam", "--lr", str(LR),
        "--max-tokens", MAX_TOKENS, "--update-freq", "2", "--max-update", str(max_update),
        # validate and save on update counts only (never at an epoch's end), always validating at the end
        "--validate-interval-updates", str(VALIDATE_EVERY), "--validate-interval", "1000", "--save-interval", "1000",
        "--no-epoch-checkpoints",
        "--eval-bleu", "--eval-bleu-detok", "space",
        "--eval-bleu-args", json.dumps({"beam": BEAM, "max_len_a": MAX_LEN_A, "max_len_b": MAX_LEN_B}),
        "--seed", "1", "--num-workers", "0", "--no-progress-bar", "--log-format", "simple", "--log-interval", "100",
    ]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    fairseq_cli.train.main(convert_namespace_to_omegaconf(args))


def _fresh_validate(data_bin, checkpoint):
    """fairseq_cli.validate's cli_main, in process."""
    argv = [data_bin, "--user-dir", pipeline.USER_DIR, "--path", checkpoint, "--task", "translation",
            "--valid-subset", "valid", "--max-tokens", MAX_TOKENS, "--cpu", "--num-workers", "0", "--seed", "1",
            "--no-progress-bar"]
    args = options.parse_args_and_arch(options.get_validation_parser(), argv)
    overrides = options.parse_args_and_arch(options.get_validation_parser(), argv, suppress_defaults=True)
    fairseq_cli.validate.main(convert_namespace_to_omegaconf(args), override_args=overrides)


def _fresh_generate(data_bin, checkpoint, results):
    argv = [data_bin, "--user-dir", pipeline.USER_DIR, "--path", checkpoint, "--gen-subset", "valid",
            "--max-tokens", MAX_TOKENS, "--beam", str(BEAM), "--max-len-a", str(MAX_LEN_A),
            "--max-len-b", str(MAX_LEN_B), "--cpu", "--num-workers", "0", "--seed", "1", "--results-path", results]
    fairseq_cli.generate.main(options.parse_args_and_arch(options.get_generation_parser(), argv))


def _mean_loss(batches):
    """fairseq's logged validation loss: summed loss per target token (sample_size), in bits."""
    return sum(b[1] for b in batches) / sum(b[3] for b in batches) / math.log(2)


@pytest.mark.parametrize("encoding", list(POSITION_ENCODINGS))
def test_logged_validation_and_eval_bleu_match_a_fresh_load_of_the_checkpoint(data_bin, tmp_path, recorder, encoding):
    save_dir = str(tmp_path / "checkpoints")
    _train(data_bin, save_dir, encoding, FIRST_CALL_UPDATES)
    _train(data_bin, save_dir, encoding, RESUMED_UPDATES)
    steps = [v["updates"] for v in recorder.validations]
    assert steps == [VALIDATE_EVERY * k for k in (1, 2, 3, 4)]
    # the resumed call built its own model: each call's second validation is its process's second
    assert recorder.validations[1]["model"] is recorder.validations[0]["model"]
    assert recorder.validations[2]["model"] is not recorder.validations[1]["model"]
    assert recorder.validations[3]["model"] is recorder.validations[2]["model"]
    last = recorder.validations[-1]

    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
    state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint)
    assert state["optimizer_history"][-1]["num_updates"] == RESUMED_UPDATES
    # the checkpoint's loss is the one the last validation returned
    logged = state["extra_state"]["val_loss"]
    assert logged == last["returned"][0]

    fresh = recorder.start(updates=None)
    _fresh_validate(data_bin, checkpoint)
    fresh_generate = recorder.start(updates=None)
    _fresh_generate(data_bin, checkpoint, str(tmp_path / "generate"))
    recorder.current = None

    # Both evaluations run the same float32 operations, in this process, on bitwise-equal
    # parameters and batches; they may differ where a kept table was built over another number of
    # positions (a matmul blocked differently, a solve over more steps): a few ulps per entry.
    # A batch's loss is a float32 sum of N positive per-token terms. Recursive summation is within
    # (N - 1) u S of the exact sum S (u = eps32 / 2; Higham, Accuracy and Stability, 4.2), and
    # terms off by a few ulps, less than N u of themselves, move it by less than N u S: per side
    # 2 N u S, between the two sides 2 N eps32 S.
    assert [b[0] for b in fresh["batches"]] == [b[0] for b in last["batches"]], "not the same batches"
    rows = [(trained, reloaded, 2 * ntokens * EPS32 * reloaded)
            for (_, trained, ntokens, _), (_, reloaded, _, _) in zip(last["batches"], fresh["batches"])]
    fresh_loss = _mean_loss(fresh["batches"])
    differing = [i for i in sorted(last["hypotheses"]) if last["hypotheses"][i] != fresh_generate["hypotheses"].get(i)]
    print(f"{encoding}: logged {logged}, fresh {fresh_loss:.6f}; per batch (trained, fresh, tolerance) {rows}; "
          f"{len(differing)} of {len(last['hypotheses'])} hypotheses differ")
    assert all(abs(trained - reloaded) <= tol for trained, reloaded, tol in rows), rows
    # fairseq logs the mean rounded to 3 decimals: the logged value is that of the recorded batches,
    # and of the fresh model's, within the rounding and the batches' tolerances carried to the mean
    tol_mean = sum(tol for *_, tol in rows) / sum(b[3] for b in fresh["batches"]) / math.log(2)
    assert abs(logged - _mean_loss(last["batches"])) <= 5e-4 + tol_mean
    assert abs(logged - fresh_loss) <= 5e-4 + tol_mean, (logged, fresh_loss)

    # fairseq-generate with these flags decodes as --eval-bleu-args did: the validate above ran
    # the checkpoint's own --eval-bleu generator on the fresh model
    assert fresh_generate["hypotheses"] == fresh["hypotheses"]
    assert sorted(last["hypotheses"]) == list(range(VALID_SENTENCES))
    assert differing == [], f"{len(differing)} of {VALID_SENTENCES} --eval-bleu hypotheses differ from fairseq-generate"
