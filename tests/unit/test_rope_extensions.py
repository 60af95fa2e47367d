"""xPos and RoPE's decode-time scalings (NTK-aware, PI, YaRN) against values computed by hand from
the papers' equations; a step-by-step decode equals the full forward under each; the scalings are
refused at training in one line."""
import math
from types import SimpleNamespace

import pytest
import torch

from fairseq_posenc.compat import PosencError
from fairseq_posenc.models.checkpoint_settings import refuse_decode_only
from fairseq_posenc.positions.base import AttentionPositions
from fairseq_posenc.positions.rope_scaling import ntk_theta, yarn_attention_factor, yarn_frequencies
from helpers.toy import build_model, full_log_probs, incremental_log_probs, toy_batch, with_strong_positions

SCALINGS = [("--rope-ntk-factor", "4"), ("--rope-pi-factor", "4"), ("--rope-yarn-factor", "4")]


def test_xpos_rotates_and_scales_two_positions_as_the_paper_writes_it():
    """d = 4 (pairs (x0, x2), (x1, x3)), gamma 0.4, B 512, theta 10000: frequencies 1 and 1/100;
    zeta = (0 + 0.4)/1.4 = 2/7 and (1/2 + 0.4)/1.4 = 9/14. A query at n is R(n w_i) zeta_i^(n/512),
    a key at m is R(m w_i) zeta_i^(-m/512)."""
    model = build_model("transformer_posenc", "--position-encoding", "xpos", "--attention-head-dim", "4",
                        from_checkpoint=True)
    scheme = model.decoder.position_encoding
    x = torch.tensor([1.0, 2.0, 3.0, 4.0]).double().expand(1, 1, 2, 4).contiguous()
    with torch.no_grad():
        q, k, _ = scheme.transform_qkv(0, "self", x, x, x, AttentionPositions.build(2, 2, None, "cpu"))
    expected_q, expected_k = torch.zeros(2, 4, dtype=torch.float64), torch.zeros(2, 4, dtype=torch.float64)
    for n in (0, 1):
        for i, (w, zeta) in enumerate(((1.0, 2 / 7), (0.01, 9 / 14))):
            a, b = x[0, 0, n, i].item(), x[0, 0, n, i + 2].item()
            c, s = math.cos(n * w), math.sin(n * w)
            rotated = (a * c - b * s, a * s + b * c)
            for out, sign in ((expected_q, 1), (expected_k, -1)):
                out[n, i], out[n, i + 2] = (v * zeta ** (sign * n / 512) for v in rotated)
    assert torch.allclose(q[0, 0], expected_q, rtol=1e-12, atol=0)
    assert torch.allclose(k[0, 0], expected_k, rtol=1e-12, atol=0)


def test_xpos_encoder_rope_form_rotates_only():
    model = build_model("transformer_posenc", "--position-encoding", "xpos", "--xpos-encoder", "rope")
    assert not model.encoder.position_encoding.scaled and model.decoder.position_encoding.scaled


def test_the_ntk_base_is_theta_times_s_to_the_d_over_d_minus_2():
    assert ntk_theta(10000.0, 4, 4.0) == pytest.approx(10000 * 4 ** 2, rel=1e-15)  # d/(d-2) = 2
    assert ntk_theta(10000.0, 64, 8.0) == pytest.approx(10000 * 8 ** (64 / 62), rel=1e-15)


def _angles(*flags, n=3, dim=4):
    model = build_model("transformer_posenc", "--position-encoding", "rope", "--attention-head-dim", str(dim),
                        *flags, from_checkpoint=True)
    return model.encoder.position_encoding.rotation_table(n, "cpu", torch.float64, 8)


def test_pi_positions_are_divided_by_s():
    """PI, S = 4: position m rotates by (m / 4) theta_i: cos of (m/4) x 1 and (m/4) x 0.01."""
    table = _angles("--rope-pi-factor", "4")
    for m in range(3):
        assert table[0, m, 0].item() == pytest.approx(math.cos(m / 4), rel=1e-15)
        assert table[0, m, 1].item() == pytest.approx(math.cos(m / 4 * 0.01), rel=1e-15)


def test_ntk_rotates_by_the_scaled_base():
    table = _angles("--rope-ntk-factor", "4")  # base 160000: frequencies 1, 1/400
    assert table[0, 2, 1].item() == pytest.approx(math.cos(2 / 400), rel=1e-15)


def test_yarn_interpolates_each_dimension_by_its_ramp_and_scales_by_the_temperature():
    """d = 4, theta 10000, L = 8, S = 4: wavelengths 2 pi and 200 pi; r = 8 / (2 pi) = 1.273 (ramp
    (1.273 - 1) / 31 = 0.00881) and 8 / (200 pi) = 0.0127 (ramp 0: fully interpolated, / 4);
    sqrt(1/t) = 0.1 ln 4 + 1 = 1.1386 on q and k."""
    g = (8 / (2 * math.pi) - 1) / 31
    expected = torch.tensor([((1 - g) / 4 + g) * 1.0, 0.01 / 4], dtype=torch.float64)
    assert torch.allclose(yarn_frequencies(4, 10000.0, 4.0, 8), expected, rtol=1e-14, atol=0)
    assert yarn_attention_factor(4.0) == pytest.approx(0.1 * math.log(4) + 1, rel=1e-15) == pytest.approx(1.138629, 1e-6)
    table = _angles("--rope-yarn-factor", "4")
    assert table[0, 2, 0].item() == pytest.approx(math.cos(2 * expected[0].item()) * 1.138629436, rel=1e-9)
    assert table[0, 2, 1].item() == pytest.approx(math.cos(2 * 0.0025) * 1.138629436, rel=1e-9)


