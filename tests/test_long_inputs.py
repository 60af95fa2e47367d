"""Inputs longer than the tables kept for decoding start (``MIN_TABLE`` = 64 positions), and
decoding step by step in half precision.

While decoding, ``PositionEncoding.table`` keeps a table and doubles it when a longer input comes
(64 -> 128 -> 256): step-by-step decoding of 150 tokens must give what one full forward gives on
a copy of the model that builds its table once, at the full length. The encodings are those
that extrapolate, taken from the registry; the table-bound ones stop at --max-*-positions
(tests/test_bad_input.py)."""
import copy

import pytest
import torch

from fairseq_posenc.positions import POSITION_ENCODINGS
from fairseq_posenc.positions.base import MIN_TABLE
from toy import build_model, full_log_probs, incremental_log_probs, toy_batch, with_strong_positions

EXTRAPOLATING = [name for name, scheme in POSITION_ENCODINGS.items() if scheme.extrapolates]
STEPS = 150  # past MIN_TABLE twice: the kept tables grow 64 -> 128 -> 256


def _model(encoding, max_positions=64):
    return with_strong_positions(
        build_model("transformer_posenc", "--position-encoding", encoding, max_positions=max_positions)
    )


def _kept_sizes(scheme):
    return {name: size for name, (_, _, size) in scheme._tables.items()}


def test_the_schemes_with_kept_tables_are_among_those_tested():
    assert {"rope", "alibi", "t5", "diet_rel"} <= set(EXTRAPOLATING)
    assert MIN_TABLE == 64 < STEPS


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

    # measured: max |difference| 1.2e-6 (FLOATER) and 1.4e-6 (the others), float32
    torch.testing.assert_close(incremental, full_log_probs(fresh, src, lengths, prev), atol=1e-5, rtol=1e-5)
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
# rounding differs from a full forward's. Measured over every encoding and three batches (seeds
# 0-2), log-probabilities in [-8.3, -0.7]: max |difference| 0.039 in bfloat16, 0.0048 in float16
# (means 0.005 and 0.0007); the tolerances leave 2.5x and 3x of that.
NO_FP16 = pytest.mark.skipif(not _cpu_supports(torch.float16), reason="no float16 matmul on this CPU")
HALF = [pytest.param(torch.bfloat16, 0.1, id="bf16"), pytest.param(torch.float16, 0.015, id="fp16", marks=NO_FP16)]


@pytest.mark.parametrize("dtype,tolerance", HALF)
@pytest.mark.parametrize("encoding", list(POSITION_ENCODINGS))
@torch.no_grad()
def test_half_precision_decoding_step_by_step_equals_its_full_forward(encoding, dtype, tolerance):
    model = _model(encoding).to(dtype)
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=20)
    incremental = incremental_log_probs(model, src, lengths, prev)
    full = full_log_probs(model, src, lengths, prev)
    assert {p.dtype for p in model.parameters()} == {dtype}
    difference = (incremental.float() - full.float()).abs().max().item()
    print(f"{encoding} {dtype}: max |incremental - full| {difference:.2e}")
    assert difference < tolerance
