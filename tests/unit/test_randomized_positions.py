"""--randomized-positions (Ruoss et al., 2023; positions/randomized.py): the sample's range and order,
its seeding, evaluation's positions, the values at the sampled positions by hand, and the encodings
that take it or refuse it (derived from their ``config``, not listed)."""
import argparse
import dataclasses
import math

import pytest
import torch

from fairseq_posenc.compat import PosencError
from fairseq_posenc.labels import model_label
from fairseq_posenc.models.checkpoint_settings import DECODE, refuse_other_settings, saved_model_args
from fairseq_posenc.positions import POSITION_ENCODINGS
from fairseq_posenc.positions.randomized import PAPER_MAX_POSITION, RandomizedConfig, draw
from fairseq_posenc.positions.rope import rope_angles
from helpers.toy import build_model, full_log_probs, incremental_log_probs, model_args, toy_batch, with_strong_positions

TAKERS = [name for name, scheme in POSITION_ENCODINGS.items()
          if scheme.config is not None and issubclass(scheme.config, RandomizedConfig)]
OTHERS = [name for name in POSITION_ENCODINGS if name not in TAKERS]
PAD = 1


def _real(drawn_row):
    return [int(p) for p in drawn_row if p >= 0]


def test_the_encodings_that_read_absolute_positions_take_it_and_the_default_range_is_the_papers():
    assert TAKERS == ["sinusoidal", "learned", "rope"]
    assert PAPER_MAX_POSITION == 2048  # the paper's L, its reference code's noise_max_length


def test_a_sample_is_sorted_distinct_and_within_the_range_one_per_real_token():
    tokens = torch.tensor([[PAD, PAD, PAD, 5, 6, 2], [4, 5, 6, 7, 8, 2], [PAD] * 5 + [2]])
    drawn = draw(tokens, PAD, 16, seed=1, step=0, side="encoder")
    assert drawn[0, :3].tolist() == [-1, -1, -1] and drawn[2, :5].tolist() == [-1] * 5
    for row, n in zip(drawn, (3, 6, 1)):
        real = _real(row)
        assert len(real) == n and all(0 <= p < 16 for p in real)
        assert all(a < b for a, b in zip(real, real[1:]))  # sorted, distinct


def test_the_whole_range_is_drawn_for_a_sentence_as_long_as_it():
    assert _real(draw(torch.arange(4, 20)[None], PAD, 16, seed=3, step=5, side="decoder")[0]) == list(range(16))


def test_a_sentence_longer_than_the_range_is_refused_in_one_line():
    with pytest.raises(PosencError, match=r"^encoder input of length 5 exceeds the 4 positions that "
                                          r"--randomized-max-position draws from; raise it$"):
        draw(torch.arange(4, 9)[None], PAD, 4, seed=1, step=0, side="encoder")


def test_a_sentences_sample_depends_on_the_seed_update_and_side_not_on_its_batch_or_padding():
    """What makes two processes train as one: each sentence's draw is its own."""
    alone = torch.tensor([[7, 8, 9, 2]])
    batch = torch.tensor([[PAD, PAD, 7, 8, 9, 2], [4, 5, 6, 7, 8, 2]])
    first = _real(draw(alone, PAD, 2048, 1, 0, "encoder")[0])
    assert _real(draw(batch, PAD, 2048, 1, 0, "encoder")[0]) == first
    assert _real(draw(alone, PAD, 2048, 1, 0, "encoder")[0]) == first  # reproducible
    for other in [(2, 0, "encoder"), (1, 1, "encoder"), (1, 0, "decoder")]:
        assert _real(draw(alone, PAD, 2048, *other)[0]) != first, other
    assert _real(draw(batch, PAD, 2048, 1, 0, "encoder")[1]) != first  # another sentence


def test_a_sample_is_uniform_the_smallest_position_has_its_expected_mean():
    """The n smallest of L hashed keys are a uniform n-subset: its minimum has mean (L - n) / (n + 1)."""
    n, L, sentences = 9, 2048, 4000
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 1000, (sentences, n), generator=g)
    smallest = draw(tokens, PAD, L, 1, 0, "encoder")[:, 0].double()
    expected = (L - n) / (n + 1)  # 203.9
    sd = math.sqrt(n * (L + 1) * (L - n) / ((n + 1) ** 2 * (n + 2)))
    assert abs(smallest.mean().item() - expected) < 4 * sd / math.sqrt(sentences)


def _model(encoding, *flags):
    return with_strong_positions(build_model("transformer_posenc", "--position-encoding", encoding,
                                             "--randomized-positions", *flags))