@pytest.mark.parametrize("flags", [["--position-encoding", "xpos"], ["--position-encoding", "xpos", "--xpos-encoder",
                                   "rope"]] + [["--position-encoding", "rope", *s] for s in SCALINGS],
                         ids=["xpos", "xpos-encoder-rope", "ntk", "pi", "yarn"])
def test_a_step_by_step_decode_equals_the_full_forward(flags):
    model = with_strong_positions(build_model("transformer_posenc", *flags, from_checkpoint=True)).eval()
    batch = toy_batch(model.encoder.dictionary, [7, 4], tgt_len=9)
    with torch.no_grad():
        full, steps = full_log_probs(model, *batch), incremental_log_probs(model, *batch)
    assert torch.allclose(full, steps, rtol=0, atol=1e-5)


@pytest.mark.parametrize("flag", [s[0] for s in SCALINGS])
def test_a_training_run_refuses_a_decode_only_scaling_in_one_line(flag):
    args = SimpleNamespace(**{flag[2:].replace("-", "_"): 2.0})
    with pytest.raises(PosencError) as refused:
        refuse_decode_only(args)
    assert str(refused.value) == (f"{flag} 2 is applied at decoding only: train without it, then give it to "
                                  "fairseq-generate's --model-overrides")


def test_two_scalings_at_once_and_rope_flags_on_xpos_are_refused_in_one_line():
    with pytest.raises(PosencError) as two:
        build_model("transformer_posenc", "--position-encoding", "rope", "--rope-ntk-factor", "2",
                    "--rope-pi-factor", "2", from_checkpoint=True)
    assert str(two.value) == "--rope-ntk-factor 2 and --rope-pi-factor 2: rope takes one scaling at a time; give one of them"
    with pytest.raises(PosencError) as xpos:
        build_model("transformer_posenc", "--position-encoding", "xpos", "--rope-yarn-factor", "2", from_checkpoint=True)
    assert str(xpos.value).startswith("--rope-yarn-factor 2.0: xpos takes none of rope's flags")


def test_xpos_bounds_are_where_its_factors_leave_float32s_normal_range():
    """(P - 1)/B ln((1 + gamma)/gamma) <= 126 ln 2: B >= 1023 ln 3.5 / (126 ln 2) = 14.674 at 1024
    positions; at the bound the last key's factor is a normal float32 number, at half of it inf."""
    from argparse import Namespace

    from fairseq_posenc.positions.float_bounds import xpos_gamma_low, xpos_scale_base_low
    from fairseq_posenc.positions.xpos import xpos_factors

    args = Namespace(max_source_positions=1024, max_target_positions=1024, xpos_gamma=0.4, xpos_scale_base=512.0)
    low = xpos_scale_base_low(args)
    assert low == pytest.approx(1023 * math.log(3.5) / (126 * math.log(2)), rel=1e-12) == pytest.approx(14.674, 1e-4)
    at, below = (xpos_factors(torch.tensor([1023]), 4, 0.4, b, torch.float32) for b in (low * 1.0001, low / 2))
    assert torch.isfinite(at).all() and at.min() >= torch.finfo(torch.float32).tiny
    assert torch.isinf(below).any()
    gamma = xpos_gamma_low(Namespace(max_source_positions=1024, max_target_positions=1024, xpos_scale_base=14.0))
    assert gamma == pytest.approx(1 / math.expm1(126 * math.log(2) * 14 / 1023), rel=1e-12)
    with pytest.raises(PosencError) as refused:
        build_model("transformer_posenc", "--position-encoding", "xpos", "--xpos-scale-base", "0.5")
    assert str(refused.value) == ("--xpos-scale-base must be a finite number > 0.903677 (below it, at this --xpos-gamma, "
                                  "the factors leave float32's normal range at the last position), got 0.5")  # 63 positions


def test_yarn_reads_its_trained_length_from_the_weights_once_a_decode():
    """L: the stack's longest trained input (its weights carry it); a model never trained: its maximum."""
    model = build_model("transformer_posenc", "--position-encoding", "rope", "--rope-yarn-factor", "4",
                        from_checkpoint=True).eval()
    scheme, tokens = model.encoder.position_encoding, torch.ones(1, 3, dtype=torch.long)
    scheme.begin_forward(tokens)
    assert scheme._yarn_length == 64  # untrained: --max-source-positions of the toy
    model.encoder.longest_trained.fill_(9)
    scheme.begin_forward(tokens, continues=True)  # a later step keeps its first step's
    assert scheme._yarn_length == 64
    scheme.begin_forward(tokens)
    assert scheme._yarn_length == 9
