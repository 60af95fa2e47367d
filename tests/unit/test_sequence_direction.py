"""Reversing the whole source: which encodings can tell a sentence from its mirror image.

Self-attention without positions is equivariant to any permutation of its tokens, reversal
included. A position encoding that sees only the distance |i - j| keeps the equivariance to
reversal (ALiBi's symmetric encoder); every other encoding must break it, or the encoder could
not tell "a b c" from "c b a" except by the tokens that occur at one end.
"""
import pytest
import torch

from fairseq_posenc.positions import POSITION_ENCODINGS
from fairseq_posenc.positions.alibi import ENCODER_FORMS
from helpers.toy import TINY, build_model, toy_batch, with_strong_positions

LENGTH = 12  # tokens, end-of-sentence included: a sentence of the demo's training range

# Every encoding of the registry with its own defaults, and every ALiBi encoder form by name.
CASES = ([pytest.param(name, (), id=name) for name in POSITION_ENCODINGS]
         + [pytest.param("alibi", ("--alibi-encoder", form), id=f"alibi-{form}") for form in ENCODER_FORMS])

# The tolerance, from float32 rounding. With an equivariant encoder the reversed input runs the
# same arithmetic on the same values, except that a sum may add its terms in another order (the
# sums over keys run backwards, and a BLAS kernel may block a row differently where it sits
# elsewhere in the matrix). A sum of n terms is within (n - 1) eps sum|terms| of the exact one,
# so two orders differ by at most 2 (n - 1) eps relative to the magnitudes summed. The longest
# sums here are the FFN's second matmul (n = 64, its hidden size); each layer has two sublayers,
# and the LayerNorm after each brings the values back to the output's scale, so the errors of
# the 2 layers x 2 sublayers add: 4 x 2 x 63 x eps x max|output| = 6.0e-5 x max|output| (about
# 2e-4 here). Measured: 6e-7 (none) and 5e-7 (symmetric ALiBi).
FFN_HIDDEN = int(TINY[TINY.index("--encoder-ffn-embed-dim") + 1])
LAYERS = int(TINY[TINY.index("--encoder-layers") + 1])
ROUNDING = 2 * LAYERS * 2 * (FFN_HIDDEN - 1) * torch.finfo(torch.float32).eps
# A broken equivariance must stand clear of the rounding: 100 x the tolerance (about 2e-2).
# Measured with the toy's strong position parameters: 0.33 (rope) to 1.8 (split ALiBi).
MARGIN = 100


@pytest.mark.parametrize("encoding, flags", CASES)
@torch.no_grad()
def test_only_distance_only_encodings_encode_a_reversed_sentence_as_the_reversed_encoding(encoding, flags):
    model = with_strong_positions(build_model("transformer_posenc", "--position-encoding", encoding, *flags))
    src, lengths, _ = toy_batch(model.encoder.dictionary, [LENGTH])  # one sentence: no padding, eos last
    out = model.encoder(src, lengths)["encoder_out"][0][:, 0]  # (T, C)
    # the whole sequence reversed, eos first
    out_of_reversed = model.encoder(src.flip(1), lengths)["encoder_out"][0][:, 0]
    difference = (out_of_reversed.flip(0) - out).abs().max().item()
    tolerance = ROUNDING * out.abs().max().item()
    # as the encoder's scheme says: "none" is a bag of words, symmetric ALiBi (its default, the
    # published form) sees only distances, which reversal keeps; split and crossed do not
    if not model.encoder.position_encoding.tells_left_from_right:
        assert difference <= tolerance, f"{encoding} {flags}: {difference:.3g} > {tolerance:.3g}"
    else:
        assert difference > MARGIN * tolerance, f"{encoding} {flags}: only {difference:.3g}"


def test_the_cases_are_every_encoding_and_every_alibi_form():
    ids = {(p.values[0], p.values[1]) for p in CASES}
    assert ("alibi", ()) in ids and len(ids) == len(POSITION_ENCODINGS) + len(ENCODER_FORMS)
