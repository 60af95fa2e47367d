"""DIET's constructors: the factors' initial scale under --position-bias-scale, the smallest
clipping distance DIET-REL takes, and segment attention's default number of segments."""
import argparse

import pytest
import torch

from fairseq_posenc.positions import AttentionPositions
from fairseq_posenc.positions.diet_abs import DietAbs
from fairseq_posenc.positions.diet_rel import DietRel
from helpers.toy import ToyTask, build_model


def cfg(**kw):
    base = dict(max_relative_distance=None, position_sharing=None, diet_rank=None,
                max_source_positions=64, max_target_positions=64)
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize("scale", [0.25, 1.0, 4.0])
def test_diet_abs_stores_its_factors_at_their_init_std_over_the_scale(scale):
    """P_Q ~ N(0, rank^-1/2) and P_K ~ N(0, 0.02), stored as p = P / S: P_Q P_K^T at step 0 does not
    depend on S. 64 x 8 x 16 = 8192 draws each: the sample std is within 5% (6 standard errors)."""
    torch.manual_seed(0)
    scheme = DietAbs(cfg(position_bias_scale=scale), "encoder", 1, 8, 16)
    assert scheme.p_q.shape == scheme.p_k.shape == (1, 64, 8, 16)
    assert scheme.p_q.std().item() == pytest.approx(16 ** -0.5 / scale, rel=0.05)
    assert scheme.p_k.std().item() == pytest.approx(0.02 / scale, rel=0.05)


def test_diet_rel_takes_a_max_distance_of_1_three_offsets_per_head():
    rel = DietRel(cfg(max_relative_distance=1), "encoder", 1, 2, 4)
    assert rel.weight.shape == (1, 2, 3)
    bias = rel.attention_bias(0, None, AttentionPositions.build(4, 4, None, "cpu"))[0]  # (H, T, S)
    for h in range(2):
        for i in range(4):
            for j in range(4):
                assert bias[h, i, j] == rel.weight[0, h, max(-1, min(1, i - j)) + 1]
    with pytest.raises(ValueError, match=r"--max-relative-distance must be from 1 to 63 \(.*\), got -1"):
        DietRel(cfg(max_relative_distance=-1), "encoder", 1, 2, 4)
    # 0 is refused too, not read as "unset" (128)
    with pytest.raises(ValueError, match=r"--max-relative-distance must be from 1 to 63 \(.*\), got 0$"):
        DietRel(cfg(max_relative_distance=0), "encoder", 1, 2, 4)
    assert DietRel(cfg(), "encoder", 1, 2, 4).max_distance == 128


def test_segment_attention_keeps_8_segments_by_default():
    """--segment-attention without --max-segments, through the model's flags: 8 segments, a
    scalar per (query segment, key segment) pair per head and layer."""
    task = ToyTask()
    task.source_dictionary.add_symbol("<sep>")
    bias = build_model("transformer_posenc", "--segment-attention", task=task).encoder.segment_bias
    assert bias.max_segments == 8
    assert bias.weight.shape[-2:] == (8, 8)


@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_diet_abs_largest_bias_is_the_largest_bias_the_model_adds(scale):
    """largest_bias from the state dict (stored p = P / S) equals the largest |S p_Q (S p_K)^T| the
    module adds to the logits: S^2 times the stored product's largest entry."""
    torch.manual_seed(0)
    scheme = DietAbs(cfg(position_bias_scale=scale), "encoder", 1, 2, 4)
    bias = scheme.attention_bias(0, None, AttentionPositions.build(64, 64, None, "cpu"))
    stored = torch.einsum("qhr,khr->hqk", scheme.p_q[0].detach(), scheme.p_k[0].detach()).abs().max().item()
    largest = DietAbs.largest_bias(scheme.state_dict(), scale)
    assert largest == pytest.approx(bias.abs().max().item(), rel=1e-5)
    assert largest == pytest.approx(scale * scale * stored, rel=1e-6)


def test_diet_abs_refuses_a_rank_of_0_and_defaults_to_the_head_size():
    assert DietAbs(cfg(), "encoder", 1, 2, 4).rank == 4
    assert DietAbs(cfg(diet_rank=1), "encoder", 1, 2, 4).p_q.shape == (1, 64, 2, 1)
    for rank in (0, -1):
        with pytest.raises(ValueError, match=f"--diet-rank must be positive, got {rank}"):
            DietAbs(cfg(diet_rank=rank), "encoder", 1, 2, 4)


def test_segment_attention_takes_a_single_segment():
    """--max-segments 1: every token in segment 0, one scalar per head and layer."""
    from fairseq_posenc.positions.segments import SegmentBias, segment_ids

    bias = SegmentBias(argparse.Namespace(max_segments=1, position_bias_scale=None, max_source_positions=64,
                                          max_target_positions=64), 2, 3, 4, separator_index=5)
    assert bias.weight.shape == (2, 3, 1, 1)
    tokens = torch.tensor([[7, 5, 8, 5, 9]])
    assert segment_ids(tokens, 5, 1).tolist() == [[0, 0, 0, 0, 0]]
    with pytest.raises(ValueError, match="--max-segments must be positive, got 0"):
        SegmentBias(argparse.Namespace(max_segments=0, position_bias_scale=None, max_source_positions=64,
                                       max_target_positions=64), 2, 3, 4, separator_index=5)


def test_diet_rel_bias_is_its_stored_scalar_times_the_scale():
    """--position-bias-scale S: the stored scalar w enters the logits as S w (the parameter learns
    S times faster, its start divided by S: the bias at step 0 does not depend on S)."""
    rel = DietRel(cfg(max_relative_distance=2, position_bias_scale=4.0), "encoder", 1, 2, 4)
    bias = rel.attention_bias(0, None, AttentionPositions.build(3, 3, None, "cpu"))[0]  # (H, T, S)
    for h in range(2):
        for i in range(3):
            for j in range(3):
                assert bias[h, i, j] == 4.0 * rel.weight[0, h, max(-2, min(2, i - j)) + 2]
