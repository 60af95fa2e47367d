"""transformer_posenc with sinusoidal positions is fairseq's transformer, to float32 rounding."""
import pytest
import torch

from helpers.tolerances import assert_within, float32_tolerance, magnitude, transformer_terms
from helpers.toy import build_model, full_log_probs, incremental_log_probs, toy_batch


def _pair(*flags, dropout="0.0"):
    common = ("--dropout", dropout, *flags)
    stock = build_model("transformer", *common)
    ours = build_model("transformer_posenc", "--position-encoding", "sinusoidal", *common)
    return stock, ours


def test_same_parameters_as_stock_transformer_with_same_seed():
    stock, ours = _pair()
    stock_params, our_params = dict(stock.named_parameters()), dict(ours.named_parameters())
    assert stock_params.keys() == our_params.keys()
    for name, p in stock_params.items():
        assert torch.equal(p, our_params[name]), name


def test_state_dicts_are_interchangeable():
    stock, ours = _pair()
    ours.load_state_dict(stock.state_dict(), strict=True)
    stock.load_state_dict(ours.state_dict(), strict=True)


@pytest.mark.numerics
def test_training_forward_and_gradients_match_stock_with_dropout():
    stock, ours = _pair(dropout="0.3")
    src, lengths, prev = toy_batch(stock.encoder.dictionary, [9, 5, 7])
    outputs = []
    for model in (stock, ours):
        model.train()
        torch.manual_seed(123)  # the same dropout masks for both
        logits, _ = model(src, lengths, prev)
        logits.float().logsumexp(-1).sum().backward()
        outputs.append((logits, {n: p.grad for n, p in model.named_parameters()}))
    (stock_logits, stock_grads), (our_logits, our_grads) = outputs
    assert stock_logits.shape == our_logits.shape == (3, 7, len(stock.decoder.dictionary))
    # the two attention implementations sum in other orders: the transformer's chain of sums
    terms = transformer_terms(stock, 9, 7)
    assert_within(our_logits, stock_logits, float32_tolerance(terms, magnitude(stock_logits, floor=1)), "logits")
    # the backward runs the chain again, and a weight's gradient sums over the 3 x 9 positions
    grad_terms, largest = 2 * terms + 3 * 9, magnitude(*stock_grads.values())
    for name, grad in stock_grads.items():
        assert_within(our_grads[name], grad, float32_tolerance(grad_terms, largest), name)


@pytest.mark.numerics
@torch.no_grad()
def test_incremental_decoding_matches_stock():
    stock, ours = _pair()
    src, lengths, prev = toy_batch(stock.encoder.dictionary, [9, 5, 7])
    stock.eval(), ours.eval()
    expected = incremental_log_probs(stock, src, lengths, prev)
    actual = incremental_log_probs(ours, src, lengths, prev)
    tolerance = float32_tolerance(transformer_terms(stock, 9, 7), magnitude(expected, floor=1))
    assert_within(actual, expected, tolerance, "ours against stock")
    # and both equal one full forward of the same prefix
    assert_within(actual, full_log_probs(ours, src, lengths, prev), tolerance, "incremental against full")


@pytest.mark.numerics
@torch.no_grad()
def test_beam_search_matches_stock():
    from fairseq.sequence_generator import SequenceGenerator

    stock, ours = _pair()
    dictionary = stock.decoder.dictionary
    src, lengths, _ = toy_batch(dictionary, [9, 5, 7])
    hyps = []
    for model in (stock, ours):
        model.eval()
        generator = SequenceGenerator([model], dictionary, beam_size=4, max_len_b=10)
        hyps.append(generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}}))
    _assert_same_hypotheses(stock, *hyps, beam=4)


def _assert_same_hypotheses(stock, expected, actual, beam):
    for stock_hyps, our_hyps in zip(expected, actual):
        assert len(stock_hyps) == len(our_hyps) == beam
        for a, b in zip(stock_hyps, our_hyps):
            assert torch.equal(a["tokens"], b["tokens"])
            # a token's log-probability, and the beam's running sum of them (up to n x the score),
            # of which a positional score is a difference: 2 more terms per step. The score is
            # that sum divided by n: its error is the mean of the steps' errors
            n = len(a["tokens"])
            tolerance = (float32_tolerance(transformer_terms(stock, 9, n), magnitude(a["positional_scores"], floor=1))
                         + float32_tolerance(2 * n, n * magnitude(a["score"])))
            assert_within(b["positional_scores"], a["positional_scores"], tolerance, "positional scores")
            assert_within(b["score"], a["score"], tolerance, "score")


def test_learned_positions_match_stock_learned_pos():
    stock = build_model("transformer", "--encoder-learned-pos", "--decoder-learned-pos")
    ours = build_model("transformer_posenc", "--position-encoding", "learned")
    for (name, p), (our_name, q) in zip(stock.named_parameters(), ours.named_parameters()):
        assert name == our_name and torch.equal(p, q), name
    assert ours.encoder.embed_positions.weight.shape == (64 + 2, 32)


