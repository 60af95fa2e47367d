"""fairseq_posenc/positions/float_bounds.py: each bound against numbers derived by hand, and against
the computation it guards, in float32 or in the model as built (issue 53)."""
import argparse
import math

import pytest
import torch

from fairseq_posenc.compat import PosencError
from fairseq_posenc.positions import float_bounds
from fairseq_posenc.positions.float_bounds import (NORMAL_DRAW_MAX, attention_head_dim_high, floater_dt_range,
                                                   floater_lr_scale_low, floater_solved_positions, floater_step_range,
                                                   max_relative_distance_high, position_bias_scale_range,
                                                   position_bias_scale_stds, rope_theta_low)
from fairseq_posenc.positions.floater.dynamics import Dynamics
from fairseq_posenc.positions.rope import rope_angles
from helpers.toy import build_model, model_args


def _args(head_dim, positions):
    return argparse.Namespace(attention_head_dim=head_dim, max_source_positions=positions,
                              max_target_positions=positions)


def test_the_rope_theta_bound_is_where_the_last_angle_overflows_float32():
    # head size 64, 1025 positions: (1024 / max32)^(64/62), max32 = 2^128 (1 - 2^-24): about
    # (2^-118)^(32/31) = 2^(-118 * 32 / 31); the ulp factors move it by less than 1e-6
    assert rope_theta_low(_args(64, 1025)) == pytest.approx(2 ** (-118 * 32 / 31), rel=1e-6)
    # fairseq's defaults: head size 512 / 8 = 64, 1024 positions
    assert rope_theta_low(argparse.Namespace()) == pytest.approx((1023 / 2 ** 128) ** (32 / 31), rel=1e-6)
    # head size 4: (2^-118)^2 is below float32's normal numbers, the floor 2^-126 is the bound; head
    # size 2: no angle depends on theta
    assert rope_theta_low(_args(4, 1025)) == rope_theta_low(_args(2, 1025)) == 2.0 ** -126
    # the computation: finite at the bound, overflowing at half of it
    theta = rope_theta_low(_args(64, 1025))
    assert torch.isfinite(rope_angles(torch.arange(1025), 64, theta)).all()
    assert torch.isinf(rope_angles(torch.arange(1025), 64, theta / 2)).any()


def test_a_rope_theta_below_the_bound_is_refused_in_one_line():
    with pytest.raises(PosencError) as refused:
        build_model("transformer_posenc", "--position-encoding", "rope", "--rope-theta", "1e-300")
    assert str(refused.value).startswith("--rope-theta must be a finite number >= ")
    assert str(refused.value).endswith(" (below it the last position's rotation angles overflow float32), got 1e-300")


def test_the_floater_lr_scale_bound_is_float32s_smallest_normal_number():
    assert floater_lr_scale_low(argparse.Namespace()) == 2.0 ** -126
    # the computation: V = W / C finite at the bound (W, nn.Linear's, at most 1), W = C V exactly (C
    # a power of 2); 1e-300 is 0 in float32 and V infinite
    torch.manual_seed(0)
    reference = Dynamics(8, 16)
    torch.manual_seed(0)
    scaled = Dynamics(8, 16, lr_scale=2.0 ** -126)
    for w, v in zip(reference.parameters(), scaled.parameters()):
        assert torch.isfinite(v).all() and torch.equal(v * 2.0 ** -126, w)
    assert not all(torch.isfinite(v).all() for v in Dynamics(8, 16, lr_scale=1e-300).parameters())
    with pytest.raises(PosencError) as refused:
        build_model("transformer_posenc", "--position-encoding", "floater", "--floater-lr-scale", "1e-300")
    assert str(refused.value) == ("--floater-lr-scale must be a finite number >= 1.17549e-38 (the weights are stored "
                                  "as W / C in float32), got 1e-300")


