"""Properties every position encoding must keep, asserted for each one."""
import argparse

import pytest
import torch
from fairseq.models import ARCH_CONFIG_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

from fairseq_posenc.positions import POSITION_ENCODINGS, get_position_encoding
from helpers.tolerances import assert_within, encoder_terms, float32_tolerance, magnitude, transformer_terms
from helpers.toy import build_model, full_log_probs, incremental_log_probs, toy_batch, with_strong_positions

# Derived from the registry and the schemes' own attributes, so that a new encoding (one file,
# one registry line) is covered by every property below without touching this file.
ENCODINGS = list(POSITION_ENCODINGS)
EXTRAPOLATING = [name for name, scheme in POSITION_ENCODINGS.items() if scheme.extrapolates]
LIMITED = [name for name, scheme in POSITION_ENCODINGS.items() if not scheme.extrapolates]
IN_ATTENTION = [name for name, scheme in POSITION_ENCODINGS.items() if scheme.input_embedding is None]


def model_for(encoding, *flags, max_positions=64):
    return with_strong_positions(
        build_model("transformer_posenc", "--position-encoding", encoding, *flags, max_positions=max_positions)
    )


def test_the_papers_encodings_are_registered_with_what_they_can_do():
    assert {"sinusoidal", "learned", "none", "diet_abs", "diet_rel", "shaw", "t5", "rope", "alibi",
            "floater"} <= set(ENCODINGS)
    # tables that end at --max-*-positions: fairseq's learned embedding and DIET-ABS's P_Q, P_K
    assert {"learned", "diet_abs"} <= set(LIMITED)
    assert not {"sinusoidal", "diet_rel", "shaw", "t5", "rope", "alibi", "floater"} & set(LIMITED)
    assert {"diet_abs", "diet_rel", "shaw", "t5", "rope", "alibi"} <= set(IN_ATTENTION)


def log_prob_tolerance(model, expected, source_len, target_len):
    """Two float32 evaluations of the model's log-probabilities (tests/helpers/tolerances.py)."""
    return float32_tolerance(transformer_terms(model, source_len, target_len), magnitude(expected, floor=1))


@pytest.mark.numerics
@pytest.mark.parametrize("encoding", ENCODINGS)
@torch.no_grad()
def test_incremental_decoding_matches_full_forward(encoding):
    model = model_for(encoding)
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=8)
    full = full_log_probs(model, src, lengths, prev)
    assert_within(incremental_log_probs(model, src, lengths, prev), full, log_prob_tolerance(model, full, 9, 8))


@pytest.mark.numerics
@pytest.mark.parametrize("encoding", ENCODINGS)
@torch.no_grad()
def test_beam_search_scores_equal_a_full_forward_of_each_hypothesis(encoding):
    """Beam search reorders the incremental state every step; if it got that wrong, the scores
    of the surviving hypotheses would not be those of the model."""
    model = model_for(encoding)
    dictionary = model.decoder.dictionary
    src, lengths, _ = toy_batch(dictionary, [9, 5, 7])
    generator = SequenceGenerator([model], dictionary, beam_size=4, max_len_b=12, min_len=5)
    hypotheses = generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    for b, beams in enumerate(hypotheses):
        assert len(beams) == 4
        for hyp in beams:
            tokens = hyp["tokens"][None]
            prev = torch.cat([tokens.new_tensor([[dictionary.eos()]]), tokens[:, :-1]], dim=1)
            lprobs = full_log_probs(model, src[b: b + 1], lengths[b: b + 1], prev)
            rescored = lprobs[0].gather(-1, tokens[0, :, None])[:, 0]
            # and the beam's running sum of them (up to the whole hypothesis' score), of which a
            # positional score is a difference: 2 more terms per step
            n = tokens.size(1)
            tolerance = (log_prob_tolerance(model, rescored, 9, n)
                         + float32_tolerance(2 * n, magnitude(hyp["positional_scores"].sum())))
            assert_within(hyp["positional_scores"], rescored, tolerance)


@pytest.mark.numerics
@pytest.mark.parametrize("encoding", ENCODINGS)
@torch.no_grad()
def test_padding_changes_nothing(encoding):
    model = model_for(encoding)
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=6)
    batch_enc = model.encoder(src, lengths)["encoder_out"][0]  # (T, B, C), left-padded
    batch_out = full_log_probs(model, src, lengths, prev)
    enc_tolerance = float32_tolerance(encoder_terms(model, 9), magnitude(batch_enc, floor=1))
    for b, n in enumerate(lengths.tolist()):
        alone = src[b: b + 1, -n:]
        assert_within(model.encoder(alone, lengths[b: b + 1])["encoder_out"][0][:, 0], batch_enc[-n:, b],
                      enc_tolerance, "encoder")
        assert_within(full_log_probs(model, alone, lengths[b: b + 1], prev[b: b + 1])[0], batch_out[b],
                      log_prob_tolerance(model, batch_out, 9, 6), "log-probabilities")


@pytest.mark.numerics
@pytest.mark.parametrize("encoding", EXTRAPOLATING)
@torch.no_grad()
def test_extrapolating_encodings_run_past_the_trained_length(encoding):
    model = model_for(encoding, max_positions=16)
    model.encoder.max_source_positions = model.decoder.max_target_positions = 64  # as --model-overrides
    src, lengths, prev = toy_batch(model.encoder.dictionary, [40, 33], tgt_len=30)
    out = full_log_probs(model, src, lengths, prev)
    assert out.shape == (2, 30, len(model.decoder.dictionary))
    assert torch.isfinite(out).all()
    assert_within(incremental_log_probs(model, src, lengths, prev), out, log_prob_tolerance(model, out, 40, 30))


