"""RNN position encoders (FLOATER's Table 6): the paper's sizes, the recurrence, FLOATER's warm start
and kept solution, and one warm-started run through fairseq's CLI. The properties every encoding
keeps (decoding, padding, extrapolation, kept tables after fairseq's Adam) are asserted for rnn by
the registry-derived tests."""
import math
import os

import pytest
import torch
from fairseq.data import Dictionary

from posenc_workflow import pipeline, toy_data
from fairseq_posenc.positions.rnn import RNNPositions
from helpers.fairseq_runs import preprocess_here
from helpers.forward_terms import biases_in_a_forward, floater_state, solved_positions
from helpers.tolerances import assert_within, float32_tolerance, float64_tolerance, magnitude
from helpers.toy import TINY, build_model, full_log_probs, incremental_log_probs, toy_batch, toy_dictionary, with_strong_positions

# (--rnn-layers, --rnn-input): Table 6's three forms
FORMS = [(1, "scalar"), (2, "scalar"), (1, "vector")]


def rnn(layers, inputs, *flags, seed=1, task=None):
    return build_model("transformer_posenc", "--position-encoding", "rnn", "--rnn-layers", str(layers),
                       "--rnn-input", inputs, *flags, seed=seed, task=task)


BASE = ["--encoder-layers", "6", "--decoder-layers", "6", "--encoder-embed-dim", "512", "--decoder-embed-dim", "512",
        "--encoder-attention-heads", "8", "--decoder-attention-heads", "8"]


def _position_parameters(model):
    """Table 6's count: every parameter of the model that serves position, as named in the model
    (the encoder's, the decoder's, fairseq's input embeddings'), less the per-block initial states,
    which the paper's 526.3K for FLOATER leaves out; and the initial states' count."""
    named = {name: p.numel() for name, p in model.named_parameters()
             if "position" in name or "embed_positions" in name}
    initial = sum(n for name, n in named.items() if name.endswith(".initial"))
    return sum(named.values()) - initial, initial


def test_the_models_position_parameters_at_d512_are_table_6s():
    """The base model (6 + 6 layers, d = 512), as the paper counts: the encoder's RNN (or h) only,
    the decoder sharing it, the sinusoidal input embedding without parameters."""
    def count(*flags):
        return _position_parameters(build_model("transformer_posenc", *BASE, *flags))

    states = 36 * 512  # q, k, v of 6 + 6 self-attention blocks
    assert count("--position-encoding", "floater") == (526_336, states)  # the paper's 526.3K
    assert count("--position-encoding", "rnn", "--rnn-layers", "1") == (263_168, states)  # Linear(513 -> 512): 263.2K
    assert count("--position-encoding", "rnn", "--rnn-layers", "2") == (526_336, states)  # two of them: 526.3K
    # Linear(1024 -> 512); the paper prints 1,050.0K (docs/floater.md)
    assert count("--position-encoding", "rnn", "--rnn-input", "vector") == (524_800, states)
    with pytest.raises(ValueError, match=r"--rnn-layers must be 1 or 2 \(Table 6's forms\), got 3"):
        count("--position-encoding", "rnn", "--rnn-layers", "3")


@pytest.mark.parametrize("flags, message", [
    (("--floater-solver", "dopri5"), "--floater-solver dopri5: --position-encoding rnn has no ODE"),
    (("--floater-dt", "0.5"), "--floater-dt 0.5: --position-encoding rnn has no ODE"),
    (("--floater-hidden", "7"), "--floater-hidden 7: --position-encoding rnn has no ODE"),
    (("--floater-adjoint",), "--floater-adjoint True: --position-encoding rnn has no ODE"),
    (("--rnn-input", "vector", "--rnn-dt", "0.5"), "--rnn-dt 0.5: it scales the scalar input"),
])
def test_flags_it_would_ignore_are_refused(flags, message):
    """Every FLOATER flag is in the one parser: an rnn model must not train silently without one."""
    with pytest.raises(Exception) as e:
        rnn(1, "scalar", *flags)
    assert str(e.value).startswith(message), str(e.value)


