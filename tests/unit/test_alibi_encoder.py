"""ALiBi's encoder forms (--alibi-encoder), the attention rows a one-sided head masks entirely,
and the checkpoints written before the flag existed, refused."""
import argparse
import copy
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from fairseq_posenc.labels import model_label
from fairseq_posenc.modules import PositionalAttention
from fairseq_posenc.positions import AttentionPositions
from fairseq_posenc.positions.alibi import ENCODER_FORMS, ALiBi, alibi_bias, alibi_slopes
from helpers import scripts
from helpers.tolerances import assert_within, float32_tolerance, magnitude
from helpers.toy import build_model, full_log_probs, toy_batch, with_strong_positions
from helpers.fairseq_runs import preprocess_here

INF = math.inf
FORM_KEY = "encoder.position_encoding.encoder_form"


def alibi_model(*flags, seed=1):
    return with_strong_positions(build_model("transformer_posenc", "--position-encoding", "alibi", *flags, seed=seed))


def form_of(model) -> str:
    return model.encoder.position_encoding.bias_form


def test_each_forms_bias_by_hand():
    slopes = torch.tensor([0.5, 0.25, 0.125])  # three heads: the last, even, sees the left
    offsets = torch.arange(-2, 3)  # key minus query
    assert alibi_bias(slopes, offsets, "symmetric").tolist() == [
        [-1.0, -0.5, 0.0, -0.5, -1.0],
        [-0.5, -0.25, 0.0, -0.25, -0.5],
        [-0.25, -0.125, 0.0, -0.125, -0.25]]
    assert alibi_bias(slopes, offsets, "split").tolist() == [
        [-1.0, -0.5, 0.0, -INF, -INF],
        [-INF, -INF, 0.0, -0.25, -0.5],
        [-0.25, -0.125, 0.0, -INF, -INF]]
    # right slopes in reverse head order: 0.125, 0.25, 0.5
    assert alibi_bias(slopes, offsets, "crossed").tolist() == [
        [-1.0, -0.5, 0.0, -0.125, -0.25],
        [-0.5, -0.25, 0.0, -0.25, -0.5],
        [-0.25, -0.125, 0.0, -0.5, -1.0]]


@torch.no_grad()
def test_the_default_is_the_published_symmetric_form_the_bias_minus_slope_times_distance():
    """MosaicBERT, JinaBERT-v2, data2vec 2.0 and x-transformers: -m_h |i - j| in every head."""
    model = build_model("transformer_posenc", "--position-encoding", "alibi")
    assert form_of(model) == "symmetric" and model_label(model) == "alibi"
    assert model.state_dict()[FORM_KEY].item() == ENCODER_FORMS.index("symmetric")
    scheme = model.encoder.position_encoding
    scheme.begin_forward(torch.zeros(1, 7, dtype=torch.long))
    bias = scheme.attention_bias(0, None, AttentionPositions.build(7, 7, None, "cpu"))[0]  # (H, T, S)
    i = torch.arange(7.0)
    slopes = torch.tensor([2 ** (-8 * (h + 1) / 4) for h in range(4)])  # 4 heads: 2^-2, 2^-4, 2^-6, 2^-8
    assert torch.equal(bias, -slopes[:, None, None] * (i[:, None] - i[None, :]).abs())


def test_crossed_with_one_head_is_symmetric_and_refused_in_one_line():
    from fairseq_posenc.compat import PosencError

    with pytest.raises(PosencError) as error:
        build_model("transformer_posenc", "--position-encoding", "alibi", "--alibi-encoder", "crossed",
                    "--encoder-attention-heads", "1")
    assert str(error.value) == ("--alibi-encoder crossed with 1 encoder attention head is --alibi-encoder symmetric "
                                "(its one head has the same slope on both sides): use symmetric")
    # one head's crossed bias is the symmetric one, which is why it is refused
    offsets = torch.arange(-3, 4)
    assert torch.equal(alibi_bias(alibi_slopes(1), offsets, "crossed"), alibi_bias(alibi_slopes(1), offsets, "symmetric"))
    # two heads and more are not symmetric: the form is the model's label
    model = build_model("transformer_posenc", "--position-encoding", "alibi", "--alibi-encoder", "crossed",
                        "--encoder-attention-heads", "2")
    assert model_label(model) == "alibi (crossed)"
    # six heads, not a power of two: the slope list 2^-2, 2^-4, 2^-6, 2^-8, 2^-1, 2^-3 reversed as
    # it is (docs/encodings.md): head 0 has 2^-2 on the left and 2^-3 on the right, head 1 2^-4 and 2^-1
    bias = alibi_bias(alibi_slopes(6), torch.tensor([-1, 1]), "crossed")
    assert bias[:2].tolist() == [[-2 ** -2, -2 ** -3], [-2 ** -4, -2 ** -1]]


