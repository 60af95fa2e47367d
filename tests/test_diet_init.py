"""DIET's constructors: the factors' initial scale under --position-bias-scale, the smallest
clipping distance DIET-REL takes, and segment attention's default number of segments."""
import argparse

import pytest
import torch

from fairseq_posenc.positions import AttentionPositions
from fairseq_posenc.positions.diet_abs import DietAbs
from fairseq_posenc.positions.diet_rel import DietRel
from toy import ToyTask, build_model


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
    with pytest.raises(ValueError, match="--max-relative-distance must be positive"):
        DietRel(cfg(max_relative_distance=-1), "encoder", 1, 2, 4)


def test_segment_attention_keeps_8_segments_by_default():
    """--segment-attention without --max-segments, through the model's flags: 8 segments, a
    scalar per (query segment, key segment) pair per head and layer."""
    task = ToyTask()
    task.source_dictionary.add_symbol("<sep>")
    bias = build_model("transformer_posenc", "--segment-attention", task=task).encoder.segment_bias
    assert bias.max_segments == 8
    assert bias.weight.shape[-2:] == (8, 8)
