"""FLOATER: the paper's sizes, the warm start, and one ODE solve where the design promises one."""
import math
from types import SimpleNamespace

import pytest
import torch

from fairseq_posenc.compat import PosencError
from fairseq_posenc.positions import AttentionPositions
from fairseq_posenc.positions.floater import Dynamics, FloaterODE
from helpers.tolerances import assert_within, float32_tolerance, magnitude, transformer_terms
from helpers.toy import build_model, full_log_probs, incremental_log_probs, toy_batch, toy_dictionary, with_strong_positions


def floater(*flags, seed=1):
    return build_model("transformer_posenc", "--position-encoding", "floater", *flags, seed=seed)


def test_dynamics_have_the_papers_526k_parameters_at_d512():
    ode = FloaterODE(num_states=48, dim=512, hidden=512, dt=0.1, solver="rk4", step=None, adjoint=False)
    assert sum(p.numel() for p in ode.dynamics.parameters()) == 526_336  # the paper's 526.3K
    assert ode.initial.shape == (48, 512)  # 6 x (q, k, v) + 6 x (q, k, v) + 6 x (k, v) with cross-attention
    assert ode.step == pytest.approx(0.02)  # dt / 5


def test_one_ode_holds_every_block_and_is_shared_by_the_decoder():
    model = floater()  # 2 + 2 layers
    ode = model.encoder.position_encoding.ode
    assert ode.initial.shape == (3 * 2 + 3 * 2, 32)  # q, k, v of each self-attention (the paper's Eq. 12)
    assert model.decoder.position_encoding.solver is ode
    assert not any("decoder.position_encoding" in name for name, _ in model.named_parameters())
    crossed = floater("--floater-cross-attention")
    assert crossed.encoder.position_encoding.ode.initial.shape == (3 * 2 + 5 * 2, 32)  # and k, v of each cross


@pytest.mark.numerics
@torch.no_grad()
def test_cross_attention_is_biased_only_with_the_flag():
    src, lengths, prev = toy_batch(toy_dictionary(), [9, 5, 7], tgt_len=8)
    plain = with_strong_positions(floater())
    q = k = v = torch.randn(3, 4, 9, 8)
    pos = AttentionPositions.build(9, 9, None, torch.device("cpu"))
    out = plain.decoder.position_encoding.transform_qkv(0, "cross", q, k, v, pos)
    assert all(a is b for a, b in zip(out, (q, k, v)))  # the paper's Eq. 12: self-attention only

    crossed = with_strong_positions(floater("--floater-cross-attention"))
    before = full_log_probs(crossed, src, lengths, prev)
    crossed.encoder.position_encoding.ode.initial[3 * 2 + 3 * 2:].add_(1.0)  # the cross k, v states
    after = full_log_probs(crossed, src, lengths, prev)
    assert (after - before).abs().max() > 1e-2
    tolerance = float32_tolerance(transformer_terms(crossed, 9, 8), magnitude(after, floor=1))
    assert tolerance < 1e-2  # far below what the cross states change
    assert_within(incremental_log_probs(crossed, src, lengths, prev), after, tolerance)


def test_a_checkpoint_that_biased_cross_attention_names_the_override_it_needs():
    state = floater("--floater-cross-attention").state_dict()
    with pytest.raises(PosencError, match=r"load it with --model-overrides \"\{'floater_cross_attention': True\}\""):
        floater().load_state_dict(state)
    floater("--floater-cross-attention", seed=2).load_state_dict(state)  # with the flag it loads


def test_unknown_solver_is_a_clear_error():
    with pytest.raises(ValueError, match="--floater-solver 'rk5' is not a torchdiffeq method"):
        floater("--floater-solver", "rk5")


def _save(model, path):
    torch.save({"model": model.state_dict()}, path)
    return str(path)


