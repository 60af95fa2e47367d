"""The pure maths of the position schemes, against hand-computed values."""
import math

import pytest
import torch

from fairseq_posenc.positions.alibi import alibi_slopes
from fairseq_posenc.positions.base import AttentionPositions
from fairseq_posenc.positions.rope import rope_angles, rotate_half, rotation_rows
from fairseq_posenc.positions.segments import segment_ids
from fairseq_posenc.positions.t5 import relative_position_bucket
from helpers.tolerances import assert_within, float32_tolerance, magnitude
from helpers.toy import build_model


def test_t5_buckets_bidirectional_by_hand():
    # 32 buckets: 16 per direction, 8 exact (0..7), then log-spaced up to distance 128:
    # bucket = 8 + floor(log(d / 8) / log(128 / 8) * 8), e.g. d=15 -> 8 + 1 (1.81), d=16 -> 8 + 2.
    # Keys after the query (positive memory - query) add 16.
    rel = torch.tensor([0, -1, -7, -8, -15, -16, -32, -64, -127, -128, -1000, 1, 7, 8, 16, 200])
    expected = [0, 1, 7, 8, 9, 10, 12, 14, 15, 15, 15, 17, 23, 24, 26, 31]
    assert relative_position_bucket(rel, bidirectional=True).tolist() == expected


def test_t5_buckets_causal_by_hand():
    # one-sided: 16 exact (0..15), then 16 + floor(log(d / 16) / log(128 / 16) * 16);
    # d=32 -> 16 + 5 (5.33), d=64 -> 16 + 10 (10.67); keys in the future fall in bucket 0.
    rel = torch.tensor([5, 0, -1, -15, -16, -32, -64, -127, -128, -500])
    expected = [0, 0, 1, 15, 16, 21, 26, 31, 31, 31]
    assert relative_position_bucket(rel, bidirectional=False).tolist() == expected


def test_t5_buckets_small_configuration():
    # 8 buckets, max distance 16, bidirectional: 4 per side, 2 exact, log buckets 2..3
    rel = torch.tensor([0, -1, -2, -3, -4, -8, -16, 1, 2, 4, 100])
    expected = [0, 1, 2, 2, 2, 3, 3, 5, 6, 6, 7]
    assert relative_position_bucket(rel, True, num_buckets=8, max_distance=16).tolist() == expected


def test_alibi_slopes_power_of_two():
    assert alibi_slopes(8).tolist() == [2.0 ** -i for i in range(1, 9)]
    assert alibi_slopes(4).tolist() == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]


def test_alibi_slopes_other_head_counts():
    # 6 heads: the 4-head slopes, then every other 8-head slope (2^-1, 2^-3)
    assert alibi_slopes(6).tolist() == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]
    assert alibi_slopes(1).tolist() == [2.0 ** -8]
    assert len(alibi_slopes(12)) == 12


def test_rotate_half():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert rotate_half(x).tolist() == [-3.0, -4.0, 1.0, 2.0]


def test_rope_rotates_with_a_roll_and_a_signed_sin_exactly_as_with_rotate_half():
    angles = rope_angles(torch.arange(7), dim=8)
    cos, signed_sin = rotation_rows(angles)
    x = torch.randn(3, 7, 8, generator=torch.Generator().manual_seed(0))
    # bit for bit: only the sign of one factor of each product moved
    assert torch.equal(x * cos + x.roll(4, -1) * signed_sin, x * angles.cos() + rotate_half(x) * angles.sin())


@pytest.mark.numerics
def test_rope_angles_and_relative_dot_products():
    angles = rope_angles(torch.tensor([0, 1, 3]), dim=4, theta=100.0)
    # frequencies 100^0 = 1 and 100^(-2/4) = 0.1, each repeated for the two halves
    # 100^(-1/2) and 3 x it, rounded (and 0.3 once more, as a float32 literal): 3 roundings at 3
    assert_within(angles[2], torch.tensor([3.0, 0.3, 3.0, 0.3]), float32_tolerance(3, 3.0))
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(8, generator=g), torch.randn(8, generator=g)

    def rotated_dot(i, j):
        a = rope_angles(torch.tensor([i, j]), dim=8)
        rq = q * a[0].cos() + rotate_half(q) * a[0].sin()
        rk = k * a[1].cos() + rotate_half(k) * a[1].sin()
        return (rq * rk).sum()

    # depends on i - j only: 8 products summed and 3 roundings per rotated component, at most
    # |q| |k|; and angles of up to 10 rad, each rounded twice (frequency, product), which turn
    # the vectors and move the dot product by up to |q| |k| per radian
    qk = (q.norm() * k.norm()).item()
    assert_within(rotated_dot(3, 1), rotated_dot(10, 8), float32_tolerance(8 + 3, qk) + float32_tolerance(2, 10 * qk))
    assert not math.isclose(rotated_dot(3, 1).item(), rotated_dot(3, 2).item(), rel_tol=1e-3)