def test_the_flag_chooses_the_encoders_form():
    for form in ENCODER_FORMS:
        model = build_model("transformer_posenc", "--position-encoding", "alibi", "--alibi-encoder", form)
        assert form_of(model) == form
        assert model.state_dict()[FORM_KEY].item() == ENCODER_FORMS.index(form)
        assert model.state_dict()[FORM_KEY].dtype == torch.int64
        assert not any("encoder_form" in key for key in model.decoder.state_dict())


def test_an_unknown_form_and_a_one_headed_split_are_refused_naming_the_flag():
    with pytest.raises(ValueError, match=r"--alibi-encoder 'mirrored' is not a form; choose one of symmetric, "
                                         r"split, crossed"):
        build_model("transformer_posenc", "--position-encoding", "alibi", "--alibi-encoder", "mirrored")
    with pytest.raises(ValueError, match="--alibi-encoder split needs at least 2 encoder attention heads"):
        build_model("transformer_posenc", "--position-encoding", "alibi", "--alibi-encoder", "split",
                    "--encoder-attention-heads", "1")


@pytest.mark.parametrize("form", ENCODER_FORMS)
@torch.no_grad()
def test_the_decoder_is_causal_alibi_whatever_the_encoder_form(form):
    model = alibi_model("--alibi-encoder", form)
    scheme = model.decoder.position_encoding
    scheme.begin_forward(torch.zeros(1, 6, dtype=torch.long))
    bias = scheme.attention_bias(0, None, AttentionPositions.build(6, 6, None, "cpu"))[0]  # (H, T, S)
    i = torch.arange(6)
    seen = i[:, None] >= i[None, :]  # the causal mask hides the rest
    assert torch.equal(bias[:, seen], (-alibi_slopes(4)[:, None, None] * (i[:, None] - i[None, :]))[:, seen])
    # and the whole decoder computes the same from the same encoder output
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5], tgt_len=6)
    encoder_out = model.encoder(src, lengths)
    symmetric = alibi_model("--alibi-encoder", "symmetric")
    assert torch.equal(model.decoder(prev, encoder_out)[0], symmetric.decoder(prev, encoder_out)[0])


@pytest.mark.parametrize("form", ENCODER_FORMS)
@torch.no_grad()
def test_each_forms_bias_is_the_float32_bias_in_a_bfloat16_model(form):
    # 12 heads: slopes 2^(-k/2) that bfloat16 cannot hold exactly
    scheme = ALiBi(argparse.Namespace(alibi_encoder=form), "encoder", 1, 12, 8)
    half = copy.deepcopy(scheme).bfloat16()

    def bias(s):
        s.begin_forward(torch.zeros(1, 600, dtype=torch.long))
        return s.attention_bias(0, None, AttentionPositions.build(600, 600, None, "cpu"))[0]

    exact, got = bias(scheme), bias(half)
    assert got.dtype == torch.float32 and torch.equal(got, exact)
    # what bfloat16 arithmetic would give is off by several units at 600 positions
    positions = torch.arange(600)
    table = alibi_bias(half.slopes, torch.arange(-599, 600), form)  # (H, offsets) in bfloat16
    in_bf16 = table[:, positions[None, :] - positions[:, None] + 599]  # (H, T, S)
    finite = torch.isfinite(exact)
    assert torch.equal(torch.isfinite(in_bf16), finite)
    assert (in_bf16.float() - exact)[finite].abs().max().item() > 2.0


# -- rows whose every key is masked --------------------------------------------------------