@pytest.mark.numerics
@pytest.mark.parametrize("vanilla_arch", ["transformer_posenc", "transformer"])
def test_warm_start_is_exactly_the_vanilla_model(tmp_path, vanilla_arch):
    vanilla = build_model(vanilla_arch, "--dropout", "0.0", seed=5)
    path = _save(vanilla, tmp_path / "vanilla.pt")
    warm = floater("--dropout", "0.0", "--floater-init-from", path)
    src, lengths, prev = toy_batch(vanilla.encoder.dictionary, [9, 5, 7], tgt_len=8)
    vanilla.train(), warm.train()

    def check(got, expected, what):
        if vanilla_arch == "transformer_posenc":
            # the same attention on the same values (the warm start's biases add exact zeros): bit
            # for bit, on any CPU
            assert torch.equal(got, expected), what
        else:  # fairseq's own attention sums in another order
            tolerance = float32_tolerance(transformer_terms(vanilla, 9, 8), magnitude(expected, floor=1))
            assert_within(got, expected, tolerance, what)

    check(full_log_probs(warm, src, lengths, prev), full_log_probs(vanilla, src, lengths, prev), "full")
    vanilla.eval(), warm.eval()
    with torch.no_grad():
        check(incremental_log_probs(warm, src, lengths, prev), incremental_log_probs(vanilla, src, lengths, prev),
              "incremental")


def _nll(model, batch):
    src, lengths, prev = batch
    target = torch.roll(prev, -1, dims=1)
    return -full_log_probs(model, src, lengths, prev).gather(-1, target[..., None]).mean()


def _ode_parameters(model):
    return dict(model.encoder.position_encoding.ode.named_parameters())


def _train(model, steps):
    """``steps`` Adam updates on toy batches; the ODE's gradients of the first and last step."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    grads = []
    for step in range(steps):
        optimizer.zero_grad()
        _nll(model, toy_batch(toy_dictionary(), [9, 5, 7], tgt_len=8, seed=step)).backward()
        grads.append({name: p.grad.clone() for name, p in _ode_parameters(model).items()})
        optimizer.step()
    return grads[0], grads[-1]


def test_a_warm_started_ode_learns_every_parameter_of_h(tmp_path):
    """A warm start that zeroed all of h left relu(0) = 0 in its hidden layer: fc2 got no
    gradient, fc1 none through fc2 = 0, and h never learned (only fc2.bias and time2 moved)."""
    path = _save(build_model("transformer_posenc", "--dropout", "0.0", seed=5), tmp_path / "vanilla.pt")
    warm = floater("--dropout", "0.0", "--floater-init-from", path)
    start = {name: p.detach().clone() for name, p in _ode_parameters(warm).items()}
    # at step 0 every bias is 0 (the vanilla model), yet the hidden layer is live
    for name in ("dynamics.fc2.weight", "dynamics.fc2.bias", "dynamics.time2", "initial"):
        assert start[name].abs().max() == 0, name
    for name in ("dynamics.fc1.weight", "dynamics.fc1.bias", "dynamics.time1"):
        assert start[name].abs().max() > 1e-3, name
    first, last = _train(warm, steps=4)
    assert first["dynamics.fc2.weight"].abs().max() > 0  # from the first step
    assert first["initial"].abs().max() > 0
    for name, p in _ode_parameters(warm).items():
        assert last[name].abs().max() > 0, name  # fc1, b1, time1 too, once fc2 is non-zero
        assert (p.detach() - start[name]).abs().max() > 1e-5, name


def test_an_ode_trained_from_scratch_learns_every_parameter():
    model = floater("--dropout", "0.0")
    start = {name: p.detach().clone() for name, p in _ode_parameters(model).items()}
    first, last = _train(model, steps=3)
    for name, p in _ode_parameters(model).items():
        assert first[name].abs().max() > 0 and last[name].abs().max() > 0, name
        assert (p.detach() - start[name]).abs().max() > 1e-5, name


def test_warm_start_refuses_a_model_of_another_size(tmp_path):
    path = _save(build_model("transformer_posenc", "--encoder-ffn-embed-dim", "48"), tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"not a sinusoidal Transformer of this model's size \(different shape: "
                                         r"encoder.layers.0.fc1.weight"):
        floater("--floater-init-from", path)
    with pytest.raises(PosencError, match="--floater-init-from: no checkpoint at"):
        floater("--floater-init-from", str(tmp_path / "missing.pt"))


def test_warm_start_refuses_a_checkpoint_that_lacks_one_of_the_models_parameters(tmp_path):
    """A key missing, nothing unexpected and no shape differing: still not the vanilla model (the
    load would keep that parameter's random initialisation)."""
    state = build_model("transformer_posenc").state_dict()
    del state["encoder.layers.0.fc1.bias"]
    path = str(tmp_path / "lacking.pt")
    torch.save({"model": state}, path)
    with pytest.raises(ValueError, match=r"not a sinusoidal Transformer of this model's size \(missing: "
                                         r"encoder.layers.0.fc1.bias\)$"):
        floater("--floater-init-from", path)


def test_the_lr_scale_stores_the_initial_states_over_c():
    """--floater-lr-scale C: the parameter holds p(0) / C, the state used is C x the stored one, the
    same p(0) as at C = 1 from the same seed."""
    odes = {}
    for c in (1.0, 4.0):
        torch.manual_seed(0)
        odes[c] = FloaterODE(num_states=3, dim=8, hidden=8, dt=0.1, solver="rk4", step=None, adjoint=False,
                             lr_scale=c)
    stored = odes[4.0].initial.detach()
    assert torch.equal(odes[4.0].initial_state().detach(), stored * 4)
    assert_within(odes[4.0].initial_state().detach(), odes[1.0].initial.detach(), 1e-7, "p(0)")
    assert torch.equal(odes[4.0].initial_state(stored.double()), stored.double() * 4)


def test_warm_start_refuses_a_sinusoidal_model_at_every_block(tmp_path):
    """--position-blocks all adds no parameter: only the saved flags tell that FLOATER would drop
    its Eq. 7 terms and not start as that model."""
    import argparse

    model = build_model("transformer_posenc", "--position-blocks", "all")
    for flags, named in (({"position_encoding": "sinusoidal", "position_blocks": "all"}, "sinusoidal --position-blocks all"),
                         ({"position_encoding": "rope"}, "rope")):
        path = tmp_path / "every_block.pt"
        torch.save({"model": model.state_dict(), "cfg": {"model": argparse.Namespace(**flags)}}, path)
        with pytest.raises(ValueError, match=f"is a --position-encoding {named} model; the warm start needs the vanilla"):
            floater("--floater-init-from", str(path))
    torch.save({"model": model.state_dict(), "cfg": {"model": {"position_encoding": "sinusoidal",
                                                             "position_blocks": "input"}}}, path)
    assert floater("--floater-init-from", str(path)) is not None  # the vanilla model's flags: accepted


def _record_solves(ode):
    calls = []
    solve = ode._solve

    def recording(y0, start, end):
        calls.append((start, end))
        return solve(y0, start, end)

    ode._solve = recording
    return calls


def test_training_forward_solves_once_for_all_blocks_and_sentences():
    model = floater().train()
    calls = _record_solves(model.encoder.position_encoding.ode)
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=6)
    model(src, lengths, prev)  # 2 + 2 layers, 3 sentences, target shorter than source
    assert calls == [(0, 9)]
    model(src, lengths, prev)  # a new forward solves again (the parameters may have changed)
    assert calls == [(0, 9), (0, 9)]
    src, lengths, prev = toy_batch(model.encoder.dictionary, [5, 4], tgt_len=12)
    model(src, lengths, prev)  # a longer target extends the solution, from where it ended
    assert calls[2:] == [(0, 5), (4, 12)]


