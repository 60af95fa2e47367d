"""Inputs longer than the tables kept for decoding start (``MIN_TABLE`` = 64 positions), and
decoding step by step in half precision.

While decoding, ``PositionEncoding.table`` keeps a table and doubles it when a longer input comes
(64 -> 128 -> 256): step-by-step decoding of 150 tokens must give what one full forward gives on
a copy of the model that builds its table once, at the full length. The encodings are those
that extrapolate, taken from the registry; the table-bound ones stop at --max-*-positions
(tests/fairseq/test_bad_input.py)."""
import copy

import pytest
import torch

from fairseq_posenc.positions import POSITION_ENCODINGS
from fairseq_posenc.positions.base import MIN_TABLE
from helpers.tolerances import assert_within, float32_tolerance, magnitude, transformer_terms
from helpers.toy import build_model, full_log_probs, incremental_log_probs, toy_batch, with_strong_positions

EXTRAPOLATING = [name for name, scheme in POSITION_ENCODINGS.items() if scheme.extrapolates]
STEPS = 150  # past MIN_TABLE twice: the kept tables grow 64 -> 128 -> 256


def _model(encoding, max_positions=64):
    return with_strong_positions(
        build_model("transformer_posenc", "--position-encoding", encoding, max_positions=max_positions)
    )


def _kept_sizes(scheme):
    return {name: size for name, (_, size) in scheme._tables.items()}


def test_the_schemes_with_kept_tables_are_among_those_tested():
    assert {"rope", "alibi", "t5", "diet_rel"} <= set(EXTRAPOLATING)
    assert MIN_TABLE == 64 < STEPS


@pytest.mark.numerics
@pytest.mark.parametrize("encoding", EXTRAPOLATING)
@torch.no_grad()
def test_decoding_past_the_kept_table_equals_a_full_forward(encoding):
    model = _model(encoding)  # built for 64 positions: these encodings go past that
    fresh = copy.deepcopy(model)  # its tables are built once, at the full length
    dictionary = model.encoder.dictionary
    src, lengths, prev = toy_batch(dictionary, [100, 70], tgt_len=STEPS)

    encoder_out = model.encoder(src, lengths)
    decoder = model.decoder.position_encoding
    state, steps, sizes = {}, [], []
    for t in range(STEPS):
        out, _ = model.decoder(prev[:, : t + 1], encoder_out, incremental_state=state)
        steps.append(model.get_normalized_probs((out, None), log_probs=True))
        sizes.append(_kept_sizes(decoder))
    incremental = torch.cat(steps, dim=1)

    full = full_log_probs(fresh, src, lengths, prev)
    tolerance = float32_tolerance(transformer_terms(model, 100, STEPS), magnitude(full, floor=1))
    assert_within(incremental, full, tolerance)
    if encoding in ("rope", "alibi", "t5", "diet_rel") or sizes[-1]:
        assert sizes[-1], f"{encoding} keeps no table while decoding"
        # every table it keeps doubled from MIN_TABLE as the input grew past it, twice
        for name in sizes[-1]:
            grown = sorted({s[name] for s in sizes if name in s})
            assert grown == [MIN_TABLE, 2 * MIN_TABLE, 4 * MIN_TABLE], (name, grown)
            assert sizes[MIN_TABLE - 1][name] == MIN_TABLE and sizes[MIN_TABLE][name] == 2 * MIN_TABLE
        # the encoder's tables cover its 100 positions at once
        assert set(_kept_sizes(model.encoder.position_encoding).values()) == {100}


def _cpu_supports(dtype):
    try:
        torch.ones(2, 2, dtype=dtype) @ torch.ones(2, 2, dtype=dtype)
        return True
    except RuntimeError:
        return False


# The whole network runs in half precision (fairseq takes the log-softmax in float32): bfloat16
# keeps 8 bits of mantissa, float16 11. Step-by-step decoding computes one row at a time, so its
# rounding differs from a full forward's. Counted as in tests/helpers/tolerances.py, some 70 roundings of
# half precision in a row bound the log-probabilities to no better than +-5 in bfloat16, which
# would pass anything. So both are held to the same model in float64 (the same half-precision
# parameter values, exactly; its log-probabilities exact to 3e-5, as fairseq's log-softmax is
# float32 even there): step-by-step decoding must be as accurate as the full forward, whatever
# the CPU's half-precision kernels. On average over the 3 x 20 x 34 log-probabilities, within
# half the full forward's mean error (measured 0.93-1.06 times it: a stable statistic); and
# everywhere within 3 times the full forward's largest error, a statistic of a few logits each
# rounded across a half-precision step (measured 0.7-1.9 times it, over every encoding, seeds
# 0-9, both kernel sets; log-probabilities in [-8.3, -0.7], full forward errors up to 0.04 in
# bfloat16 and 0.005 in float16). A wrong step moves a whole row of 34 by far more.
NO_FP16 = pytest.mark.skipif(not _cpu_supports(torch.float16), reason="no float16 matmul on this CPU")
HALF = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16", marks=NO_FP16)]


@pytest.mark.numerics
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("encoding", list(POSITION_ENCODINGS))
@torch.no_grad()
def test_half_precision_decoding_step_by_step_equals_its_full_forward(encoding, dtype):
    model = _model(encoding).to(dtype)
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=20)
    incremental = incremental_log_probs(model, src, lengths, prev)
    full = full_log_probs(model, src, lengths, prev)
    assert {p.dtype for p in model.parameters()} == {dtype}
    exact = full_log_probs(copy.deepcopy(model).double(), src, lengths, prev).double()
    full_error, incremental_error = (full.double() - exact).abs(), (incremental.double() - exact).abs()
    print(f"{encoding} {dtype}: |full - exact| mean {full_error.mean():.2e} max {full_error.max():.2e}, "
          f"|incremental - exact| mean {incremental_error.mean():.2e} max {incremental_error.max():.2e}")
    mean = full_error.mean()
    assert_within(incremental_error.mean(), mean, 0.5 * mean.item(), "mean error against the full forward's")
    assert_within(incremental.double(), exact, 3 * full_error.max().item(), "incremental against exact")