def _fully_masked_rows(model, src) -> int:
    """Encoder self-attention rows (over batch, heads, queries) that see no key."""
    scheme = model.encoder.position_encoding
    pads = src.eq(model.encoder.dictionary.pad())
    scheme.begin_forward(src)
    bias = scheme.attention_bias(0, None, AttentionPositions.build(src.size(1), src.size(1), pads, "cpu"))
    mask = PositionalAttention._additive_mask(None, pads, torch.float32, src.size(1)) + bias
    return int(torch.isneginf(mask).all(-1).sum())


def _explicit_softmax(monkeypatch):
    """Make every attention call take the path with its own softmax, as asking for weights does."""
    forward = PositionalAttention.forward

    def with_weights(self, *args, **kwargs):
        kwargs["need_weights"] = True
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(PositionalAttention, "forward", with_weights)


# The two paths compute softmax(q k^T / sqrt(D) + mask) v in float32 in different orders (SDPA
# may scale q and k separately and normalise after the value sum). Rounding bounds: a dot
# product of D = 8 terms and a sum over S <= 9 keys each are within (n - 1) eps of the exact
# value relative to the magnitudes summed, so one attention call's output differs by about
# 2 (D + S) eps relative to its scale, and the layers' errors add: 2 encoder layers, then
# 2 decoder layers of 2 attention calls each on top of the encoder's. The log-probabilities
# carry the logits' scale (up to ~10 here). Measured: 6.0e-7 (encoder output, scale 3; the
# bound: 2.4e-5) and 9.5e-7 (log-probabilities, scale 7.6; the bound: 2.5e-4).
EPS = torch.finfo(torch.float32).eps
PER_CALL = 2 * (8 + 9) * EPS
ENCODER_CALLS, DECODER_CALLS = 2, 2 + 2 * 2


@torch.no_grad()
def test_fully_masked_rows_are_zero_and_finite_in_both_attention_paths(monkeypatch):
    model = alibi_model("--alibi-encoder", "split")
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=6)
    # every pad query (left padding) of a left-only head (0 and 2) sees only pads: (4 + 2) x 2
    assert _fully_masked_rows(model, src) == 12
    fused_enc = model.encoder(src, lengths)["encoder_out"][0]  # (T, B, C), pads included
    fused = full_log_probs(model, src, lengths, prev)
    _explicit_softmax(monkeypatch)
    explicit_enc = model.encoder(src, lengths)["encoder_out"][0]
    explicit = full_log_probs(model, src, lengths, prev)
    for out in (fused_enc, explicit_enc, fused, explicit):
        assert torch.isfinite(out).all()
    torch.testing.assert_close(explicit_enc, fused_enc, rtol=0,
                               atol=ENCODER_CALLS * PER_CALL * fused_enc.abs().max().item())
    torch.testing.assert_close(explicit, fused, rtol=0,
                               atol=(ENCODER_CALLS + DECODER_CALLS) * PER_CALL * fused.abs().max().item())


def test_gradients_through_fully_masked_rows_are_finite_and_agree_in_both_paths(monkeypatch):
    model = alibi_model("--alibi-encoder", "split", "--dropout", "0").train()
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=6)

    def gradients():
        model.zero_grad()
        full_log_probs(model, src, lengths, prev).mean().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    fused = gradients()
    _explicit_softmax(monkeypatch)
    explicit = gradients()
    assert fused.keys() == explicit.keys()
    # The backward runs the forward's chain of attention calls again, in reverse, and sums each
    # gradient over the batch's positions: three times the forward's bound, on the scale of the
    # largest gradient. Measured: 2.0e-8 (the bound: 6e-6).
    scale = max(grad.abs().max().item() for grad in fused.values())
    atol = 3 * (ENCODER_CALLS + DECODER_CALLS) * PER_CALL * scale
    for name, grad in fused.items():
        assert torch.isfinite(grad).all() and torch.isfinite(explicit[name]).all(), name
        torch.testing.assert_close(explicit[name], grad, rtol=0, atol=atol, msg=name)


