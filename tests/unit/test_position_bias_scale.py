"""``--position-bias-scale S`` reparametrises the learned logit biases as bias = S * w, w stored
at init / S: the model at step 0 is the same, and one Adam step moves the bias S times as far.

Covered: every registered encoding whose config takes the flag, and DIET's segment attention,
which takes it with any encoding."""
import argparse
import os
import subprocess

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.optim.adam import Adam

from posenc_workflow import pipeline, toy_data
from fairseq_posenc.compat import PosencError
from fairseq_posenc.models.from_flags import model_args
from fairseq_posenc.positions import POSITION_ENCODINGS, AttentionPositions
from fairseq_posenc.positions.bias_scale import uses_bias_scale
from helpers.tolerances import EPS32, assert_within, float32_tolerance, magnitude, transformer_terms
from helpers.toy import TINY, ToyTask, build_model, full_log_probs, toy_batch
from helpers.fairseq_runs import preprocess_here

SCALED = [name for name, scheme in POSITION_ENCODINGS.items() if uses_bias_scale(scheme)]
SEGMENTS = "segment_attention"  # sinusoidal with --segment-attention: its scalars are the bias
CASES = SCALED + [SEGMENTS]
LR = 1e-4


def test_the_papers_learned_logit_biases_take_the_flag():
    # a new scheme may join them; these three must not drop out (the tests below would not see it)
    assert {"t5", "diet_rel", "diet_abs"} <= set(SCALED)


def _task():
    task = ToyTask()
    task.source_dictionary.add_symbol("<sep>")
    return task


def _model(case, scale, seed=1):
    flags = ["--position-encoding", "sinusoidal", "--segment-attention"] if case == SEGMENTS else \
        ["--position-encoding", case]
    model = build_model("transformer_posenc", *flags, "--dropout", "0.0", "--position-bias-scale", str(scale),
                        seed=seed, task=_task())
    return model


def _batch(model):
    """Sources of lengths 9-23 cut into segments by a separator 5 tokens from the end."""
    src, lengths, prev = toy_batch(model.encoder.dictionary, [23, 9, 14], tgt_len=20, seed=0)
    src[:, -5] = model.encoder.dictionary.index("<sep>")
    return src, lengths, prev


def _terms(model, case):
    if case == SEGMENTS:
        return [("encoder", model.encoder.segment_bias)]
    return [("encoder", model.encoder.position_encoding), ("decoder", model.decoder.position_encoding)]


def _biases(model, case, src, prev):
    """What each term adds to the logits of every layer over the batch's frame, (B or 1, H, T, S)
    per layer, as attention asks for it."""
    out = {}
    for side, term in _terms(model, case):
        tokens = src if side == "encoder" else prev
        term.begin_forward(tokens)
        pos = AttentionPositions.build(tokens.size(1), tokens.size(1), None, tokens.device)
        for layer in range(term.num_layers):
            out[side, layer] = term.attention_bias(layer, None, pos).detach().clone()
    return out


def _loss(model, src, lengths, prev):
    target = torch.roll(prev, -1, dims=1)
    return -full_log_probs(model, src, lengths, prev).gather(-1, target[..., None]).mean()


