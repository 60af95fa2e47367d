"""RNN position encoders (FLOATER's Table 6): the paper's sizes, the recurrence, FLOATER's warm start
and kept solution, and one warm-started run through fairseq's CLI. The properties every encoding
keeps (decoding, padding, extrapolation, kept tables after fairseq's Adam) are asserted for rnn by
the registry-derived tests."""
import math
import os

import pytest
import fairseq_cli.preprocess
import torch
from fairseq import options
from fairseq.data import Dictionary

from fairseq_posenc import pipeline, toy_data
from fairseq_posenc.positions.rnn import RNNPositions
from tolerances import assert_within, float32_tolerance, float64_tolerance, magnitude
from toy import TINY, build_model, full_log_probs, incremental_log_probs, toy_batch, toy_dictionary

# (--rnn-layers, --rnn-input): Table 6's three forms
FORMS = [(1, "scalar"), (2, "scalar"), (1, "vector")]


def rnn(layers, inputs, *flags, seed=1, task=None):
    return build_model("transformer_posenc", "--position-encoding", "rnn", "--rnn-layers", str(layers),
                       "--rnn-input", inputs, *flags, seed=seed, task=task)


def test_parameters_at_d512_are_table_6s_where_a_layer_is_one_linear_map():
    def count(layers, vector):
        positions = RNNPositions(36, 512, layers, vector, dt=0.1)
        assert positions.initial.shape == (36, 512)  # per-block states, excluded as in the paper's 526.3K
        return sum(p.numel() for name, p in positions.named_parameters() if name != "initial")

    assert count(1, False) == 263_168  # Linear(513 -> 512): the paper's 263.2K
    assert count(2, False) == 526_336  # two of them: its 526.3K, FLOATER's h
    assert count(1, True) == 524_800  # Linear(1024 -> 512); the paper prints 1,050.0K (docs/floater.md)
    with pytest.raises(ValueError, match="--rnn-layers must be 1 or 2"):
        RNNPositions(36, 512, 3, False, dt=0.1)


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


def test_the_biases_sit_where_floaters_do():
    model = rnn(1, "scalar")  # 2 + 2 layers: q, k, v of each self-attention
    positions = model.encoder.position_encoding.ode
    assert positions.initial.shape == (3 * 2 + 3 * 2, 32)
    assert model.decoder.position_encoding.solver is positions
    assert not any("decoder.position_encoding" in name for name, _ in model.named_parameters())


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


def test_a_warm_started_two_layer_vector_rnn_trains_and_decodes_through_fairseqs_cli(tmp_path):
    prefixes = toy_data.write_toy_corpus(str(tmp_path / "raw"), {"train": (300, 3, 10), "valid": (20, 3, 10),
                                                                 "test": (20, 3, 14)})
    data_bin = str(tmp_path / "bin")  # fairseq-preprocess in this process: fairseq is imported already
    fairseq_cli.preprocess.main(options.get_preprocessing_parser().parse_args([
        "--source-lang", "src", "--target-lang", "tgt", "--trainpref", prefixes["train"], "--validpref",
        prefixes["valid"], "--testpref", prefixes["test"], "--destdir", data_bin, "--joined-dictionary", "--workers", "1"]))
    dictionary = Dictionary.load(os.path.join(data_bin, "dict.src.txt"))

    class Task:
        source_dictionary = target_dictionary = dictionary

    vanilla = _save(build_model("transformer_posenc", task=Task()), tmp_path / "vanilla.pt")
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
    prefix = "encoder.position_encoding.ode."
    # the output layer, zeroed by the warm start, was trained by fairseq's trainer
    assert state["model"][prefix + "layers.1.fc.weight"].abs().max() > 0
    # the checkpoint carries the solution of its parameters: decoding solves nothing it covers
    assert state["model"][prefix + "solution"].shape[0] >= 11 and math.isfinite(state["model"][prefix + "solution"].sum())
