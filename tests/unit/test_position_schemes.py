"""Each scheme computes what its paper says, shares what it should, and caches for decoding."""
import argparse
import itertools
import math

import pytest
import torch

from fairseq_posenc.modules import PositionalAttention
from fairseq_posenc.positions import POSITION_ENCODINGS, AttentionPositions
from fairseq_posenc.positions.diet_abs import DietAbs
from fairseq_posenc.positions.diet_rel import DietRel
from fairseq_posenc.positions.shaw import ShawRelative
from helpers.tolerances import assert_within, encoder_terms, float32_tolerance, magnitude, transformer_terms
from helpers.toy import ToyTask, build_model, full_log_probs, incremental_log_probs, toy_batch, with_strong_positions


def cfg(**kw):
    base = dict(max_relative_distance=None, position_sharing=None, diet_rank=None,
                max_source_positions=32, max_target_positions=32)
    return argparse.Namespace(**{**base, **kw})


def frame(n):
    return AttentionPositions.build(n, n, None, "cpu")


@pytest.mark.numerics
def test_shaw_attention_matches_the_equations():
    torch.manual_seed(0)
    heads, dim, head_dim, k, n = 2, 8, 4, 2, 6
    attn = PositionalAttention(dim, heads, self_attention=True).eval()
    shaw = ShawRelative(cfg(max_relative_distance=k), "encoder", 1, heads, head_dim)
    attn.attach([shaw], 0)
    x = torch.randn(n, 1, dim)
    out, _ = attn(x, x, x, need_weights=False)

    q = attn.q_proj(x)[:, 0].view(n, heads, head_dim)
    key = attn.k_proj(x)[:, 0].view(n, heads, head_dim)
    v = attn.v_proj(x)[:, 0].view(n, heads, head_dim)
    z = torch.zeros(n, heads, head_dim)
    for h in range(heads):
        for i in range(n):
            a_k = [shaw.rel_k[0, max(-k, min(k, j - i)) + k] for j in range(n)]
            a_v = [shaw.rel_v[0, max(-k, min(k, j - i)) + k] for j in range(n)]
            logits = torch.stack([q[i, h] @ (key[j, h] + a_k[j]) for j in range(n)]) / math.sqrt(head_dim)
            p = logits.softmax(-1)
            z[i, h] = sum(p[j] * (v[j, h] + a_v[j]) for j in range(n))
    expected = attn.out_proj(z.reshape(n, heads * head_dim))
    # the projections (8 terms), a logit (4, and 4 for q . a^K), the softmax and the weighted
    # values (6 keys each), a^V pooled over 6 keys and 5 offsets, the output projection (8)
    assert_within(out[:, 0], expected, float32_tolerance(8 + 8 + 6 + 6 + 11 + 8, magnitude(expected, floor=1)))


def test_diet_rel_bias_is_one_scalar_per_head_per_clipped_offset():
    rel = DietRel(cfg(max_relative_distance=2), "encoder", 3, 2, 4)
    bias = rel.attention_bias(1, None, frame(5))[0]  # (H, T, S)
    for h in range(2):
        for i in range(5):
            for j in range(5):
                assert bias[h, i, j] == rel.weight[1, h, max(-2, min(2, i - j)) + 2]
    assert rel.weight.shape == (3, 2, 5)  # not shared by default, as the paper found best


def test_diet_rel_default_distance_is_128():
    assert DietRel(cfg(), "encoder", 1, 2, 4).weight.shape[-1] == 257


@pytest.mark.numerics
@pytest.mark.parametrize("sharing, shape", [("layers", (1, 32, 4, 3)), ("heads", (6, 32, 1, 3)),
                                             ("none", (6, 32, 4, 3))])
def test_diet_abs_sharing_and_rank(sharing, shape):
    scheme = DietAbs(cfg(position_sharing=sharing, diet_rank=3), "encoder", 6, 4, 8)
    assert scheme.p_q.shape == scheme.p_k.shape == shape
    bias = scheme.attention_bias(2, None, frame(5))[0]
    group = 0 if sharing == "layers" else 2
    head = lambda h: 0 if sharing == "heads" else h  # noqa: E731
    for h in range(4):
        expected = scheme.p_q[group, :5, head(h)] @ scheme.p_k[group, :5, head(h)].t()
        # rank 3: 3 terms, each |p_q| x |p_k|
        scale = magnitude(scheme.p_q[group, :5, head(h)]) * magnitude(scheme.p_k[group, :5, head(h)])
        assert_within(bias[h], expected, float32_tolerance(3, 3 * scale), f"head {h}")


def test_diet_abs_defaults_to_sharing_across_layers_with_rank_head_dim():
    scheme = DietAbs(cfg(), "decoder", 6, 4, 8)
    assert scheme.sharing == "layers" and scheme.p_q.shape == (1, 32, 4, 8)