@pytest.mark.numerics
@pytest.mark.parametrize("case", CASES)
def test_the_model_at_step_0_does_not_depend_on_the_scale(case):
    base, scaled = _model(case, 1.0).eval(), _model(case, 10.0).eval()
    # the same parameter names and shapes: a checkpoint loads whatever S it was trained with
    assert {k: v.shape for k, v in base.state_dict().items()} == {k: v.shape for k, v in scaled.state_dict().items()}
    src, lengths, prev = _batch(base)
    with torch.no_grad():
        expected, got = full_log_probs(base, src, lengths, prev), full_log_probs(scaled, src, lengths, prev)
        base_biases, scaled_biases = _biases(base, case, src, prev), _biases(scaled, case, src, prev)
    # A scalar bias S * (init / S) is init up to 5 roundings of u = eps / 2 each (the std cast
    # to float32 for either S, the draw times it for either S, the product by S): within
    # 2.5 eps |bias|. Such a change is less than one more term in the logit it is added to, so
    # the log-probabilities differ by at most the chain's terms x eps x magnitude
    # (tests/helpers/tolerances.py; measured 1.4e-6 against about 4e-3). Leaving w at init, not init / S,
    # moves them by 0.22 (t5) to 1.6 (diet_abs); the segment scalars start at 0 either way.
    assert_within(got, expected, float32_tolerance(transformer_terms(base, 23, 20), magnitude(expected, floor=1)),
                  "log-probabilities")
    if getattr(POSITION_ENCODINGS.get(case), "bias_is_product", False):
        return  # its entries are sums of r products, bounded through the log-probabilities above
    for key, bias in base_biases.items():
        assert_within(scaled_biases[key], bias, 2.5 * EPS32 * magnitude(bias), f"bias {key}")


def _one_adam_step(case, scale):
    """(bias before, bias after) one step of fairseq's Adam on the toy batch."""
    model = _model(case, scale).train()
    src, lengths, prev = _batch(model)
    before = _biases(model, case, src, prev)
    optimizer = Adam(model.parameters(), lr=LR, betas=(0.9, 0.98), eps=1e-8)
    _loss(model, src, lengths, prev).backward()
    optimizer.step()
    return before, _biases(model, case, src, prev)


@pytest.mark.parametrize("case", CASES)
def test_one_adam_step_moves_the_bias_scale_times_as_far(case):
    base_before, base_after = _one_adam_step(case, 1.0)
    before, after = _one_adam_step(case, 10.0)
    for key in base_before:
        base_moved = (base_after[key] - base_before[key]).abs().max().item()
        moved = (after[key] - before[key]).abs().max().item()
        # Adam's first step is lr * g / (|g| + eps) on w, whose gradient is S times the bias's:
        # lr * sign(g) for either S up to eps / |g|, so the bias moves S * lr. The entries that
        # move most have |g| >> eps = 1e-8, and rounding biases of |b| <= 0.1 costs
        # eps * 0.1 / lr = 1e-4 of the difference: both far below 1%. diet_abs's product also
        # moves by dP_Q dP_K^T, S^2 lr^2 per term of r = 8, against S lr |P_Q| ~ S lr 0.35 per
        # term of its first-order change: S lr / 0.35 = 0.3%, within the same 1% (measured:
        # ratios 9.994-10.0005).
        assert base_moved > 0.5 * LR, f"{key}: the bias did not learn ({base_moved:.2e})"
        assert moved / base_moved == pytest.approx(10.0, rel=0.01), key


def _flag_count(parser, flag):
    return sum(flag in action.option_strings for action in parser._actions)


def test_the_flag_reaches_the_model_through_fairseqs_parser_once():
    parser = argparse.ArgumentParser()
    ARCH_MODEL_REGISTRY["transformer_posenc"].add_args(parser)
    assert _flag_count(parser, "--position-bias-scale") == 1
    assert model_args("transformer_posenc", TINY).position_bias_scale == 1.0
    args = model_args("transformer_posenc", [*TINY, "--position-encoding", "t5", "--position-bias-scale", "10"])
    assert args.position_bias_scale == 10.0
    for case in CASES:
        model = _model(case, 2.5)
        assert all(term.bias_scale == 2.5 for _, term in _terms(model, case))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("scale", ["0", "-1", "nan", "inf"])
def test_a_scale_that_is_not_positive_and_finite_is_refused_naming_the_flag(case, scale):
    with pytest.raises(ValueError, match=rf"^--position-bias-scale must be a finite number >= 1.17549e-38 and <= .*, "
                                         rf"got {float(scale)}$"):
        _model(case, scale)