def test_the_sinusoids_at_the_sampled_positions_by_hand():
    """Encoder input embedding at real token k: fairseq's row pad + 1 + p_k, [sin(r w_i), cos(r w_i)],
    w_i = 10000^(-i / (h - 1)), h = d / 2; in training and (the encoder) in evaluation."""
    model = _model("sinusoidal").train()
    src = torch.tensor([[PAD, 9, 10, 11, 2]])
    for mode in (model.train, model.eval):
        mode()
        model.encoder.position_encoding.begin_forward(src)
        got = model.encoder.embed_positions(src)[0]
        sample = _real(model.encoder.position_encoding._drawn[0])
        d, h = 32, 16
        for column, p in zip(range(1, 5), sample):
            r = PAD + 1 + p
            row = [math.sin(r * 10000 ** (-i / (h - 1))) for i in range(h)] + \
                  [math.cos(r * 10000 ** (-i / (h - 1))) for i in range(h)]
            assert got[column].tolist() == pytest.approx(row, abs=2e-4), (mode, p)
        assert got[0].abs().sum() == 0  # the pad's row
    assert sample != [0, 1, 2, 3]


def test_rope_rotates_by_the_sampled_positions_by_hand():
    model = _model("rope").train()
    scheme = model.encoder.position_encoding
    src = torch.tensor([[4, 5, 6, 2]])
    scheme.begin_forward(src)
    sample = _real(scheme._drawn[0])
    q = torch.randn(1, 4, 4, 8)
    from fairseq_posenc.positions.base import AttentionPositions
    rotated, _, _ = scheme.transform_qkv(0, "self", q, q, q, AttentionPositions.build(4, 4, None, "cpu"))
    for t, p in enumerate(sample):
        for i in range(4):
            angle = p * 10000 ** (-2 * i / 8)
            x, y = q[0, 0, t, i].item(), q[0, 0, t, i + 4].item()
            assert rotated[0, 0, t, i].item() == pytest.approx(x * math.cos(angle) - y * math.sin(angle), abs=1e-4)
            assert rotated[0, 0, t, i + 4].item() == pytest.approx(y * math.cos(angle) + x * math.sin(angle), abs=1e-4)
    assert rope_angles(torch.tensor(sample), 8).shape == (4, 8)


@pytest.mark.parametrize("encoding", TAKERS)
def test_evaluation_draws_in_the_encoder_one_fixed_stream_and_the_decoder_reads_0_to_n_minus_1(encoding):
    """The encoder draws in training and evaluation (the paper's encoders); the decoder reads 0 .. n-1
    in both, unless --randomized-decoder has it draw in training."""
    for variant in ([], ["--randomized-decoder"]):
        model = _model(encoding, *variant)
        src, _, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=8)
        enc, dec = model.encoder.position_encoding, model.decoder.position_encoding
        enc.begin_forward(src)
        first = enc._drawn.clone()
        model.encoder.position_encoding.randomized.start_update(50)  # evaluation ignores the update
        enc.begin_forward(src)
        assert torch.equal(enc._drawn, first) and not torch.equal(first.clamp(min=0), torch.arange(9).expand(3, 9))
        dec.begin_forward(prev)
        assert dec._drawn is None
        model.train()
        dec.begin_forward(prev)
        if variant:
            assert dec._drawn is not None and _real(dec._drawn[0]) != list(range(8))
        else:
            assert dec.randomized is None and dec._drawn is None
        enc.begin_forward(src)
        assert not torch.equal(enc._drawn, first)  # training's stream, update 50


@pytest.mark.numerics
@pytest.mark.parametrize("blocks", ["input", "all"])
@pytest.mark.parametrize("encoding", TAKERS)
@pytest.mark.parametrize("decoder", [[], ["--randomized-decoder"]])
@torch.no_grad()
def test_incremental_decoding_matches_the_full_forward_in_evaluation(encoding, blocks, decoder):
    if blocks == "all" and POSITION_ENCODINGS[encoding].default_blocks is None:
        pytest.skip("no position encoder to place at every block")
    model = _model(encoding, *(["--position-blocks", "all"] if blocks == "all" else []), *decoder)
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=8)
    full = full_log_probs(model, src, lengths, prev)
    torch.testing.assert_close(incremental_log_probs(model, src, lengths, prev), full, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(full, full_log_probs(model.train().eval(), src, lengths, prev.flip(1)))


@pytest.mark.parametrize("encoding", TAKERS)
def test_training_reads_the_sample_and_evaluation_the_paper_forms(encoding):
    """The training forward differs from evaluation's: other positions (dropout off)."""
    model = _model(encoding, "--dropout", "0")
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=8)
    with torch.no_grad():
        evaluation = full_log_probs(model, src, lengths, prev)
        training = full_log_probs(model.train(), src, lengths, prev)
    model.eval()
    assert not torch.allclose(training, evaluation)