@pytest.mark.numerics
@pytest.mark.parametrize("flags", [(), ("--floater-cross-attention",)], ids=["self", "cross"])
def test_a_padded_batch_learns_what_its_sentences_learn_alone(flags):
    """The biases of a left-padded batch are gathered per sentence, those of an unpadded one sliced
    from the solution (FloaterPositionEncoding._rows): the gradient of a padded batch's summed loss,
    on every parameter, is the sum of its sentences' gradients alone. In float64 (FLOATER's Python
    loops), but the solver's times are float32 (as torchdiffeq's), and a sentence alone solves
    fewer positions, whose last time point is rounded on its own (and extends the solution for
    its longer target): the sides agree to float32 rounding, not float64's."""
    model = with_strong_positions(floater("--dropout", "0.0", *flags)).double().train()
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=6)
    target = torch.roll(prev, -1, dims=1)

    def gradients(rows, src):
        model.zero_grad()
        log_probs = full_log_probs(model, src, lengths[rows], prev[rows])
        (-log_probs.gather(-1, target[rows, :, None])).sum().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    batch = gradients(slice(None), src)
    alone = [gradients(slice(b, b + 1), src[b: b + 1, -n:]) for b, n in enumerate(lengths.tolist())]
    assert "encoder.position_encoding.ode.initial" in batch
    for name, grad in batch.items():
        summed = sum(a[name] for a in alone)
        assert_within(grad, summed, float32_tolerance(transformer_terms(model, 9, 6), magnitude(summed, floor=1)),
                      name)