@pytest.mark.parametrize("layers", [1, 2])
def test_the_biases_sit_where_floaters_do(layers):
    """What the model's attention adds to each q, k, v in a forward is p_i of the recurrence
    (written out in forward_terms.py, float64) from the block's own initial state, laid out as
    FLOATER's: the encoder's blocks, then the decoder's; the decoder reads the encoder's."""
    model = with_strong_positions(rnn(layers, "scalar"))  # 2 + 2 layers: q, k, v of each self-attention
    scheme = model.encoder.position_encoding
    positions = scheme.ode
    assert positions.initial.shape == (3 * 2 + 3 * 2, 32)
    assert model.decoder.position_encoding.solver is positions
    assert not any("decoder.position_encoding" in name for name, _ in model.named_parameters())
    n = 12
    solved = solved_positions(positions, n)
    states = []
    for (side, role, layer), (terms, _) in biases_in_a_forward(model, n).items():
        if role == "cross":
            assert terms == (None, None, None)  # --floater-cross-attention is off
            continue
        for i, term in enumerate(terms):
            state = floater_state(scheme, side, role, layer, i)
            expected = solved[:, state].float()
            # a chain of n tanh steps in float32 against float64, plus the forward's own rounding
            assert_within(term, expected, 1e-5 * magnitude(expected, floor=1), (side, layer, "qkv"[i]))
            states.append(state)
    assert sorted(states) == list(range(12))


def _strong(positions, seed=0):
    """Random initial states of size 1 (their default is 0.02), the layers at their initialisation."""
    with torch.no_grad():
        positions.initial.copy_(torch.randn(positions.initial.shape, generator=torch.Generator().manual_seed(seed)))
    return positions


def _sum_bound(positions, z):
    """What a step's sums pass through: the largest row sum of |[W U b]| times the largest |x| or |z|."""
    rows = max(torch.cat([l.fc.weight, l.z.weight, l.fc.bias[:, None]], 1).abs().sum(1).max().item()
               for l in positions.layers)
    return rows * magnitude(positions.initial, z, floor=1)


@pytest.mark.numerics
@pytest.mark.parametrize("layers,inputs", FORMS)
@torch.no_grad()
def test_the_recurrence_is_a_hand_written_elman_loop(layers, inputs):
    torch.manual_seed(layers)
    positions = _strong(RNNPositions(3, 8, layers, inputs == "vector", dt=0.1))
    n = 40
    z = positions.inputs(0, n, "cpu", torch.float32).double()
    if inputs == "scalar":
        assert torch.equal(z[:, 0], torch.arange(n) * torch.tensor(0.1))  # i dt, FLOATER's time
    else:  # fairseq's input sinusoid of i: its first frequency is 1
        assert_within(z[:, [0, 4]], torch.stack([torch.arange(n).sin(), torch.arange(n).cos()], 1).double(),
                      float32_tolerance(n, 1, sides=1))
    p, expected = positions.initial.double(), [positions.initial.double()]
    for i in range(n - 1):
        for layer in positions.layers:
            w = torch.cat([layer.fc.weight, layer.z.weight], 1).double()  # W [x; z_i] + b
            p = torch.tanh(torch.cat([p, z[i].expand(3, -1)], 1) @ w.t() + layer.fc.bias.double())
        expected.append(p)
    expected = torch.stack(expected)
    got = positions.positions(n)
    assert got.shape == (max(n, 64), 3, 8) and got[1:].abs().max() < 1  # tanh's bound
    # a chain of sums (tolerances.py), against float64: each step sums 8 + inputs + 1 terms per
    # layer on values bounded by the weights' row sums times max(|x|, |z|)
    bound = _sum_bound(positions, z)
    terms = (n - 1) * layers * (8 + z.size(1) + 1)
    assert_within(got[:n], expected.float(), float32_tolerance(terms, bound, sides=1) + float64_tolerance(terms, bound))


