"""--position-blocks: FLOATER's Table 2, position encoders at every block or at the input block only.

Each form against its equation on a small model, step-by-step decoding against a full forward,
the refusal where the flag means nothing, and one fairseq-train + fairseq-generate run.
"""
import math

import pytest
import torch

from posenc_workflow import pipeline, toy_data
from fairseq_posenc.compat import PosencError
from fairseq_posenc.models import from_flags
from helpers.tolerances import assert_within, encoder_terms, float32_tolerance, magnitude, transformer_terms
from helpers.fairseq_runs import preprocess_here
from helpers.toy import TINY, ToyTask, build_model, full_log_probs, incremental_log_probs, model_that_saved, toy_batch, \
    with_strong_positions

THREE_LAYERS = ["--encoder-layers", "3", "--decoder-layers", "3"]
ALL_FORMS = [("sinusoidal", "all"), ("learned", "all"), ("floater", "input")]


def model_for(encoding, blocks=None):
    given = ["--position-blocks", blocks] if blocks else []
    return with_strong_positions(build_model("transformer_posenc", "--position-encoding", encoding, *given,
                                             *THREE_LAYERS))


def frequencies(dim):
    """fairseq's sinusoidal frequencies w_k = 10000^(-k / (h - 1)), h = d / 2 (the paper's c^(j/d),
    c = 1e-4, with h - 1 for h), in float64."""
    h = dim // 2
    return 10000.0 ** (-torch.arange(h, dtype=torch.float64) / (h - 1))


def eq6(i, dim):
    """FLOATER's Eq. 6 (the input embedding) in fairseq's layout: the sines, then the cosines."""
    iw = torch.as_tensor(i, dtype=torch.float64)[:, None] * frequencies(dim)
    return torch.cat([torch.sin(iw), torch.cos(iw)], dim=1)


def eq7(i, n, dim):
    """FLOATER's Eq. 7 at block n, in the layout of Eq. 6: (len(i), d)."""
    iw = torch.as_tensor(i, dtype=torch.float64)[:, None] * frequencies(dim)
    nw = n * frequencies(dim)
    return torch.cat([torch.sin(iw) + torch.sin(nw), torch.cos(iw) + torch.cos(nw)], dim=1)


def block_inputs(model, src, lengths, prev):
    """Per stack, per block: (what the layer was given, what its self-attention was given), (T, B, C).
    In a post-LN layer its self-attention's query is the block's input Phi^(n)(x) itself."""
    seen = {"encoder": [], "decoder": []}
    handles = []
    for side in seen:
        for layer in getattr(model, side).layers:
            record = {}
            seen[side].append(record)
            handles.append(layer.register_forward_pre_hook(
                lambda m, args, kwargs, r=record: r.__setitem__("x", args[0]), with_kwargs=True))
            handles.append(layer.self_attn.register_forward_pre_hook(
                lambda m, args, kwargs, r=record: r.__setitem__("query", kwargs["query"]), with_kwargs=True))
    try:
        model(src, lengths, prev)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def fairseq_positions(src, lengths, prev, padding_idx):
    """fairseq's position numbers of the real tokens, counted from the first real one of each
    left-padded source: [(stack, batch index, column, position)]."""
    rows = []
    for b, n in enumerate(lengths.tolist()):
        start = src.size(1) - n
        rows += [("encoder", b, start + t, padding_idx + 1 + t) for t in range(n)]
        rows += [("decoder", b, t, padding_idx + 1 + t) for t in range(prev.size(1))]
    return rows


def added_terms(model, src, lengths, prev):
    """Per stack and block n (from 1): the term added to the real tokens' input of block n, and the
    positions it was added at: {(stack, n): (added (R, C), fairseq positions (R,))}. Block 1's is
    taken from the token embedding, so that it holds fairseq's input embedding too."""
    seen = block_inputs(model, src, lengths, prev)
    rows = fairseq_positions(src, lengths, prev, model.encoder.padding_idx)
    terms = {}
    for side, tokens in (("encoder", src), ("decoder", prev)):
        stack = getattr(model, side)
        mine = [(b, t, i) for s, b, t, i in rows if s == side]
        index_b, index_t, positions = (torch.tensor(v) for v in zip(*mine))
        tokens_embedded = (stack.embed_scale * stack.embed_tokens(tokens)).transpose(0, 1)
        for n, record in enumerate(seen[side], start=1):
            before = tokens_embedded if n == 1 else record["x"]
            added = record["query"] - before
            terms[side, n] = (added[index_t, index_b].double(), positions, record["query"].abs().max().item())
    return terms