@pytest.mark.numerics
@torch.no_grad()
def test_extending_a_solution_equals_solving_from_zero():
    model = with_strong_positions(floater())
    ode = model.encoder.position_encoding.ode
    short = ode.positions(70).clone()  # at least 64 positions are kept
    extended = ode.positions(300)
    fresh = ode._solve(ode.initial, 0, 300)
    assert extended.shape[0] >= 300
    # the same trajectory up to float32 rounding: 300 positions of 5 rk4 steps, each passing on
    # the state's error and adding at most eps x |state| of its own (its update, its time point).
    # The state grows to ~1000: relative to the largest. (Extending from a state one step off
    # would be off by 5e-3 of it.)
    assert_within(extended[:300], fresh, float32_tolerance(300 * 5, magnitude(fresh)))
    # the positions kept are copied into the longer solution, not solved again
    assert torch.equal(extended[:70], short[:70])


@pytest.mark.numerics
@torch.no_grad()
def test_decoding_from_a_checkpoint_does_no_ode_work_for_lengths_already_solved():
    trained = with_strong_positions(floater())
    trained.train()
    src, lengths, prev = toy_batch(trained.encoder.dictionary, [9, 5, 7], tgt_len=8)
    with torch.enable_grad():
        trained(src, lengths, prev)  # a training step solves for 9 positions
    state = trained.state_dict()  # the checkpoint carries the solution of its parameters
    assert state["encoder.position_encoding.ode.solution"].shape[0] >= 9

    loaded = floater(seed=2)
    loaded.load_state_dict(state)
    loaded.eval()
    calls = _record_solves(loaded.encoder.position_encoding.ode)
    out = incremental_log_probs(loaded, src, lengths, prev)
    assert calls == []
    fresh = loaded.encoder.position_encoding.ode._solve(loaded.encoder.position_encoding.ode.initial, 0, 9)
    # solved with gradients in training, without here: 9 positions of 5 rk4 steps
    assert_within(state["encoder.position_encoding.ode.solution"][:9], fresh,
                  float32_tolerance(9 * 5, magnitude(fresh)), "solution")
    full = full_log_probs(loaded, src, lengths, prev)
    assert_within(out, full, float32_tolerance(transformer_terms(loaded, 9, 8), magnitude(full, floor=1)), "decoding")
    long_src, long_lengths, long_prev = toy_batch(loaded.encoder.dictionary, [100], tgt_len=3)
    calls.clear()
    loaded(long_src, long_lengths, long_prev)
    stored = state["encoder.position_encoding.ode.solution"].shape[0]
    assert calls == [(stored - 1, max(100, 2 * stored))]  # extended, not solved from 0


@torch.no_grad()
def test_changed_parameters_invalidate_the_kept_solution():
    model = with_strong_positions(floater())
    ode = model.encoder.position_encoding.ode
    calls = _record_solves(ode)
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9], tgt_len=4)
    model(src, lengths, prev)
    model(src, lengths, prev)
    assert len(calls) == 1
    ode.initial.add_(0.1)
    model(src, lengths, prev)
    assert len(calls) == 2


def _grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.numerics
def test_an_update_of_several_passes_solves_once_with_the_gradients_of_a_solve_per_pass():
    batches = [toy_batch(toy_dictionary(), lengths, tgt_len=t, seed=s)
               for s, (lengths, t) in enumerate([([6, 4], 5), ([9, 3], 4), ([5, 5], 11)])]
    per_pass, per_update = (with_strong_positions(floater("--dropout", "0.0")).train() for _ in range(2))
    calls = _record_solves(per_update.encoder.position_encoding.ode)
    per_update.encoder.position_encoding.ode.begin_update(len(batches))
    for model in (per_pass, per_update):
        for batch in batches:
            # (not the log-probabilities' logsumexp: that is log 1 = 0, whose gradients are all
            # rounding noise of ~1e-8, which any tolerance of 1e-5 passes)
            _nll(model, batch).backward()
    # one solve from 0 for the whole update, extended when a later pass is longer
    assert calls == [(0, 6), (5, 9), (8, 11)]
    expected, got = _grads(per_pass), _grads(per_update)
    assert got.keys() == expected.keys() and "encoder.position_encoding.ode.initial" in got
    # the model's chain forward and backward, a weight's gradient summed over the 3 passes' up to
    # 2 x 11 positions, and the ODE's backward (11 positions of 5 rk4 steps of 4 stages) added per
    # pass or once; relative to the largest gradient (the keys' biases, whose exact gradient is 0,
    # get only rounding from the others)
    terms = 2 * transformer_terms(per_pass, 9, 11) + 3 * 2 * 11 + 11 * 5 * 4
    tolerance = float32_tolerance(terms, magnitude(*expected.values()))
    for name in expected:
        assert_within(got[name], expected[name], tolerance, name)
    # a forward past the announced passes solves on its own again
    calls.clear()
    per_update(*batches[0])
    assert calls == [(0, 6)]