@pytest.mark.numerics
@pytest.mark.parametrize("layers,inputs", FORMS)
@torch.no_grad()
def test_a_kept_solution_is_extended_from_its_last_state(layers, inputs):
    torch.manual_seed(layers)
    positions = _strong(RNNPositions(3, 8, layers, inputs == "vector", dt=0.1))
    calls = []
    solve = positions._solve
    positions._solve = lambda y0, start, end: calls.append((start, end)) or solve(y0, start, end)
    short = positions.positions(70).clone()
    extended = positions.positions(300)
    assert calls == [(0, 70), (69, 300)]  # continued from p_69, not from 0
    positions.positions(200)
    assert len(calls) == 2  # solved lengths are read, not recomputed
    loaded = RNNPositions(3, 8, layers, inputs == "vector", dt=0.1)
    loaded.load_state_dict(positions.state_dict())  # a checkpoint carries the solution
    loaded._solve = lambda y0, start, end: calls.append((start, end)) or solve(y0, start, end)
    assert torch.equal(loaded.positions(300), extended) and len(calls) == 2
    fresh = solve(positions.initial, 0, 300)
    assert torch.equal(extended[:70], short)  # the kept rows are copied
    if inputs == "scalar":
        # the input terms are elementwise, the same whatever the range: the same operations on
        # the same data, bit for bit
        assert torch.equal(extended, fresh)
    else:  # z U^T as one matmul over another number of rows may round otherwise, an error
        # carried along the 230 steps of the extension, 8 + 8 + 1 terms per step and layer
        bound = _sum_bound(positions, positions.inputs(0, 300, "cpu", torch.float32))
        assert_within(extended, fresh, float32_tolerance(230 * layers * (8 + 8 + 1), bound))


def _save(model, path):
    torch.save({"model": model.state_dict()}, path)
    return str(path)


def _rnn_parameters(model):
    return dict(model.encoder.position_encoding.ode.named_parameters())


@pytest.mark.parametrize("layers,inputs", FORMS)
def test_warm_start_is_exactly_the_vanilla_model_and_then_learns_every_weight(tmp_path, layers, inputs):
    vanilla = build_model("transformer_posenc", "--dropout", "0.0", seed=5)
    warm = rnn(layers, inputs, "--dropout", "0.0", "--floater-init-from", _save(vanilla, tmp_path / "vanilla.pt"))
    start = {name: p.detach().clone() for name, p in _rnn_parameters(warm).items()}
    zeroed = {"initial", f"layers.{layers - 1}.z.weight", f"layers.{layers - 1}.fc.bias"}
    zeroed |= {"layers.1.fc.weight"} if layers == 2 else set()  # on the first layer's output
    assert {name for name, p in start.items() if p.abs().max() == 0} == zeroed  # the rest stays random

    src, lengths, prev = toy_batch(vanilla.encoder.dictionary, [9, 5, 7], tgt_len=8)
    vanilla.train(), warm.train()
    # every bias is an exact 0 added: the same operations on the same values, bit for bit
    assert torch.equal(full_log_probs(warm, src, lengths, prev), full_log_probs(vanilla, src, lengths, prev))
    vanilla.eval(), warm.eval()
    with torch.no_grad():
        assert torch.equal(incremental_log_probs(warm, src, lengths, prev),
                           incremental_log_probs(vanilla, src, lengths, prev))

    # tanh'(0) = 1: the zeroed weights learn from the first update, the rest from the second
    optimizer = torch.optim.Adam(warm.parameters(), lr=1e-3)
    warm.train()
    for step in range(3):
        optimizer.zero_grad()
        src, lengths, prev = toy_batch(toy_dictionary(), [9, 5, 7], tgt_len=8, seed=step)
        target = torch.roll(prev, -1, dims=1)
        (-full_log_probs(warm, src, lengths, prev).gather(-1, target[..., None]).mean()).backward()
        for name, p in _rnn_parameters(warm).items():
            assert step > 0 or name not in zeroed or p.grad.abs().max() > 0, name
        optimizer.step()
    for name, p in _rnn_parameters(warm).items():
        assert p.grad.abs().max() > 0 and (p.detach() - start[name]).abs().max() > 1e-4, name