def test_segment_ids_by_hand():
    sep = 9
    tokens = torch.tensor([[1, 4, 9, 5, 9, 6, 2], [0, 0, 4, 5, 9, 6, 2]])
    assert segment_ids(tokens, sep, max_segments=8).tolist() == [[0, 0, 0, 1, 1, 2, 2], [0, 0, 0, 0, 0, 1, 1]]
    assert segment_ids(tokens, sep, max_segments=2).tolist() == [[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1]]


def test_positions_are_padding_aware_for_left_padded_sources():
    mask = torch.tensor([[True, True, False, False], [False, False, False, False]])
    pos = AttentionPositions.build(4, 4, mask, "cpu")
    assert pos.padded
    assert pos.k.tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]
    assert pos.q_frame.tolist() == [0, 1, 2, 3]


def test_positions_carry_the_decoding_offset():
    pos = AttentionPositions.build(1, 5, None, "cpu")
    assert not pos.padded
    assert pos.q.tolist() == [[4]] and pos.k.tolist() == [[0, 1, 2, 3, 4]]
    assert pos.key == (4, 1, 5)


@pytest.mark.numerics
def test_rope_rotates_each_pair_counterclockwise_by_position_times_frequency():
    """Su et al.'s R_m: the pair (x_i, x_(i + D/2)) at position m goes to
    (x_i cos - x_(i+D/2) sin, x_i sin + x_(i+D/2) cos) of m theta^(-2i/D), written out here in
    float64 from the angles (checked by hand above); a rotation the other way also keeps q_m . k_n
    a function of m - n, so only the numbers tell the direction."""
    model = build_model("transformer_posenc", "--position-encoding", "rope", "--rope-theta", "100")
    scheme = model.encoder.position_encoding
    n, heads, dim = 6, scheme.num_heads, scheme.head_dim
    scheme.begin_forward(torch.zeros(1, n, dtype=torch.long))
    pos = AttentionPositions.build(n, n, None, "cpu")
    x = torch.randn(1, heads, n, dim, generator=torch.Generator().manual_seed(0))
    q, k, v = scheme.transform_qkv(0, "self", x, x, x, pos)
    angles = rope_angles(torch.arange(n), dim, 100.0)[:, : dim // 2].double()  # (T, D/2)
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x.double().chunk(2, dim=-1)
    expected = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    # float32 cos and sin (a u each), two products and a sum, against float64
    tolerance = float32_tolerance(6, magnitude(expected), sides=1)
    assert_within(q.double(), expected, tolerance)
    assert_within(k.double(), expected, tolerance)
    assert v is x


def test_t5_bias_is_the_learned_scalar_of_each_offsets_bucket_times_the_scale():
    """Each head's bias at (i, j) is its scalar of bucket(j - i) (the buckets checked by hand
    above), times --position-bias-scale: bidirectional buckets in the encoder, one-sided in the
    decoder; a sign flipped or the two sides swapped changes the numbers."""
    model = build_model("transformer_posenc", "--position-encoding", "t5", "--position-bias-scale", "2")
    n = 7
    offsets = torch.arange(n)[None, :] - torch.arange(n)[:, None]  # key minus query, (T, S)
    for bidirectional, scheme in ((True, model.encoder.position_encoding), (False, model.decoder.position_encoding)):
        scheme.begin_forward(torch.zeros(1, n, dtype=torch.long))
        bias = scheme.attention_bias(0, None, AttentionPositions.build(n, n, None, "cpu"))[0]  # (H, T, S)
        buckets = relative_position_bucket(offsets, bidirectional, scheme.num_buckets, scheme.max_distance)
        expected = (scheme.bias.weight[buckets] * 2).permute(2, 0, 1)
        assert len(set(buckets.flatten().tolist())) == (2 * n - 1 if bidirectional else n)
        assert torch.equal(bias, expected), bidirectional


def test_t5_names_half_its_bucket_count_when_it_refuses_the_max_distance():
    import argparse

    from fairseq_posenc.positions.t5 import T5Bias

    cfg = argparse.Namespace(t5_num_buckets=20, t5_max_distance=10, position_bias_scale=None,
                             max_source_positions=64, max_target_positions=64)
    with pytest.raises(ValueError, match=r"--t5-max-distance must exceed --t5-num-buckets / 2 = 10 \(.*got 10$"):
        T5Bias(cfg, "encoder", 1, 2, 4)
