"""scripts/plot_positions.py: the arrays it plots are the model's own tables, for every registered
encoding, from a checkpoint (averaged too), marked with the longest input the stacks trained on."""
import numpy as np
import pytest
import torch

from fairseq_posenc.positions import POSITION_ENCODINGS, PositionEncoding
from fairseq_posenc.positions.alibi import alibi_bias, alibi_slopes
from fairseq_posenc.positions.diet_abs import DietAbs
from fairseq_posenc.positions.diet_rel import DietRel
from fairseq_posenc.positions.rope import RotaryPositionEncoding, rope_angles
from fairseq_posenc.positions.xpos import XPos, xpos_factors
from fairseq_posenc.positions.t5 import T5Bias, relative_position_bucket
from helpers.forward_terms import attention_biases_in_a_forward, biases_in_a_forward, floater_state, solved_positions
from helpers.scripts import script
from helpers.tolerances import assert_within, float32_tolerance, magnitude
from helpers.toy import build_model, toy_batch, with_strong_positions
from helpers.fairseq_runs import preprocess_here

average_checkpoints = script("average_checkpoints")
plot_positions = script("plot_positions")

N = 20


def _expected(model, n):
    """(side, what, layer) -> the table as the model holds it, over n positions / offsets."""
    tables, recorded = {}, None
    for side, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
        scheme = stack.position_encoding
        embed = stack.embed_positions
        if embed is not None:
            table = embed.weights if hasattr(embed, "weights") else embed.weight
            rows = min(n, getattr(embed, "max_positions", n) or n)
            tables[side, "input position embedding", None] = table[embed.padding_idx + 1:][:rows]
        offsets = torch.arange(-(n - 1), 1 if scheme.causal else n)
        if hasattr(scheme, "block_tables"):  # learned, --position-blocks all: a table per later block
            for layer, table in enumerate(scheme.block_tables, 1):
                tables[side, "term added to the layer's input", layer] = table.weight[table.padding_idx + 1:][:n]
        elif hasattr(scheme, "depth"):  # sinusoidal, --position-blocks all: s(i) + s(n) (s(i) at block 1: the input's)
            for layer in range(scheme.num_layers):
                timing = tables[side, "input position embedding", None] if layer else 0
                term = timing + scheme.depth[layer + 1]
                tables[side, "term added to the layer's input", layer] = term.expand(n, -1)
        if hasattr(scheme, "solver"):  # FLOATER and RNN: what their attention adds in a forward, not the
            # solution the plot reads (test_floater_and_rnn_plot_the_solution_of_their_equations checks its values)
            for (where, role, layer), (terms, bound) in biases_in_a_forward(model, n).items():
                for p, term in zip("qkv", terms):
                    if where == side and term is not None:
                        tables[side, f"{role}-attention {p} bias", layer] = (term, bound)
        for layer in range(0 if hasattr(scheme, "solver") else scheme.num_layers):
            if hasattr(scheme, "rel_k"):
                tables[side, "Shaw a^K (key term)", layer] = scheme.rel_k[layer]
                tables[side, "Shaw a^V (value term)", layer] = scheme.rel_v[layer]
            elif isinstance(scheme, T5Bias):
                buckets = relative_position_bucket(offsets, not scheme.causal, scheme.num_buckets, scheme.max_distance)
                tables[side, "attention bias by offset", layer] = scheme.bias.weight[buckets].t() * scheme.bias_scale
            elif isinstance(scheme, DietRel):
                group, k = (0 if scheme.sharing == "layers" else layer), scheme.max_distance
                bias = scheme.weight[group][:, (-offsets).clamp(-k, k) + k] * scheme.bias_scale
                tables[side, "attention bias by offset", layer] = bias.expand(scheme.num_heads, -1)
            elif type(scheme).__name__ == "ALiBi":
                tables[side, "attention bias by offset", layer] = alibi_bias(alibi_slopes(scheme.num_heads), offsets,
                                                                             scheme.bias_form)
            elif isinstance(scheme, DietAbs):
                group, s = (0 if scheme.sharing == "layers" else layer), scheme.bias_scale
                m = min(n, scheme.max_positions)
                square = torch.einsum("qhr,khr->hqk", scheme.p_q[group, :m] * s, scheme.p_k[group, :m] * s)
                tables[side, "attention bias", layer] = square.expand(scheme.num_heads, m, m)
            elif isinstance(scheme, XPos) and scheme.scaled:  # q and k rotated, then scaled apart
                angles = rope_angles(torch.arange(n), scheme.head_dim, scheme.theta)[:, : scheme.head_dim // 2]
                factors = xpos_factors(torch.arange(n), scheme.head_dim, scheme.gamma, scheme.scale_base,
                                       torch.float32)[:, :, : scheme.head_dim // 2]
                for p, factor in zip("qk", factors):
                    rows = torch.cat([angles.cos() * factor, angles.sin() * factor], 1)
                    tables[side, f"rotation of {p} (cos | sin)", layer] = rows
            elif isinstance(scheme, RotaryPositionEncoding):
                angles = rope_angles(torch.arange(n), scheme.head_dim, scheme.theta)[:, : scheme.head_dim // 2]
                tables[side, "rotation of q and k (cos | sin)", layer] = torch.cat([angles.cos(), angles.sin()], 1)
            elif type(scheme).attention_bias is not PositionEncoding.attention_bias:
                # an encoding without a formula here: the bias its own forward adds (so a new one
                # needs no edit; one with another kind of table, a rotation say, needs a branch above)
                recorded = recorded or attention_biases_in_a_forward(model, n)
                for what, table in _by_offset(recorded[side, layer], scheme.causal):
                    tables[side, what, layer] = table
    return tables


def _by_offset(square, causal):
    """[("attention bias by offset", (H, offsets))] where the (H, n, n) bias depends on the offset
    key - query only (-(n - 1) .. n - 1, or .. 0 where causal), else [("attention bias", square)]."""
    n = square.size(-1)
    offsets = torch.arange(-(n - 1), n)
    rows = torch.stack([square[:, max(0, -o), max(0, -o) + o] for o in offsets.tolist()], 1)
    if torch.equal(square, rows[:, torch.arange(n)[None, :] - torch.arange(n)[:, None] + n - 1]):
        return [("attention bias by offset", rows[:, :n] if causal else rows)]
    return [("attention bias", square)]


def _check_against_the_model(model, arrays, n=N):
    expected = _expected(model, n)
    checked = set()
    for name, entry in arrays.items():
        for side, layer in entry.where:
            key = next((k for k in expected if k[0] == side and k[2] == layer and name.endswith(k[1])), None)
            assert key is not None, f"{name}: no table of the model to check it against (add one to _expected)"
            table = expected[key]
            if isinstance(table, tuple):  # a difference of two projections: rounded once each
                table, bound = table
                assert entry.array.shape == tuple(table.shape), name
                assert np.abs(entry.array - table.numpy()).max() <= bound, name
                checked.add(key)
                continue
            table = table.detach().float()
            # DIET-ABS's P_Q P_K^T: a sum of rank products, in another order than the model's
            if key[1] == "attention bias" and isinstance(model.encoder.position_encoding, DietAbs):
                tolerance = float32_tolerance(model.encoder.position_encoding.rank, magnitude(table) ** 2)
                assert_within(torch.from_numpy(entry.array), table, tolerance, name)
            else:  # gathered from the model's tables, or computed elementwise as the model does: exactly
                assert np.array_equal(entry.array, table.numpy()), name
            checked.add(key)
    assert checked == set(expected), f"tables not plotted: {sorted(set(expected) - checked)}"


@pytest.mark.slow  # matplotlib, 10-50 s each
@pytest.mark.parametrize("encoding", list(POSITION_ENCODINGS))
def test_the_plotted_arrays_are_the_models_own_tables(encoding, tmp_path):
    model = with_strong_positions(build_model("transformer_posenc", "--position-encoding", encoding))
    arrays = plot_positions.position_arrays(model, N)
    _check_against_the_model(model, arrays)
    panels = plot_positions.plot(arrays, str(tmp_path / "p.png"), encoding)
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (panels == 0) == (encoding == "none") == (not arrays)


@pytest.mark.slow  # about 10 s each
@pytest.mark.parametrize("encoding", ["floater", "rnn"])
def test_floater_and_rnn_plot_the_solution_of_their_equations(encoding):
    """Each plotted q, k, v bias is p_i of its block's state, solved here from the equations (a
    float64 adaptive solve of FLOATER's ODE, the RNN's recurrence by hand), the states laid out
    as FLOATER's: not read from the scheme's solution or its state index, which the plot calls."""
    model = with_strong_positions(build_model("transformer_posenc", "--position-encoding", encoding))
    scheme = model.encoder.position_encoding
    solved = solved_positions(scheme.solver, N)
    arrays = plot_positions.position_arrays(model, N)
    seen = set()
    for name, entry in arrays.items():
        if "-attention " not in name:
            continue  # fairseq's sinusoidal input embedding (checked above)
        role, p = name.split("-attention ")[0].split()[-1], name.split("-attention ")[1][0]
        for side, layer in entry.where:
            state = floater_state(scheme, side, role, layer, "qkv".index(p))
            expected = solved[:, state].float()
            # float32 against float64: FLOATER's rk4 (step dt / 5) and each RNN step round by a few u
            assert_within(torch.from_numpy(entry.array), expected, 1e-4 * magnitude(expected, floor=1), name)
            seen.add(state)
    assert seen == set(range(scheme.solver.initial.size(0)))  # every state plotted, each once


@pytest.mark.parametrize("encoding", ["sinusoidal", "learned"])
def test_an_encoder_at_every_block_is_plotted_per_block(encoding):
    model = build_model("transformer_posenc", "--position-encoding", encoding, "--position-blocks", "all")
    arrays = plot_positions.position_arrays(model, N)
    _check_against_the_model(model, arrays)
    assert len(arrays) == (3 if encoding == "sinusoidal" else 4)  # the same sinusoids in both stacks


def test_shared_tables_are_shown_once_and_per_block_ones_per_block():
    names = {e: set(plot_positions.position_arrays(build_model("transformer_posenc", "--position-encoding", e), N))
             for e in ("sinusoidal", "learned", "t5", "diet_rel", "rope")}
    assert names["sinusoidal"] == {"encoder+decoder input position embedding"}
    assert names["learned"] == {"encoder input position embedding", "decoder input position embedding"}
    # T5: one table per stack for all its layers; DIET-REL (not shared by default): one per layer
    assert names["t5"] == {"encoder layers 0-1 attention bias by offset", "decoder layers 0-1 attention bias by offset"}
    assert len(names["diet_rel"]) == 4
    assert names["rope"] == {"encoder+decoder layers 0-1 rotation of q and k (cos | sin)"}


def test_tables_bound_to_their_length_end_there():
    arrays = plot_positions.position_arrays(build_model("transformer_posenc", "--position-encoding", "diet_abs",
                                                        max_positions=16), 40)
    assert all(e.array.shape == (4, 16, 16) for e in arrays.values())


def test_a_stack_records_its_longest_input_while_training_only():
    model = build_model("transformer_posenc", "--dropout", "0.0")
    fresh = build_model("transformer_posenc", "--dropout", "0.0")
    # an untrained model does not save it: its state dict stays fairseq's transformer's
    assert not any(k.endswith("longest_trained") for k in model.state_dict())
    model.train()
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=8)
    model(src, lengths, prev)
    model(*toy_batch(model.encoder.dictionary, [4], tgt_len=3))
    model.eval()
    model(*toy_batch(model.encoder.dictionary, [12], tgt_len=11))  # validation and decoding do not count
    assert (int(model.encoder.longest_trained), int(model.decoder.longest_trained)) == (9, 8)
    state = model.state_dict()
    assert state["encoder.longest_trained"].dtype == torch.int64 and int(state["decoder.longest_trained"]) == 8
    fresh.load_state_dict(state, strict=True)
    assert int(fresh.encoder.longest_trained) == 9
    old = {k: v for k, v in state.items() if not k.endswith("longest_trained")}
    fresh.load_state_dict(old, strict=True)  # a checkpoint from before the record: unknown
    assert int(fresh.encoder.longest_trained) == 0 and int(fresh.decoder.longest_trained) == 0
    model.half()
    assert model.encoder.longest_trained.dtype == torch.int64


def test_averaging_keeps_the_longest_of_the_checkpoints(tmp_path):
    for i, (longest, w) in enumerate(((7, 1.0), (12, 3.0), (9, 5.0))):
        torch.save({"model": {"encoder.longest_trained": torch.tensor(longest), "w": torch.tensor([w]),
                              "version": torch.tensor([i])}}, tmp_path / f"c{i}.pt")
    average_checkpoints.main(["--inputs", *(str(tmp_path / f"c{i}.pt") for i in range(3)),
                              "--output", str(tmp_path / "avg.pt")])
    avg = torch.load(tmp_path / "avg.pt", map_location="cpu")["model"]
    assert int(avg["encoder.longest_trained"]) == 12 and avg["encoder.longest_trained"].dtype == torch.int64
    assert float(avg["w"]) == 3.0 and int(avg["version"]) == 0  # the newest (the first given)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two epochs of fairseq-train (FLOATER, tiny) on a toy corpus: every training pair is seen."""
    from posenc_workflow import pipeline, toy_data

    root = tmp_path_factory.mktemp("plot_positions")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (200, 3, 8), "valid": (20, 3, 12)})
    data_bin = preprocess_here(prefixes, str(root / "bin"))
    save_dir = root / "checkpoints"
    flags = pipeline.toy_train_flags("floater", max_update=100, size="tiny", max_tokens=500)
    pipeline.train(data_bin, str(save_dir), flags + ["--max-epoch", "2", "--floater-step", "0.1"])
    longest = {side: max(len(line.split()) for line in open(f"{prefixes['train']}.{ext}")) + 1  # + end of sentence
               for side, ext in (("encoder", "src"), ("decoder", "tgt"))}
    averaged = str(root / "averaged.pt")
    average_checkpoints.main(["--inputs", str(save_dir), "--num-epoch-checkpoints", "2", "--output", averaged])
    return {"save_dir": save_dir, "averaged": averaged, "longest": longest, "root": root}