@pytest.mark.slow  # fairseq-train
def test_a_warm_started_two_layer_vector_rnn_trains_and_decodes_through_fairseqs_cli(tmp_path):
    prefixes = toy_data.write_toy_corpus(str(tmp_path / "raw"), {"train": (300, 3, 10), "valid": (20, 3, 10),
                                                                 "test": (20, 3, 14)})
    data_bin = preprocess_here(prefixes, str(tmp_path / "bin"))
    dictionary = Dictionary.load(os.path.join(data_bin, "dict.src.txt"))

    class Task:
        source_dictionary = target_dictionary = dictionary

    vanilla = _save(build_model("transformer_posenc", task=Task()), tmp_path / "vanilla.pt")
    vanilla_state = torch.load(vanilla)["model"]
    save_dir = str(tmp_path / "rnn")
    pipeline.train(data_bin, save_dir, [
        "--arch", "transformer_rnn_wmt_en_de", "--rnn-layers", "2", "--rnn-input", "vector", "--floater-init-from",
        vanilla, "--cpu", *TINY, "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500", "--update-freq", "2",
        "--max-update", "6", "--criterion", "label_smoothed_cross_entropy", "--no-epoch-checkpoints",
        "--no-progress-bar", "--seed", "3", "--num-workers", "0",
    ])
    os.remove(vanilla)  # decoding must not warm-start again
    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
    generation = pipeline.generate(data_bin, checkpoint, beam=2)
    assert len(generation.hypotheses) == 20

    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    args = state["cfg"]["model"]
    assert (args.position_encoding, args.rnn_layers, args.rnn_input, args.floater_init_from) == ("rnn", 2, "vector", None)
    assert state["optimizer_history"][-1]["num_updates"] == 6
    prefix = "encoder.position_encoding.ode."
    trained = {k[len(prefix):]: v for k, v in state["model"].items() if k.startswith(prefix)}
    # every weight the warm start zeroed was trained by fairseq's trainer (the rest stays random)
    for name in ("initial", "layers.1.z.weight", "layers.1.fc.bias", "layers.1.fc.weight"):
        assert trained[name].abs().max() > 0, name
    # the model around the RNN is the vanilla one's, trained on: the warm start copied it, and 6
    # Adam steps of lr 1e-3 moved each weight by about 0.006 at most (a new initialisation is
    # uniform in +-0.2 at this size)
    moved = max((state["model"][k] - vanilla_state[k]).abs().max().item() for k in vanilla_state
                if not k.startswith(prefix) and vanilla_state[k].is_floating_point())
    assert 0 < moved < 0.05, moved
    # the checkpoint carries the solution of its final parameters (decoding solves nothing it
    # covers): the recurrence written out (forward_terms.py) from the saved weights
    solution = trained.pop("solution")
    positions = RNNPositions(solution.size(1), solution.size(2), 2, True, dt=0.1)
    positions.load_state_dict(trained, strict=False)  # the weights (no solution: none to reuse)
    assert solution.shape[0] >= 11
    assert_within(solution, solved_positions(positions, solution.size(0)).float(), 1e-4)
    assert solution[1:].abs().max() > 0  # the biases are not the warm start's zeros any more


def test_the_defaults_are_one_layer_on_the_scalar_input_at_dt_0_1():
    """--position-encoding rnn alone, through the model's flags: Table 6's first form, as
    docs/encodings.md gives the defaults (--rnn-layers 1, --rnn-input scalar, --rnn-dt 0.1)."""
    ode = build_model("transformer_posenc", "--position-encoding", "rnn").encoder.position_encoding.ode
    assert (len(ode.layers), ode.vector, ode.dt) == (1, False, 0.1)
    assert ode.layers[0].z.weight.shape[1] == 1  # the scalar i * dt