@pytest.mark.numerics
@torch.no_grad()
def test_sinusoidal_at_every_block_adds_eq7_with_its_block_index():
    model = model_for("sinusoidal", "all")
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=6)
    terms = added_terms(model, src, lengths, prev)
    assert sorted(terms) == [(side, n) for side in ("decoder", "encoder") for n in (1, 2, 3)]
    for (side, n), (added, positions, largest) in terms.items():
        # fairseq's float32 angles i * w: w = exp(-k ln(1e4) / (h - 1)) is off by up to
        # (ln(1e4) + 2) eps relatively, the product by one eps more, so sin(i w) by about 12 i eps
        # (w <= 1), and likewise sin(n w); then p is added to x and x taken off again (2 roundings
        # on values up to ``largest``)
        tolerance = float32_tolerance(12 * (positions.max().item() + n) + 4, 1, sides=1) \
            + float32_tolerance(2, largest, sides=1)
        assert_within(added, eq7(positions, n, 32), tolerance, f"{side} block {n}")
    # the input-only model (the default) adds nothing past block 1, and only s(i) there
    plain = added_terms(model_for("sinusoidal"), src, lengths, prev)
    for (side, n), (added, positions, largest) in plain.items():
        want = eq6(positions, 32) if n == 1 else torch.zeros_like(added, dtype=torch.float64)
        assert_within(added, want, float32_tolerance(12 * positions.max().item() + 4, 1, sides=1)
                      + float32_tolerance(2, largest, sides=1), f"input only: {side} block {n}")


@pytest.mark.numerics
@torch.no_grad()
def test_learned_at_every_block_adds_its_own_table_per_block():
    model = model_for("learned", "all")
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=6)
    for (side, n), (added, positions, largest) in added_terms(model, src, lengths, prev).items():
        stack = getattr(model, side)
        table = stack.embed_positions if n == 1 else stack.position_encoding.block_tables[n - 2]
        # p added to x and x taken off again: 2 roundings
        assert_within(added, table.weight[positions].double(), float32_tolerance(2, largest, sides=1),
                      f"{side} block {n}")


def position_parameters(model):
    return sum(p.numel() for name, p in model.named_parameters() if "position" in name)


def test_learned_at_every_block_has_n_tables_of_lmax_by_d():
    rows = 64 + 2  # --max-*-positions, and fairseq's rows up to its padding index
    every = model_for("learned", "all")
    assert [len(s.position_encoding.block_tables) for s in (every.encoder, every.decoder)] == [2, 2]
    assert position_parameters(every) == 2 * 3 * rows * 32  # 2 stacks x N = 3 blocks x L x d
    assert position_parameters(model_for("learned")) == 2 * rows * 32
    # Transformer base (d 512, 6 + 6 blocks, 1024 positions): 12 tables of 1026 x 512
    base = from_flags.build_from_flags("transformer_posenc_wmt_en_de", [
        "--position-encoding", "learned", "--position-blocks", "all"], ToyTask(), max_positions=1024)
    assert position_parameters(base) == 12 * 1026 * 512 == 6_303_744


@pytest.mark.numerics
@torch.no_grad()
def test_floater_at_the_input_block_biases_block_1_only():
    model = model_for("floater", "input")
    ode = model.encoder.position_encoding.ode
    assert ode.initial.shape == (3 + 3, 32)  # q, k, v of block 1 of the encoder and of the decoder
    assert model_for("floater").encoder.position_encoding.ode.initial.shape == (3 * 3 + 3 * 3, 32)
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=6)
    calls = []
    for stack in (model.encoder, model.decoder):
        scheme = stack.position_encoding
        original = scheme.transform_qkv

        def recording(layer, role, q, k, v, pos, original=original, side=stack):
            out = original(layer, role, q, k, v, pos)
            calls.append((side is model.encoder, layer, role, (q, k, v), out))
            return out

        scheme.transform_qkv = recording
    model(src, lengths, prev)
    # encoder and decoder self-attention, 3 blocks each; encoder-decoder attention does not call a
    # FLOATER without --floater-cross-attention (PositionEncoding.acts_through)
    assert len(calls) == 3 + 3 and {role for *_, role, _, _ in calls} == {"self"}
    for encoder, layer, role, given, out in calls:
        if layer >= 1:
            assert all(a is b for a, b in zip(out, given)), (encoder, layer, role)  # p^(n) = 0, n >= 2
        else:
            assert all((a - b).abs().max() > 0.01 for a, b in zip(out, given)), (encoder, layer, role)


@pytest.mark.numerics
@pytest.mark.parametrize("encoding,blocks", ALL_FORMS)
@torch.no_grad()
def test_incremental_decoding_matches_a_full_forward(encoding, blocks):
    model = model_for(encoding, blocks)
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=8)
    full = full_log_probs(model, src, lengths, prev)
    tolerance = float32_tolerance(transformer_terms(model, 9, 8), magnitude(full, floor=1))
    assert_within(incremental_log_probs(model, src, lengths, prev), full, tolerance)


@pytest.mark.numerics
@pytest.mark.parametrize("encoding,blocks", ALL_FORMS)
@torch.no_grad()
def test_left_padding_changes_nothing(encoding, blocks):
    model = model_for(encoding, blocks)
    src, lengths, _ = toy_batch(model.encoder.dictionary, [9, 5, 7])
    batch = model.encoder(src, lengths)["encoder_out"][0]
    tolerance = float32_tolerance(encoder_terms(model, 9), magnitude(batch, floor=1))
    for b, n in enumerate(lengths.tolist()):
        alone = model.encoder(src[b: b + 1, -n:], lengths[b: b + 1])["encoder_out"][0][:, 0]
        assert_within(alone, batch[-n:, b], tolerance, f"sentence {b}")