def test_a_learned_table_covers_the_range():
    """(L - max positions) x d more parameters per randomized table: (2048 - 64) x 32 here, the
    encoder's (and the decoder's with --randomized-decoder)."""
    plain = build_model("transformer_posenc", "--position-encoding", "learned")
    for variant, stacks in (([], 1), (["--randomized-decoder"], 2)):
        model = build_model("transformer_posenc", "--position-encoding", "learned", "--randomized-positions", *variant)
        assert model.encoder.embed_positions.weight.shape == (2048 + PAD + 1, 32)
        assert model.decoder.embed_positions.weight.shape == ((2048 if variant else 64) + PAD + 1, 32)
        added = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in plain.parameters())
        assert added == stacks * (2048 - 64) * 32
    assert model.encoder.max_positions() == 64  # fairseq still filters at --max-source-positions
    blocks = build_model("transformer_posenc", "--position-encoding", "learned", "--randomized-positions",
                         "--position-blocks", "all", "--randomized-max-position", "128")
    assert [t.weight.shape[0] for t in blocks.encoder.position_encoding.block_tables] == [128 + PAD + 1]


@pytest.mark.parametrize("encoding", OTHERS)
def test_encodings_that_cannot_take_it_refuse_it_in_one_line(encoding):
    with pytest.raises(PosencError, match=rf"^--randomized-positions would change nothing: --position-encoding "
                                          rf"{encoding} does not use it \(it is for --position-encoding sinusoidal "
                                          rf"or learned or rope\)$"):
        build_model("transformer_posenc", "--position-encoding", encoding, "--randomized-positions")


def test_a_range_without_randomized_positions_and_a_range_shorter_than_the_inputs_are_refused():
    with pytest.raises(PosencError, match=r"^--randomized-max-position 4096 would change nothing: --position-encoding "
                                          r"sinusoidal without --randomized-positions does not use it \(it is for "
                                          r"--position-encoding sinusoidal or learned or rope\)$"):
        build_model("transformer_posenc", "--randomized-max-position", "4096")
    with pytest.raises(PosencError, match=r"^--randomized-max-position must be from 64 to 65536 \(L holds the "
                                          r"longest input .*, got 63$"):
        build_model("transformer_posenc", "--randomized-positions", "--randomized-max-position", "63")


def test_the_label_says_the_positions_are_randomized():
    assert model_label(_model("rope")) == "rope (randomized positions)"
    assert model_label(_model("rope", "--randomized-decoder")) == "rope (randomized positions, decoder too)"
    with pytest.raises(PosencError, match=r"^--randomized-decoder would change nothing: --position-encoding "
                                          r"sinusoidal without --randomized-positions does not use it"):
        build_model("transformer_posenc", "--randomized-decoder")
    assert model_label(_model("sinusoidal", "--randomized-max-position", "4096")) == \
        "sinusoidal (randomized positions, randomized L 4096)"


@pytest.mark.parametrize("given, saved", [([], ["--randomized-positions"]), (["--randomized-positions"], [])])
def test_decoding_a_randomized_model_without_the_option_or_the_reverse_is_refused(given, saved):
    """The paper samples at evaluation too: without the option the encoder reads other positions, another model."""
    model = build_model("transformer_posenc", "--position-encoding", "sinusoidal", *given)
    trained = argparse.Namespace(**vars(model_args("transformer_posenc", "--position-encoding", "sinusoidal", *saved)))
    with pytest.raises(PosencError, match=r"^ckpt.pt was trained with --position-encoding sinusoidal "
                                          r"(no )?--randomized-positions; this decode gives"):
        refuse_other_settings(trained, model, "ckpt.pt", DECODE)


def test_a_checkpoint_saved_before_the_decoder_flag_counts_as_trained_with_it():
    """Its decoder drew in training (the form before --randomized-decoder): it resumes or decodes
    with the flag, and without it is refused naming both."""
    saved = vars(model_args("transformer_posenc", "--position-encoding", "rope", "--randomized-positions"))
    del saved["randomized_decoder"]
    old = saved_model_args({"cfg": {"model": argparse.Namespace(**saved)}})  # as a loader reads it
    with pytest.raises(PosencError, match=r"^ckpt.pt was trained with --position-encoding rope --randomized-decoder; "
                                          r"this decode gives --position-encoding rope no --randomized-decoder: "):
        refuse_other_settings(old, _model("rope"), "ckpt.pt", DECODE)
    assert refuse_other_settings(old, _model("rope", "--randomized-decoder"), "ckpt.pt", DECODE) == []
