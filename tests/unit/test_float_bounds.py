"""fairseq_posenc/positions/float_bounds.py: each bound against numbers derived by hand, and against
the computation it guards, in float32 (issue 53)."""
import argparse

import pytest
import torch

from fairseq_posenc.compat import PosencError
from fairseq_posenc.positions.float_bounds import floater_lr_scale_low, rope_theta_low
from fairseq_posenc.positions.floater.dynamics import Dynamics
from fairseq_posenc.positions.rope import rope_angles
from helpers.toy import build_model


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