def test_fairseq_trainer_announces_each_update_and_its_passes():
    from fairseq.trainer import Trainer

    class Stop(Exception):
        pass

    class Recorder(torch.nn.Module):
        passes = []

        def begin_update(self, passes):
            self.passes.append(passes)

    class FakeTrainer:
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), Recorder())
        device = torch.device("cpu")  # in fp32: what the wrapper reads before fairseq's step
        cfg = SimpleNamespace(common=SimpleNamespace(fp16=False, memory_efficient_fp16=False))

        def _set_seed(self):  # the first thing fairseq's train_step does
            raise Stop

    with pytest.raises(Stop):
        Trainer.train_step(FakeTrainer(), [{}, {}, {}])
    assert Recorder.passes == [3]


@pytest.mark.numerics
def test_adjoint_gradients_match_backpropagation_through_the_solver():
    """The adjoint solves the continuous adjoint ODE backwards with rk4; backpropagation
    differentiates the forward's rk4 steps. They differ by rk4's truncation error, which the same
    comparison in float64 measures (rounding there is ~1e-13), and by float32 rounding: 20
    positions of 5 steps forwards, and backwards 4 stages a step adding to each gradient."""
    grads = {}
    for dtype in (torch.float32, torch.float64):
        for adjoint in (False, True):
            torch.manual_seed(3)
            ode = FloaterODE(num_states=4, dim=8, hidden=8, dt=0.1, solver="rk4", step=None, adjoint=adjoint)
            ode.to(dtype).positions(20).pow(2).sum().backward()
            grads[dtype, adjoint] = {name: p.grad for name, p in ode.named_parameters()}
    backprop, adjoint = grads[torch.float32, False], grads[torch.float32, True]
    assert backprop.keys() == adjoint.keys() == {"initial", "dynamics.fc1.weight", "dynamics.fc1.bias",
                                                 "dynamics.time1", "dynamics.fc2.weight", "dynamics.fc2.bias",
                                                 "dynamics.time2"}
    for name in backprop:
        assert adjoint[name] is not None, name
        truncation = (grads[torch.float64, True][name] - grads[torch.float64, False][name]).abs().max().item()
        rounding = float32_tolerance(20 * 5 + 20 * 5 * 4, magnitude(backprop[name]))
        assert_within(adjoint[name], backprop[name], truncation + rounding, name)


@pytest.mark.parametrize("dim, hidden", [(3, 1024), (1024, 3)])
def test_the_time_columns_start_as_nn_linear_would_draw_them(dim, hidden):
    """time1 and time2 are the time columns of nn.Linear(dim + 1, hidden) and nn.Linear(hidden + 1,
    dim): uniform in +-1 / sqrt(fan_in), fan_in counting the column. 1024 draws from each bound:
    the largest within 1% of it; a bound of 1 / sqrt(3) in place of 1 / sqrt(4) would put 13% of
    them above it."""
    torch.manual_seed(0)
    h = Dynamics(dim, hidden)
    for column, fan_in in ((h.time1, dim + 1), (h.time2, hidden + 1)):
        if column.numel() < 1024:
            continue  # too few draws to tell the bound
        bound = 1 / math.sqrt(fan_in)
        # both ends reached: the draws span -bound .. +bound, not one side of it
        assert -bound <= column.min().item() < -0.99 * bound, (column.min().item(), bound)
        assert 0.99 * bound < column.max().item() <= bound, (column.max().item(), bound)