def test_fairseq_learned_pos_flag_conflicts_with_position_encoding():
    with pytest.raises(ValueError, match="use --position-encoding learned"):
        build_model("transformer_posenc", "--position-encoding", "sinusoidal", "--encoder-learned-pos")


@pytest.mark.parametrize(
    "arch, dim, ffn, heads, dropout",
    [("transformer_posenc_wmt_en_de", 512, 2048, 8, 0.1), ("transformer_posenc_wmt_en_de_big", 1024, 4096, 16, 0.3)],
)
def test_named_architectures_have_vaswani_sizes(arch, dim, ffn, heads, dropout):
    from fairseq.models import ARCH_CONFIG_REGISTRY
    import argparse

    args = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](args)
    assert (args.encoder_embed_dim, args.decoder_embed_dim) == (dim, dim)
    assert (args.encoder_ffn_embed_dim, args.decoder_ffn_embed_dim) == (ffn, ffn)
    assert (args.encoder_attention_heads, args.decoder_attention_heads) == (heads, heads)
    assert (args.encoder_layers, args.decoder_layers) == (6, 6)
    assert args.dropout == dropout
    assert args.position_encoding == "sinusoidal"


@pytest.mark.numerics
@torch.no_grad()
def test_alignment_attention_matches_stock():
    stock, ours = _pair()
    src, lengths, prev = toy_batch(stock.encoder.dictionary, [9, 5, 7])
    stock.eval(), ours.eval()
    (_, stock_extra), (_, our_extra) = stock(src, lengths, prev), ours(src, lengths, prev)
    assert our_extra["attn"][0].shape == (3, 7, 9)  # (B, T, S), averaged over heads
    # probabilities (at most 1) at the last decoder layer, counted as the whole chain
    tolerance = float32_tolerance(transformer_terms(stock, 9, 7), 1.0)
    assert_within(our_extra["attn"][0], stock_extra["attn"][0], tolerance, "alignment")


@pytest.mark.numerics
@torch.no_grad()
def test_per_head_attention_weights_match_fairseq_multihead_attention():
    from fairseq.modules import MultiheadAttention

    from fairseq_posenc.modules import PositionalAttention

    torch.manual_seed(0)
    theirs = MultiheadAttention(16, 4, self_attention=True).eval()
    ours = PositionalAttention(16, 4, self_attention=True).eval()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(6, 2, 16)
    pad = torch.tensor([[True, True, False, False, False, False], [False] * 6])
    # fairseq's fused path averages the heads whatever it is asked; compare the averages
    expected = theirs(x, x, x, key_padding_mask=pad, need_weights=True)
    averaged = ours(x, x, x, key_padding_mask=pad, need_weights=True)
    per_head = ours(x, x, x, key_padding_mask=pad, need_head_weights=True)
    assert averaged[1].shape == (2, 6, 6) and per_head[1].shape == (4, 2, 6, 6)  # (H, B, T, S)
    # the projection (16 terms), a logit (head size 4), the softmax and the weighted values (6
    # keys each), the output projection (16), the mean over 4 heads: 52 terms
    tolerance = float32_tolerance(16 + 4 + 6 + 6 + 16 + 4, magnitude(expected[0], floor=1))
    assert_within(averaged[0], expected[0], tolerance, "output")
    assert_within(averaged[1], expected[1], tolerance, "weights")
    assert_within(per_head[1].mean(0), expected[1], tolerance, "mean of the heads' weights")
    # a softmax's probabilities add up to 1: its normaliser and this sum, 6 terms each
    assert_within(per_head[1].sum(-1), torch.ones(4, 2, 6), float32_tolerance(6 + 6, 1.0, sides=1), "sum to 1")
    assert per_head[1][:, 0, :, :2].abs().max() == 0  # padded keys get no weight


@pytest.mark.numerics
@pytest.mark.parametrize("beam", [1, 4])
@torch.no_grad()
def test_generation_as_fairseq_generate_prepares_it_matches_stock(beam):
    """Models prepared as fairseq-generate prepares them (no attention weights, beamable
    encoder-decoder attention), a left-padded batch whose sentences finish at different steps,
    so that fairseq reorders and shrinks the incremental state (the plugin keeps its
    encoder-decoder mask there) while the others decode on."""
    from fairseq.sequence_generator import SequenceGenerator

    stock, ours = _pair()
    dictionary = stock.decoder.dictionary
    src, lengths, _ = toy_batch(dictionary, [9, 5, 7, 3, 8, 6])
    hyps = []
    for model in (stock, ours):
        model.make_generation_fast_(beamable_mm_beam_size=beam, need_attn=False)
        # </s> as likely as a word: the untrained models end sentences after 2 to 12 words
        model.decoder.output_projection.weight[dictionary.eos()].neg_()
        generator = SequenceGenerator([model], dictionary, beam_size=beam, max_len_b=12)
        hyps.append(generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}}))
    assert len({len(sentence[0]["tokens"]) for sentence in hyps[0]}) > 1  # finished at different steps
    _assert_same_hypotheses(stock, *hyps, beam=beam)