def test_bad_sharing_is_a_clear_error():
    with pytest.raises(ValueError, match="--position-sharing must be one of none, layers, heads, got 'all'"):
        DietAbs(cfg(position_sharing="all"), "encoder", 6, 4, 8)


def _count_calls(module):
    calls = []
    module.register_forward_hook(lambda *a: calls.append(1))
    return calls


def test_shared_t5_table_is_built_once_per_forward_for_all_layers():
    model = build_model("transformer_posenc", "--position-encoding", "t5").train()
    enc_calls = _count_calls(model.encoder.position_encoding.bias)
    dec_calls = _count_calls(model.decoder.position_encoding.bias)
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7])
    model(src, lengths, prev)
    assert (len(enc_calls), len(dec_calls)) == (1, 1)  # 2 layers each, one table each
    model(src, lengths, prev)
    assert (len(enc_calls), len(dec_calls)) == (2, 2)  # parameters may have changed: rebuilt


@torch.no_grad()
def test_decoding_builds_position_tables_once_not_every_step():
    model = with_strong_positions(build_model("transformer_posenc", "--position-encoding", "t5"))
    dec_calls = _count_calls(model.decoder.position_encoding.bias)
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=12)
    incremental_log_probs(model, src, lengths, prev)
    assert len(dec_calls) == 1  # 12 steps, 2 layers
    # new values written as fairseq's optimizers write them, bumping no version counter
    model.decoder.position_encoding.bias.weight.data.mul_(2)
    incremental_log_probs(model, src, lengths, prev)
    assert len(dec_calls) == 2


def test_positions_are_built_once_per_forward_and_follow_the_padding_mask():
    scheme = DietRel(cfg(), "encoder", 2, 2, 4)
    scheme.begin_forward(torch.zeros(2, 5, dtype=torch.long))
    pads = torch.tensor([[True, False, False, False, False], [False] * 5])
    first = scheme.positions("self", 5, 5, pads, "cpu")
    assert scheme.positions("self", 5, 5, pads, "cpu") is first and first.padded
    assert torch.equal(first.k, torch.tensor([[0, 0, 1, 2, 3], [0, 1, 2, 3, 4]]))
    # another mask of the same shape, as a later call without begin_forward could bring
    other = scheme.positions("self", 5, 5, torch.zeros(2, 5, dtype=torch.bool), "cpu")
    assert not other.padded
    assert scheme.positions("cross", 5, 5, pads, "cpu") is not first


@pytest.mark.numerics
@pytest.mark.parametrize("scheme", ["diet_rel", "t5", "alibi"])
def test_a_decoding_step_bias_is_the_last_row_of_the_full_bias(scheme):
    from fairseq_posenc.positions import POSITION_ENCODINGS

    terms = POSITION_ENCODINGS[scheme](
        argparse.Namespace(**vars(cfg()), t5_num_buckets=8, t5_max_distance=16), "decoder", 1, 2, 4)
    with torch.no_grad():
        for n in (1, 7, 40):
            terms.begin_forward(torch.zeros(1, n, dtype=torch.long))
            full = terms.attention_bias(0, None, frame(n))
            terms.begin_forward(torch.zeros(1, 1, dtype=torch.long))
            step = terms.attention_bias(0, None, AttentionPositions.build(1, n, None, "cpu"))
            assert step.shape == (1, 2, 1, n)
            # exact: both are looked up in the same table (or computed by the same operations on
            # the same offsets), a copy of the same values
            assert torch.equal(step, full[:, :, -1:])


def test_diet_abs_table_shared_across_layers_is_computed_once(monkeypatch):
    model = build_model("transformer_posenc", "--position-encoding", "diet_abs").train()
    einsums = []
    real = torch.einsum
    monkeypatch.setattr(torch, "einsum", lambda *a: einsums.append(a[0]) or real(*a))
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7])
    model(src, lengths, prev)
    assert einsums.count("qhr,khr->hqk") == 2  # encoder + decoder, not per layer


def _segment_task():
    task = ToyTask()
    task.source_dictionary.add_symbol("<sep>")
    return task


def _segment_model():
    model = build_model("transformer_posenc", "--position-encoding", "diet_rel", "--segment-attention",
                        task=_segment_task())
    return with_strong_positions(model)


@pytest.mark.numerics
@torch.no_grad()
def test_segment_attention_acts_only_across_segments():
    model = _segment_model()
    d = model.encoder.dictionary
    sep = d.index("<sep>")
    src, lengths, _ = toy_batch(d, [9])
    src[src.eq(sep)] = d.index("w0")  # one segment
    one_segment = model.encoder(src, lengths)["encoder_out"][0]
    model.encoder.segment_bias.weight.normal_(0, 1.0)
    # a single segment: the same scalar on every logit of a row, which softmax cancels up to
    # rounding: the encoder's sums, on logits moved by up to the largest segment bias
    size = magnitude(one_segment, floor=1) + magnitude(model.encoder.segment_bias.weight)
    tolerance = float32_tolerance(encoder_terms(model, 9), size)
    assert tolerance < 1e-2  # what the second segment changes below
    assert_within(model.encoder(src, lengths)["encoder_out"][0], one_segment, tolerance)
    two = src.clone()
    two[0, 4] = sep
    with_bias = model.encoder(two, lengths)["encoder_out"][0]
    model.encoder.segment_bias.weight.zero_()
    assert (model.encoder(two, lengths)["encoder_out"][0] - with_bias).abs().max() > 1e-2