@pytest.mark.numerics
@pytest.mark.parametrize("case", CASES)
def test_weights_of_one_scale_load_into_another_as_the_same_biases(case):
    """--finetune-from-model or load_state_dict into a model built with another S: the stored
    S (the module's extra state) rescales w, so the biases and the model are those saved."""
    trained = _model(case, 10.0).train()
    src, lengths, prev = _batch(trained)
    optimizer = Adam(trained.parameters(), lr=3e-2, betas=(0.9, 0.98), eps=1e-8)
    for _ in range(3):  # biases far from their initial values: a wrong factor shows
        optimizer.zero_grad()
        _loss(trained, src, lengths, prev).backward()
        optimizer.step()
    trained.eval()
    other = _model(case, 1.0, seed=2).eval()
    other.load_state_dict(trained.state_dict())  # strict, as fairseq loads
    with torch.no_grad():
        expected, got = full_log_probs(trained, src, lengths, prev), full_log_probs(other, src, lengths, prev)
        unscaled = {key: bias / 10.0 for key, bias in _biases(trained, case, src, prev).items()}
        moved = max((bias - _biases(other, case, src, prev)[key]).abs().max().item() for key, bias in unscaled.items())
    # w x 10 / 1, one rounding of each w (and of each factor of DIET-ABS's product): less than one
    # more term in each logit, as at step 0 above
    assert_within(got, expected, float32_tolerance(transformer_terms(trained, 23, 20), magnitude(expected, floor=1)),
                  "log-probabilities")
    assert moved > 1e-2, "w was not rescaled: the biases are 1/10 of those saved"
    assert float(other.state_dict()[next(k for k in other.state_dict() if k.endswith("_extra_state"))]) == 1.0


@pytest.mark.parametrize("case", CASES)
def test_weights_saved_before_the_flag_existed_are_refused_in_one_line(case):
    old = {k: v for k, v in _model(case, 1.0).state_dict().items() if not k.endswith("_extra_state")}
    assert len(old) < len(_model(case, 1.0).state_dict())
    for scale in (1.0, 4.0):
        with pytest.raises(PosencError, match=r"^the checkpoint has no \w+\.(position_encoding|segment_bias)\."
                           r"_extra_state: it was saved by an earlier version of fairseq_posenc, whose checkpoints "
                           "this one does not load; train the model again$"):
            _model(case, scale, seed=3).load_state_dict(old)


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("bias_scale_cli")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (20, 3, 8), "valid": (5, 3, 8)})
    return preprocess_here(prefixes, str(root / "bin"))


@pytest.mark.slow  # fairseq-train
def test_fairseq_train_refuses_the_flag_where_it_changes_nothing_in_one_line_before_any_update(data_bin, tmp_path):
    """alibi, shaw, learned and rope trained unchanged with it (a sweep over S gave identical
    runs); now fairseq-train stops at the model build. tests/unit/test_flags_change_the_model.py covers
    every flag with every encoding in process."""
    save_dir = tmp_path / "run"
    proc = subprocess.run([pipeline.executable("fairseq-train"), data_bin, "--user-dir", pipeline.USER_DIR,
                           "--save-dir", str(save_dir), "--arch", "transformer_posenc", "--cpu", *TINY,
                           "--position-encoding", "alibi", "--position-bias-scale", "10", "--optimizer", "adam",
                           "--lr", "1e-3", "--max-tokens", "300", "--max-update", "1", "--no-progress-bar",
                           "--num-workers", "0"], capture_output=True, text=True)
    assert proc.returncode == 1
    stderr = proc.stderr.strip().splitlines()
    assert stderr[-1].startswith("fairseq-train: error: --position-bias-scale 10.0 would change nothing: "
                                 "--position-encoding alibi without --segment-attention does not use it"), stderr[-1]
    assert not any("Traceback" in line for line in stderr)
    assert "num. model params" not in proc.stdout + proc.stderr  # stopped at the build, before the trainer
    assert not os.path.exists(save_dir) or os.listdir(save_dir) == []