@pytest.mark.numerics
def test_the_explicit_path_zeroes_only_rows_that_see_no_key_and_keeps_a_real_nan():
    torch.manual_seed(0)
    attention = PositionalAttention(16, 2, encoder_decoder_attention=True).eval()
    keys = torch.randn(5, 1, 16)  # (S, B, C)
    queries = torch.randn(4, 1, 16)
    mask = torch.zeros(4, 5)
    mask[0] = -INF  # query 0 sees no key; queries 1-3 see them all
    queries[2, 0, 0] = math.nan  # a diverged query
    with torch.no_grad():
        fused, _ = attention(queries, keys, keys, attn_mask=mask, need_weights=False)
        explicit, weights = attention(queries, keys, keys, attn_mask=mask, need_weights=True, need_head_weights=True)
    assert torch.equal(weights[:, 0, 0], torch.zeros(2, 5))  # (H, B, T, S)
    # no key seen: the attention output is 0, and the output projection adds its bias
    assert torch.equal(explicit[0, 0], attention.out_proj.bias.detach())
    assert torch.equal(fused[0, 0], explicit[0, 0])
    assert torch.isnan(explicit[2]).all() and torch.isnan(fused[2]).all()
    assert torch.isfinite(explicit[[0, 1, 3]]).all()
    # SDPA and the explicit softmax sum in other orders: the input projection (16 terms), q . k
    # over a head of 8, the softmax over 5 keys and its weighted sum, the output projection (16)
    assert_within(explicit[[1, 3]], fused[[1, 3]], float32_tolerance(16 + 8 + 5 + 5 + 16, magnitude(
        fused[[1, 3]], queries[[1, 3]], keys, floor=1)), "rows with keys")


def _nan_for_rows_without_keys(sdpa):
    """SDPA as torch's memory-efficient CUDA kernel has behaved (pytorch/pytorch#110213): NaN
    for a row whose every key is masked."""
    def attend(q, k, v, attn_mask=None, **kwargs):
        out = sdpa(q, k, v, attn_mask=attn_mask, **kwargs)
        if attn_mask is not None:
            out = out.masked_fill(torch.isneginf(attn_mask).all(-1, keepdim=True), math.nan)
        return out
    return attend


@pytest.mark.parametrize("guarded", [False, True])
def test_sdpa_rows_without_keys_are_zero_whatever_the_kernel_gives(monkeypatch, guarded):
    """The CUDA guard, run on CPU with a kernel that gives NaN where no key is seen: without it
    the NaN reaches the output (what the guard is for), with it the output and the gradients are
    those of the CPU kernel, which gives 0."""
    from fairseq_posenc.modules import positional_attention

    torch.manual_seed(0)
    attention = PositionalAttention(16, 2, encoder_decoder_attention=True)
    keys, queries = torch.randn(5, 1, 16), torch.randn(4, 1, 16)
    mask = torch.zeros(4, 5)
    mask[0] = -INF  # query 0 sees no key
    expected = attention(queries, keys, keys, attn_mask=mask, need_weights=False)[0]
    expected.sum().backward()
    expected_grads = {n: p.grad.clone() for n, p in attention.named_parameters()}
    attention.zero_grad()

    monkeypatch.setattr(positional_attention.F, "scaled_dot_product_attention",
                        _nan_for_rows_without_keys(F.scaled_dot_product_attention))
    monkeypatch.setattr(positional_attention, "guards_rows_without_keys", lambda q: guarded)
    got = attention(queries, keys, keys, attn_mask=mask, need_weights=False)[0]
    if not guarded:
        assert torch.isnan(got[0]).all() and torch.isfinite(got[1:]).all()
        return
    # the same operations on the same values where a key is seen, and 0 + the output bias
    # where none is: bit for bit
    assert torch.equal(got, expected)
    got.sum().backward()
    for name, param in attention.named_parameters():
        assert torch.equal(param.grad, expected_grads[name]), name


# -- checkpoints from before the flag -------------------------------------------------------

#: the one line that refuses a checkpoint of an earlier form (models/transformer_stacks.py)
OLD_FORM = (f"the checkpoint has no {FORM_KEY}: it was saved by an earlier version of fairseq_posenc, whose "
            "checkpoints this one does not load; train the model again")