def test_the_defaults_are_the_encodings_own_and_unchanged():
    for encoding, default in (("sinusoidal", "input"), ("learned", "input"), ("floater", "all")):
        model = build_model("transformer_posenc", "--position-encoding", encoding)
        assert model.encoder.position_encoding.position_blocks == default
        # the default given explicitly is the same model, parameter for parameter
        explicit = build_model("transformer_posenc", "--position-encoding", encoding, "--position-blocks", default)
        assert list(explicit.state_dict()) == list(model.state_dict())
        assert all(torch.equal(a, b) for a, b in zip(explicit.state_dict().values(), model.state_dict().values()))


@pytest.mark.parametrize("encoding,blocks", [("t5", "all"), ("rope", "input"), ("none", "all")])
def test_where_it_means_nothing_the_flag_is_refused_in_one_line(encoding, blocks):
    with pytest.raises(PosencError) as error:
        build_model("transformer_posenc", "--position-encoding", encoding, "--position-blocks", blocks)
    message = str(error.value)
    assert message.startswith(f"--position-blocks {blocks}: --position-encoding {encoding} has no position "
                              "encoder to place at the input or at every block (only sinusoidal, learned, floater")
    assert "\n" not in message


def _hypotheses(text):
    """{sentence id: (hypothesis words, positional scores in bits)} of fairseq-generate's output."""
    words, scores = {}, {}
    for line in text.splitlines():
        if line.startswith("H-"):
            idx, _, hypothesis = line[2:].split("\t")
            words[int(idx)] = hypothesis
        elif line.startswith("P-"):
            idx, values = line[2:].split("\t", 1)
            scores[int(idx)] = [float(x) for x in values.split()]
    return {i: (words[i], scores[i]) for i in words}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("blocks")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (200, 3, 10), "valid": (20, 3, 10),
                                                              "test": (8, 3, 10)})
    return prefixes, preprocess_here(prefixes, str(root / "data" / "data-bin"))


@pytest.mark.fast_run  # the inner loop's one fairseq-train run (make test-fast)
def test_sinusoidal_at_every_block_through_fairseq_train_and_generate(corpus, tmp_path):
    """The flag reaches the checkpoint, and fairseq-generate's beam search (step by step) scores
    each hypothesis as a full forward of the reloaded every-block model does."""
    prefixes, data_bin = corpus
    pipeline.train(data_bin, str(tmp_path / "run"), [
        "--arch", "transformer_posenc", "--position-encoding", "sinusoidal", "--position-blocks", "all", "--cpu",
        *TINY, "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "1000", "--max-update", "10",
        "--no-epoch-checkpoints", "--no-progress-bar", "--seed", "3", "--num-workers", "0"])
    checkpoint = str(tmp_path / "run" / "checkpoint_last.pt")
    out = pipeline.run([pipeline.executable("fairseq-generate"), data_bin, "--user-dir", pipeline.USER_DIR,
                        "--path", checkpoint, "--beam", "4", "--batch-size", "8"],
                       str(tmp_path / "generate.log"), capture_stdout=True)
    hypotheses = _hypotheses(out)
    assert sorted(hypotheses) == list(range(8))

    model, dictionary = model_that_saved(checkpoint, data_bin)
    assert torch.load(checkpoint, map_location="cpu")["cfg"]["model"].position_blocks == "all"
    assert model.encoder.position_encoding.position_blocks == model.decoder.position_encoding.position_blocks == "all"
    with open(prefixes["test"] + ".src") as f:
        sources = f.read().splitlines()

    def rescore(idx):
        words, _ = hypotheses[idx]
        src = dictionary.encode_line(sources[idx], add_if_not_exist=False).long()[None]
        target = dictionary.encode_line(words, add_if_not_exist=False).long()[None]
        prev = torch.cat([target.new_tensor([[dictionary.eos()]]), target[:, :-1]], dim=1)
        lprobs = full_log_probs(model, src, torch.tensor([src.size(1)]), prev)
        bits = lprobs[0].gather(-1, target[0, :, None])[:, 0].double() / math.log(2)
        return bits, lprobs, src.size(1), target.size(1)

    moved = 0.0
    with torch.no_grad():
        for idx, (_, printed) in hypotheses.items():
            rescored, lprobs, source_len, target_len = rescore(idx)
            # printed with 4 decimals; a float32 forward in a batch of 8 against this one alone
            tolerance = 0.5e-4 + float32_tolerance(transformer_terms(model, source_len, target_len),
                                                   magnitude(lprobs, floor=1)) / math.log(2)
            assert_within(torch.tensor(printed, dtype=torch.float64), rescored, tolerance, f"sentence {idx}")
        # the same weights with the encoder at the input block only score otherwise: the blocks count
        for stack in (model.encoder, model.decoder):
            stack.position_encoding.position_blocks = "input"
        for idx, (_, printed) in hypotheses.items():
            moved = max(moved, (rescore(idx)[0] - torch.tensor(printed)).abs().max().item())
    assert moved > 1e-2