@pytest.mark.slow  # fairseq-train
def test_the_checkpoint_records_the_longest_training_input(trained):
    for path in (trained["save_dir"] / "checkpoint1.pt", trained["save_dir"] / "checkpoint2.pt", trained["averaged"]):
        state = torch.load(path, map_location="cpu", weights_only=False)["model"]
        # the longest training pair has 8 source words and as many target ones (the valid set's
        # 12 are not training)
        assert {side: int(state[f"{side}.longest_trained"]) for side in ("encoder", "decoder")} \
            == trained["longest"] == {"encoder": 9, "decoder": 9}, path


@pytest.mark.slow  # fairseq-train
def test_an_averaged_checkpoint_plots_its_own_tables_marked_at_the_longest_input(trained, capsys):
    model, _ = plot_positions.load_model(trained["averaged"])
    arrays = plot_positions.position_arrays(model, N)
    _check_against_the_model(model, arrays)
    assert {e.longest for e in arrays.values()} == {9}
    assert plot_positions.default_length(model) == 18
    out = trained["root"] / "positions.png"
    plot_positions.main(["--path", trained["averaged"], "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"| wrote {out}: 13 panels (encoder+decoder input position embedding, encoder layer 0 self-attention q" \
           in capsys.readouterr().err


@pytest.mark.slow  # fairseq-train
def test_a_checkpoint_from_before_the_record_loads_and_says_so(trained, tmp_path):
    state = torch.load(trained["save_dir"] / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    state["model"] = {k: v for k, v in state["model"].items() if not k.endswith("longest_trained")}
    torch.save(state, tmp_path / "old.pt")
    model, _ = plot_positions.load_model(str(tmp_path / "old.pt"))  # fairseq loads strictly
    assert plot_positions.default_length(model) == 64
    assert {e.longest for e in plot_positions.position_arrays(model, N).values()} == {0}


def test_bad_input_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        plot_positions.main(["--path", str(tmp_path / "missing.pt"), "--out", str(tmp_path / "p.png")])
    assert exit_.value.code == 2 and capsys.readouterr().err.strip().endswith(f"no checkpoint at {tmp_path}/missing.pt")
    torch.save({"model": {}}, tmp_path / "bare.pt")
    with pytest.raises(SystemExit) as exit_:
        plot_positions.main(["--path", str(tmp_path / "bare.pt"), "--out", str(tmp_path / "p.png")])
    assert exit_.value.code == 2 and "cannot load" in capsys.readouterr().err
