"""FLOATER: the paper's sizes, the warm start, and one ODE solve where the design promises one."""
import pytest
import torch

from fairseq_posenc.compat import PosencError
from fairseq_posenc.positions import AttentionPositions
from fairseq_posenc.positions.floater import FloaterODE
from toy import build_model, full_log_probs, incremental_log_probs, toy_batch, toy_dictionary, with_strong_positions


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
    torch.testing.assert_close(incremental_log_probs(crossed, src, lengths, prev), after, atol=1e-5, rtol=1e-5)


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


@pytest.mark.parametrize("vanilla_arch", ["transformer_posenc", "transformer"])
def test_warm_start_is_exactly_the_vanilla_model(tmp_path, vanilla_arch):
    vanilla = build_model(vanilla_arch, "--dropout", "0.0", seed=5)
    path = _save(vanilla, tmp_path / "vanilla.pt")
    warm = floater("--dropout", "0.0", "--floater-init-from", path)
    src, lengths, prev = toy_batch(vanilla.encoder.dictionary, [9, 5, 7], tgt_len=8)
    vanilla.train(), warm.train()
    torch.testing.assert_close(full_log_probs(warm, src, lengths, prev), full_log_probs(vanilla, src, lengths, prev),
                               atol=1e-6, rtol=1e-6)
    vanilla.eval(), warm.eval()
    with torch.no_grad():
        torch.testing.assert_close(incremental_log_probs(warm, src, lengths, prev),
                                   incremental_log_probs(vanilla, src, lengths, prev), atol=1e-6, rtol=1e-6)


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
    with pytest.raises(FileNotFoundError, match="--floater-init-from: no checkpoint at"):
        floater("--floater-init-from", str(tmp_path / "missing.pt"))


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


@torch.no_grad()
def test_extending_a_solution_equals_solving_from_zero():
    model = with_strong_positions(floater())
    ode = model.encoder.position_encoding.ode
    short = ode.positions(70).clone()  # at least 64 positions are kept
    extended = ode.positions(300)
    fresh = ode._solve(ode.initial, 0, 300)
    assert extended.shape[0] >= 300
    # the same trajectory up to float32 rounding, relative to the size of the solution
    assert (extended[:300] - fresh).abs().max() / fresh.abs().max() < 1e-5
    torch.testing.assert_close(extended[:70], short[:70])


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
    torch.testing.assert_close(state["encoder.position_encoding.ode.solution"][:9], fresh, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out, full_log_probs(loaded, src, lengths, prev), atol=1e-5, rtol=1e-5)
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


def test_an_update_of_several_passes_solves_once_with_the_gradients_of_a_solve_per_pass():
    batches = [toy_batch(toy_dictionary(), lengths, tgt_len=t, seed=s)
               for s, (lengths, t) in enumerate([([6, 4], 5), ([9, 3], 4), ([5, 5], 11)])]
    per_pass, per_update = (with_strong_positions(floater("--dropout", "0.0")).train() for _ in range(2))
    calls = _record_solves(per_update.encoder.position_encoding.ode)
    per_update.encoder.position_encoding.ode.begin_update(len(batches))
    for model in (per_pass, per_update):
        for src, lengths, prev in batches:
            full_log_probs(model, src, lengths, prev).logsumexp(-1).sum().backward()
    # one solve from 0 for the whole update, extended when a later pass is longer
    assert calls == [(0, 6), (5, 9), (8, 11)]
    expected, got = _grads(per_pass), _grads(per_update)
    assert got.keys() == expected.keys() and "encoder.position_encoding.ode.initial" in got
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)
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

        def _set_seed(self):  # the first thing fairseq's train_step does
            raise Stop

    with pytest.raises(Stop):
        Trainer.train_step(FakeTrainer(), [{}, {}, {}])
    assert Recorder.passes == [3]


def test_adjoint_gradients_match_backpropagation_through_the_solver():
    grads = []
    for adjoint in (False, True):
        torch.manual_seed(3)
        ode = FloaterODE(num_states=4, dim=8, hidden=8, dt=0.1, solver="rk4", step=None, adjoint=adjoint)
        ode.positions(20).pow(2).sum().backward()
        grads.append({name: p.grad for name, p in ode.named_parameters()})
    assert grads[0].keys() == grads[1].keys() == {"initial", "dynamics.fc1.weight", "dynamics.fc1.bias",
                                                  "dynamics.time1", "dynamics.fc2.weight", "dynamics.fc2.bias",
                                                  "dynamics.time2"}
    for name in grads[0]:
        assert grads[1][name] is not None, name
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-4, rtol=1e-3, msg=name)