def old_layout(state):
    """A state dict as ALiBi models wrote them before --alibi-encoder: no form stored."""
    return {key: value for key, value in state.items() if key != FORM_KEY}


def test_a_state_dict_without_the_form_is_refused_whatever_the_flag():
    from fairseq_posenc.compat import PosencError

    old = old_layout(alibi_model("--alibi-encoder", "symmetric").state_dict())
    for form in ENCODER_FORMS:
        model = alibi_model("--alibi-encoder", form, seed=2)
        with pytest.raises(PosencError) as refused:
            model.load_state_dict(old)
        assert str(refused.value) == OLD_FORM
        assert form_of(model) == form


def test_a_stored_crossed_form_with_one_head_is_refused_at_load():
    """Built with one head, crossed is refused (it is symmetric there); a state dict that names it
    is refused the same way, not computed as symmetric."""
    from fairseq_posenc.compat import PosencError

    model = alibi_model("--encoder-attention-heads", "1")
    state = model.state_dict()
    state[FORM_KEY] = torch.tensor(ENCODER_FORMS.index("crossed"))
    with pytest.raises(PosencError, match=r"^--alibi-encoder crossed with 1 encoder attention head is "):
        model.load_state_dict(state)


@torch.no_grad()
def test_a_stored_form_wins_over_the_flag(caplog):
    split = alibi_model("--alibi-encoder", "split")
    model = alibi_model("--alibi-encoder", "symmetric", seed=2)
    with caplog.at_level("WARNING", logger="fairseq_posenc.positions.alibi"):
        model.load_state_dict(split.state_dict())
    assert form_of(model) == "split"
    assert [r.getMessage() for r in caplog.records] == [
        f"{FORM_KEY}: the weights were trained with --alibi-encoder split; they load with it, not with the "
        "--alibi-encoder symmetric this model was built with"]
    src, lengths, prev = toy_batch(split.encoder.dictionary, [9, 5], tgt_len=6)
    assert torch.equal(full_log_probs(model, src, lengths, prev), full_log_probs(split, src, lengths, prev))


def test_a_stored_form_this_code_does_not_know_is_a_clear_error():
    model = alibi_model()
    state = model.state_dict()
    state[FORM_KEY] = torch.tensor(len(ENCODER_FORMS))
    with pytest.raises(ValueError, match=rf"{FORM_KEY} is {len(ENCODER_FORMS)}, not an --alibi-encoder form"):
        model.load_state_dict(state)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two epoch checkpoints of fairseq-train with --alibi-encoder split (the default before it was
    symmetric: what checkpoints of that time hold)."""
    from posenc_workflow import pipeline, toy_data

    root = tmp_path_factory.mktemp("alibi_checkpoints")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (200, 3, 8), "valid": (20, 3, 8)})
    data_bin = preprocess_here(prefixes, str(root / "bin"))
    save_dir = root / "checkpoints"
    flags = pipeline.toy_train_flags("alibi", max_update=100, size="tiny", max_tokens=500) + ["--alibi-encoder", "split"]
    pipeline.train(data_bin, str(save_dir), flags + ["--max-epoch", "2"])
    epochs = sorted(save_dir.glob("checkpoint[0-9]*.pt"))
    assert len(epochs) == 2
    return root, epochs


def _write_old(path, out):
    """The checkpoint as fairseq-train wrote it before --alibi-encoder: neither the stored form
    nor the flag in its arguments."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    state["model"] = old_layout(state["model"])
    model_cfg = state["cfg"]["model"]
    delattr(model_cfg, "alibi_encoder")  # an argparse Namespace: the model has add_args
    torch.save(state, out)
    return out


def _load(path):
    from fairseq import checkpoint_utils

    models, _ = checkpoint_utils.load_model_ensemble([str(path)])
    return models[0]