@pytest.mark.numerics
@torch.no_grad()
def test_segment_attention_keeps_padding_and_decoding_properties():
    model = _segment_model()
    model.encoder.segment_bias.weight.normal_(0, 1.0)
    d = model.encoder.dictionary
    src, lengths, prev = toy_batch(d, [9, 5], tgt_len=6)
    src[0, 3] = src[1, -3] = d.index("<sep>")
    batch = full_log_probs(model, src, lengths, prev)
    tolerance = float32_tolerance(transformer_terms(model, 9, 6), magnitude(batch, floor=1))
    assert_within(incremental_log_probs(model, src, lengths, prev), batch, tolerance, "incremental")
    alone = full_log_probs(model, src[1:, -5:], lengths[1:], prev[1:])
    assert_within(alone[0], batch[1], tolerance, "alone")


def test_segment_separator_must_be_in_the_dictionary():
    with pytest.raises(ValueError, match="--segment-separator '<sep>' is not in the source dictionary"):
        build_model("transformer_posenc", "--segment-attention")


@torch.no_grad()
def test_kept_tables_follow_the_module_to_another_dtype():
    model = with_strong_positions(build_model("transformer_posenc", "--position-encoding", "alibi"))
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5], tgt_len=4)
    model(src, lengths, prev)  # builds and keeps the tables in float32
    model.double()
    out, _ = model(src.clone(), lengths, prev)
    assert out.dtype == torch.float64
    scheme = model.encoder.position_encoding
    assert all(table.dtype == torch.float64 for table, _ in scheme._tables.values())


# every registered encoding, and the flags that change where a scheme acts in attention
ACTING = [[name] for name in POSITION_ENCODINGS] + [
    ["floater", "--floater-cross-attention"], ["rnn", "--floater-cross-attention"],
    ["floater", "--position-blocks", "input"], ["diet_rel", "--segment-attention"],
    ["alibi", "--alibi-encoder", "split"], ["alibi", "--alibi-encoder", "crossed"]]


@pytest.mark.parametrize("flags", ACTING, ids=" ".join)
@torch.no_grad()
def test_a_hook_attention_skips_is_one_that_cannot_act(flags):
    """Attention calls a hook only on the schemes that declare it acting in its role
    (PositionEncoding.acts_through): where one declares not, the hook must change nothing, with
    strong positions, padded or not, in every layer. And attention guards rows without a visible
    key only where a mask can make them: a bias with -inf must come from a scheme that declares
    bias_masks_keys (ALiBi's split encoder)."""
    task = _segment_task() if "--segment-attention" in flags else None
    model = with_strong_positions(build_model("transformer_posenc", "--position-encoding", *flags, task=task))
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=6)
    for stack, tokens in ((model.encoder, src), (model.decoder, prev)):
        terms = getattr(stack, "position_terms", (stack.position_encoding,))
        for term in terms:
            term.begin_forward(tokens)
        for term, role, layer, padded in itertools.product(terms, ("self", "cross"), range(2), (False, True)):
            n = tokens.size(1)
            pads = tokens.eq(model.encoder.dictionary.pad()) if padded else None
            pos = term.positions(role, n, n, pads, "cpu")
            assert pos.padded == padded or stack is model.decoder  # targets are right-padded
            q, k, v = (torch.randn(3, 4, n, 8) for _ in range(3))
            if not term.acts_through("transform_qkv", role):
                assert all(a is b for a, b in zip(term.transform_qkv(layer, role, q, k, v, pos), (q, k, v)))
            if not term.acts_through("attention_bias", role) and role == "self":
                assert term.attention_bias(layer, q, pos) is None
            elif role == "self":
                bias = term.attention_bias(layer, q, pos)
                assert term.bias_masks_keys or not torch.isneginf(bias).any()
                if flags[-1] == "split" and stack is model.encoder:
                    assert torch.isneginf(bias).any()  # the declaration is needed, not just allowed
            if not term.acts_through("value_term", role) and role == "self":
                assert term.value_term(layer, torch.rand(3, 4, n, n), pos) is None
    # and the skipped ones are skipped: sinusoidal builds no positions in attention
    if flags == ["sinusoidal"]:
        assert not any(m._reads_positions for m in model.modules() if isinstance(m, PositionalAttention))