@pytest.mark.parametrize("encoding", LIMITED)
@torch.no_grad()
def test_length_limited_encodings_stop_with_a_clear_error(encoding):
    model = model_for(encoding, max_positions=16)
    src, lengths, prev = toy_batch(model.encoder.dictionary, [20], tgt_len=5)
    with pytest.raises(ValueError, match=r"encoder input of length 20 exceeds the 16 positions .*--max-source-positions"):
        model(src, lengths, prev)
    src, lengths, prev = toy_batch(model.encoder.dictionary, [10], tgt_len=17)
    with pytest.raises(ValueError, match=r"decoder input of length 17 exceeds the 16 positions .*--max-target-positions"):
        model(src, lengths, prev)


@pytest.mark.numerics
@pytest.mark.parametrize("encoding", ENCODINGS)
@torch.no_grad()
def test_word_order_reaches_the_encoder_exactly_when_positions_are_encoded(encoding):
    model = model_for(encoding)
    src, lengths, _ = toy_batch(model.encoder.dictionary, [8], left_pad_source=False)
    body = src[:, :-1]  # keep eos last
    reordered = torch.cat([body.flip(1), src[:, -1:]], dim=1)
    out = model.encoder(src, lengths)["encoder_out"][0][:-1, 0]
    out_reordered = model.encoder(reordered, lengths)["encoder_out"][0][:-1, 0].flip(0)
    # the same sums over the keys in another order; an encoded order moves them by far more
    tolerance = float32_tolerance(encoder_terms(model, 8), magnitude(out, floor=1))
    assert tolerance < 1e-2
    if encoding == "none":  # a bag of words: the outputs just follow the tokens
        assert_within(out_reordered, out, tolerance)
    else:
        assert (out_reordered - out).abs().max() > 1e-2


@pytest.mark.parametrize("encoding", IN_ATTENTION)
def test_in_attention_encodings_drop_the_input_embedding_unless_asked(encoding):
    assert model_for(encoding).encoder.embed_positions is None
    kept = model_for(encoding, "--keep-input-positions")
    assert type(kept.encoder.embed_positions).__name__ == "SinusoidalPositionalEmbedding"
    assert type(kept.decoder.embed_positions).__name__ == "SinusoidalPositionalEmbedding"


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_named_architectures_for_each_encoding(encoding):
    for suffix, dim, heads in (("wmt_en_de", 512, 8), ("wmt_en_de_big", 1024, 16)):
        args = argparse.Namespace()
        ARCH_CONFIG_REGISTRY[f"transformer_{encoding}_{suffix}"](args)
        assert args.position_encoding == encoding
        assert (args.encoder_embed_dim, args.encoder_attention_heads, args.encoder_layers) == (dim, heads, 6)
    args = argparse.Namespace(position_encoding="t5")  # a flag given by the user wins
    ARCH_CONFIG_REGISTRY[f"transformer_{encoding}_wmt_en_de"](args)
    assert args.position_encoding == "t5"


def test_unknown_encoding_lists_the_choices():
    with pytest.raises(ValueError, match="unknown --position-encoding 'nope'; choose one of: sinusoidal, learned"):
        get_position_encoding("nope")


@pytest.mark.numerics
@pytest.mark.parametrize("encoding", ["sinusoidal", "rope", "shaw", "diet_abs", "t5"])
@torch.no_grad()
def test_fixed_head_size(encoding):
    model = model_for(encoding, "--attention-head-dim", "12")  # d=32, 4 heads -> 48 wide
    for attn in (model.encoder.layers[0].self_attn, model.decoder.layers[1].encoder_attn):
        assert attn.q_proj.weight.shape == (48, 32) and attn.k_proj.weight.shape == (48, 32)
        assert attn.out_proj.weight.shape == (32, 48)
        assert attn.scaling == pytest.approx(12 ** -0.5)
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5], tgt_len=6)
    full = full_log_probs(model, src, lengths, prev)
    assert_within(incremental_log_probs(model, src, lengths, prev), full, log_prob_tolerance(model, full, 9, 6))


def test_rope_refuses_an_odd_head_size():
    with pytest.raises(ValueError, match="rope needs an even head size, got 7; set --attention-head-dim"):
        build_model("transformer_posenc", "--position-encoding", "rope", "--attention-head-dim", "7")


@pytest.mark.parametrize("layers", [1, 6])
def test_shaw_tables_are_xavier_initialised_per_layer_whatever_the_depth(layers):
    model = build_model("transformer_posenc", "--position-encoding", "shaw", "--encoder-layers", str(layers))
    scheme = model.encoder.position_encoding
    offsets, dim = 2 * 16 + 1, 8
    bound = (6 / (offsets + dim)) ** 0.5  # Xavier on one layer's (2k + 1, head dim) table
    for table in (*scheme.rel_k, *scheme.rel_v):
        assert table.shape == (offsets, dim)
        # 264 uniform draws from [-bound, bound]: the largest is within 2% of the bound
        assert 0.9 * bound < table.abs().max().item() <= bound


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_state_dict_holds_the_parameters_and_the_intended_buffers_only(encoding):
    """Every checkpoint key besides the parameters is one meant to be saved: fairseq's versions, a
    scale or form in extra state, ALiBi's encoder form, FLOATER's kept solution. A buffer that
    only says where the module lives (``_placement``) stays out."""
    model = build_model("transformer_posenc", "--position-encoding", encoding)
    params = {name for name, _ in model.named_parameters()}
    extra = {key for key in model.state_dict() if key not in params}
    intended = {"version", "_extra_state", "encoder_form", "solution", "fingerprint"}
    assert {key for key in extra if key.rsplit(".", 1)[-1] not in intended} == set()
    assert not any("_placement" in key for key in model.state_dict())