@pytest.mark.slow  # fairseq-train
def test_fairseq_refuses_old_checkpoints_in_one_line_and_loads_new_ones_as_trained(checkpoints):
    from posenc_workflow import pipeline

    root, epochs = checkpoints
    assert form_of(_load(epochs[-1])) == "split"
    old = _write_old(epochs[-1], root / "old.pt")
    proc = subprocess.run([pipeline.executable("fairseq-generate"), str(root / "bin"), "--user-dir",
                           pipeline.USER_DIR, "--path", str(old), "--cpu"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == f"fairseq-generate: error: {OLD_FORM}"
    assert "Traceback" not in proc.stderr


def _average(paths, output):
    from posenc_workflow import pipeline

    script = os.path.join(pipeline.SCRIPTS_DIR, "average_checkpoints.py")
    pipeline.run([sys.executable, script, "--inputs", *map(str, paths), "--output", str(output)], f"{output}.log")


@pytest.mark.slow  # fairseq-train
def test_averaged_checkpoints_keep_the_stored_form(checkpoints, tmp_path):
    root, epochs = checkpoints
    _average(epochs, tmp_path / "new.pt")
    averaged = torch.load(tmp_path / "new.pt", map_location="cpu", weights_only=False)["model"]
    # an integer buffer: taken from the newest checkpoint, not averaged into a float
    assert averaged[FORM_KEY].dtype == torch.int64 and averaged[FORM_KEY].item() == ENCODER_FORMS.index("split")
    assert form_of(_load(tmp_path / "new.pt")) == "split"


@pytest.mark.slow  # fairseq-train
def test_the_label_comes_from_the_stored_form_not_the_saved_configuration(checkpoints, tmp_path):
    """A split run resumed after the default flipped: its saved configuration says symmetric, its
    encoder_form buffer split; the model is split, and so is its label."""
    from fairseq_posenc.labels import checkpoint_label

    root, epochs = checkpoints
    state = torch.load(epochs[-1], map_location="cpu", weights_only=False)
    assert state["cfg"]["model"].alibi_encoder == "split"
    state["cfg"]["model"].alibi_encoder = "symmetric"
    torch.save(state, tmp_path / "rewritten.pt")
    assert form_of(_load(tmp_path / "rewritten.pt")) == "split"
    assert checkpoint_label(str(tmp_path / "rewritten.pt")) == "alibi (split)"
    # the workflow's label rule (recipes/rules/evaluate.smk) reads it from the checkpoint too
    os.rename(tmp_path / "rewritten.pt", tmp_path / "averaged_last1.pt")
    root_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    label = subprocess.run([sys.executable, "-m", "fairseq_posenc.labels", str(tmp_path / "averaged_last1.pt")],
                           capture_output=True, text=True, check=True, cwd=root_dir).stdout
    assert label == "alibi (split)\n"
    # and the study report (scripts/bleu_by_length.py) names a row by its checkpoint's label
    generation = tmp_path / "gen.txt"
    generation.write_text("".join(f"S-{i}\ta b c\nT-{i}\ta b c\nH-{i}\t-0.1\ta b c\n" for i in range(4)))
    scripts.script("bleu_by_length").main([
        "--generation", f"sinusoidal={generation}", f"alibi={generation}", "--checkpoint",
        f"alibi={tmp_path / 'averaged_last1.pt'}", "--bins", "1", "--bootstrap-samples", "40", "--out", str(tmp_path / "report")])
    import json

    assert list(json.loads((tmp_path / "report.json").read_text())["models"]) == ["sinusoidal", "alibi (split)"]


@pytest.mark.slow  # fairseq-train
def test_a_checkpoint_loads_as_saved_with_a_flag_its_encoding_ignores(checkpoints, tmp_path):
    """Checkpoints written while split was the default store ``alibi_encoder: split`` whatever
    their encoding; a flag the model ignores is refused when it trains, not when it loads."""
    from fairseq_posenc.compat import PosencError
    from fairseq_posenc.models.config import refuse_unused_flags

    root, epochs = checkpoints
    state = torch.load(epochs[-1], map_location="cpu", weights_only=False)
    state["cfg"]["model"].floater_dt = 0.2  # ignored by alibi, as split was by every other encoding
    with pytest.raises(PosencError, match="--floater-dt 0.2 would change nothing"):
        refuse_unused_flags(state["cfg"]["model"])
    torch.save(state, tmp_path / "ignored_flag.pt")
    assert form_of(_load(tmp_path / "ignored_flag.pt")) == "split"