def test_the_relative_distance_bound_is_the_largest_offset_between_the_models_positions():
    assert max_relative_distance_high(argparse.Namespace(max_source_positions=100, max_target_positions=50)) == 99
    assert max_relative_distance_high(argparse.Namespace()) == 1023  # fairseq's 1024 positions
    # Shaw over 64 positions at the bound K = 63: the offsets j - i read every row of its tables, the
    # first and last once each; K = 64 would add rows no offset reads
    model = build_model("transformer_posenc", "--position-encoding", "shaw", "--max-relative-distance", "63")
    scheme, frame = model.encoder.position_encoding, torch.arange(64)
    index = (frame[None, :] - frame[:, None]).clamp(-scheme.max_distance, scheme.max_distance) + scheme.max_distance
    assert index.unique().tolist() == list(range(scheme.rel_k.size(1))) and (index == 0).sum() == 1
    with pytest.raises(PosencError) as refused:
        build_model("transformer_posenc", "--position-encoding", "shaw", "--max-relative-distance", "64")
    assert str(refused.value) == ("--max-relative-distance must be from 1 to 63 (no two of the model's positions are "
                                  "further apart), got 64")


def test_the_head_size_bound_is_where_the_attention_projections_fill_the_machines_memory(monkeypatch):
    # TINY: width 32, 4 heads, 2 + 2 layers, the decoder's with cross-attention: 4 x 32 x 4 x (2 + 2 x 2)
    # = 3072 float32 weights per unit of head size, 12288 bytes
    args = model_args("transformer_posenc")
    monkeypatch.setattr(float_bounds, "physical_memory", lambda: 2 ** 30)
    assert attention_head_dim_high(args) == 2 ** 30 // 12288 == 87381
    # the model as built: its attention projections hold 3072 weights per unit of head size
    model = build_model("transformer_posenc", "--attention-head-dim", "3")
    weights = sum(p.numel() for name, p in model.named_parameters()
                  if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight")))
    assert weights == 3 * 3072
    with pytest.raises(PosencError) as refused:
        build_model("transformer_posenc", "--attention-head-dim", "87382")
    assert str(refused.value) == ("--attention-head-dim must be from 1 to 87381 (larger, the attention's projections "
                                  "alone exceed this machine's memory), got 87382")
    monkeypatch.setattr(float_bounds, "physical_memory", lambda: 0)  # unknown: no bound
    assert attention_head_dim_high(args) is None


def test_the_bias_scale_bounds_keep_the_stored_initialisation_in_float32():
    tiny, largest = float(torch.finfo(torch.float32).tiny), float(torch.finfo(torch.float32).max)
    # torch's normal draws: Box-Muller on uniforms of at most 64 bits
    assert NORMAL_DRAW_MAX == pytest.approx(9.4193, abs=1e-4)
    assert torch.randn(10 ** 6).abs().max() < NORMAL_DRAW_MAX
    # t5 and diet_rel: std 0.02: S from float32's smallest normal number to 0.02 x 2^126
    t5 = position_bias_scale_stds(model_args("transformer_posenc", "--position-encoding", "t5"))
    assert t5 == (0.02, 0.02)
    assert position_bias_scale_range(t5) == (tiny, 0.02 * 2.0 ** 126)
    # diet_abs of rank 1: P_Q's std 1; the largest draw 9.42 / S finite from 9.42 / max32 (2 roundings)
    abs_1 = position_bias_scale_stds(model_args("transformer_posenc", "--position-encoding", "diet_abs",
                                                "--diet-rank", "1"))
    low, high = position_bias_scale_range(abs_1)
    assert low == pytest.approx(NORMAL_DRAW_MAX / largest, rel=1e-6) and high == 0.02 * 2.0 ** 126
    assert torch.isfinite(torch.tensor(NORMAL_DRAW_MAX, dtype=torch.float32) / torch.tensor(low))
    assert torch.isinf(torch.tensor(NORMAL_DRAW_MAX, dtype=torch.float32) / torch.tensor(low / 2))
    # the init's scale std / S: normal at the high bound, below the normal numbers past it
    assert torch.tensor(0.02 / high, dtype=torch.float32).item() == tiny
    assert torch.tensor(0.02 / (2 * high), dtype=torch.float32).item() < tiny
    # the segment scalars start at 0: S's own range; no user: the same
    assert position_bias_scale_stds(model_args("transformer_posenc", "--segment-attention")) == ()
    assert position_bias_scale_range(()) == (tiny, largest)
    # what the bounds refuse: 1e300 gives t5 NaN biases (0 x inf), 1e-300 diet_rel's
    for encoding, scale in (("t5", 1e300), ("diet_rel", 1e-300)):
        stored = torch.empty(4, dtype=torch.float32).normal_(std=0.02 / scale)
        assert torch.isnan(stored * scale).any() or not torch.isfinite(stored).all()
        with pytest.raises(PosencError) as refused:
            build_model("transformer_posenc", "--position-encoding", encoding, "--position-bias-scale", str(scale))
        assert str(refused.value) == (f"--position-bias-scale must be a finite number >= {tiny:g} and <= "
                                      f"{0.02 * 2.0 ** 126:g} (S and the initial weights / S in float32's normal "
                                      f"range), got {scale}")


def test_the_floater_dt_bounds_keep_the_times_of_the_solved_positions_finite():
    tiny = float(torch.finfo(torch.float32).tiny)
    largest = float(torch.finfo(torch.float32).max) / (1 + 2 * float(torch.finfo(torch.float32).eps))
    # 1024 positions: a decode's kept solution grows to 2 x 1023 = 2046 positions, the last at time 2045 dt
    assert floater_solved_positions(1024) == 2046 and floater_solved_positions(10) == 64
    assert floater_dt_range(argparse.Namespace()) == (tiny, largest / 2045)
    # the computation (ode.py's _solve): the times finite at the bound, infinite at twice it
    high = floater_dt_range(argparse.Namespace())[1]
    assert torch.isfinite(torch.arange(2046, dtype=torch.float32) * high).all()
    assert torch.isinf(torch.arange(2046, dtype=torch.float32) * (2 * high))[-1]
    # a decode of inputs up to 65 positions grows the solution to 2 x 64 = 128
    model = build_model("transformer_posenc", "--position-encoding", "floater", max_positions=65)
    ode = model.encoder.position_encoding.ode
    with torch.no_grad():
        ode.positions(64)
        assert ode.positions(65).size(0) == floater_solved_positions(65) == 128
    # dt at the low bound solves; below float32's normal numbers (1e-300: 0) it stopped under a traceback
    model = build_model("transformer_posenc", "--position-encoding", "floater", "--floater-dt", repr(tiny))
    with torch.no_grad():
        assert torch.isfinite(model.encoder.position_encoding.ode.positions(64)).all()
    with pytest.raises(PosencError) as refused:
        build_model("transformer_posenc", "--position-encoding", "floater", "--floater-dt", "1e300")
    assert str(refused.value) == (f"--floater-dt must be a finite number >= {tiny:g} and <= "
                                  f"{largest / (2 * 63 - 1):g} (the positions' times i x dt in float32), got 1e+300")


def test_the_floater_step_bounds_keep_the_solvers_grid_in_memory_and_finite(monkeypatch):
    tiny = float(torch.finfo(torch.float32).tiny)
    largest = float(torch.finfo(torch.float32).max) / (1 + 2 * float(torch.finfo(torch.float32).eps))
    args = argparse.Namespace(floater_dt=0.1, encoder_embed_dim=8, decoder_embed_dim=8, max_source_positions=10,
                              max_target_positions=10)
    # 10 positions: the solution grows to 64, a span of 63 x 0.1; 2^20 bytes hold 2^20 / (4 x 9) steps
    monkeypatch.setattr(float_bounds, "physical_memory", lambda: 2 ** 20)
    low, high = floater_step_range(args)
    assert low == 63 * 0.1 / (2 ** 20 // 36) and high == largest - 63 * 0.1
    # solver.py's grid at the low bound has as many steps as the memory holds
    from fairseq_posenc.positions.floater.solver import step_grid

    times = torch.arange(64, dtype=torch.float32) * 0.1
    assert step_grid(times, low).numel() <= 2 ** 20 // 36 + 2
    assert torch.isfinite(step_grid(times, high)).all()
    monkeypatch.setattr(float_bounds, "physical_memory", lambda: 0)  # unknown: a normal float32 number
    assert floater_step_range(args)[0] == tiny
    with pytest.raises(PosencError) as refused:
        build_model("transformer_posenc", "--position-encoding", "floater", "--floater-step", "1e300")
    assert str(refused.value).startswith("--floater-step must be a finite number >= ") and \
        "(the solver's grid of steps in float32 and in memory), got 1e+300" in str(refused.value)

