"""A kept table or ODE solution is reused only for the configuration, device and dtype it was built
for (positions/kept.py: the key besides the parameters).

RoPE's table has no parameters to compare, so only the key can tell that the model moved to
another device or dtype; FLOATER's and the RNN's solution is stored in the checkpoint, so only its
fingerprint can tell that the weights are loaded under another dt, step, solver, lr scale or
--rnn-dt (``--model-overrides`` at generate time, ``--restore-file`` with a changed flag).
"""
import os
import shutil

import pytest
import torch
from fairseq.data import Dictionary

from posenc_workflow import toy_data
from fairseq_posenc.models.transformer_posenc import PosencTransformerModel
from fairseq_posenc.positions import POSITION_ENCODINGS
from fairseq_posenc.positions.kept import kept_result_keys
from helpers.fairseq_runs import generate_command, outcome, preprocess_here, run_all, train_command
from helpers.tolerances import assert_within, solution_tolerance
from helpers.toy import TINY, build_model, full_log_probs, incremental_log_probs, toy_batch, with_strong_positions

ENCODINGS = list(POSITION_ENCODINGS)
SOLVED = ("floater", "rnn")
#: each flag the ODE's (or the recurrence's) solution depends on, and another value for it
SOLVER_FLAGS = [("floater", "floater_dt", 0.2), ("floater", "floater_step", 0.05),
                ("floater", "floater_solver", "midpoint"), ("floater", "floater_lr_scale", 4.0),
                ("rnn", "rnn_dt", 0.2)]


def _flag(name):
    return "--" + name.replace("_", "-")


def _model(encoding, *flags, seed=1, from_checkpoint=False):
    return with_strong_positions(build_model("transformer_posenc", "--position-encoding", encoding, *flags, seed=seed,
                                             from_checkpoint=from_checkpoint))


def _outputs(model, batch):
    with torch.no_grad():
        return torch.cat([full_log_probs(model, *batch), incremental_log_probs(model, *batch)])


def _kept(model):
    """{scheme or solver: what it keeps} of both stacks."""
    kept = {}
    for stack in (model.encoder, model.decoder):
        scheme = stack.position_encoding
        if hasattr(scheme, "ode") and stack is model.encoder:
            kept[scheme.ode] = scheme.ode.solution
        elif scheme._tables:
            kept[scheme] = scheme._tables
    return kept


def _key(holder):
    return holder._solved_from.key if hasattr(holder, "_solved_from") else holder._kept_from.key


def _current_key(holder):
    return holder._kept_key() if hasattr(holder, "_solved_from") else holder.kept_key()


def _without_kept(model, state):
    kept = kept_result_keys(model)
    return {k: v for k, v in state.items() if k not in kept}


#: the encodings that keep a table or a solution across no-grad forwards, as each class says
KEEPING = [name for name, scheme in POSITION_ENCODINGS.items() if scheme.keeps_tables]


def test_the_encodings_that_keep_something_are_found():
    """What each encoding's ``keeps_tables`` says is what it keeps: a new encoding that keeps
    something and does not say so fails here, and is tested below once it does."""
    found = set()
    for encoding in ENCODINGS:
        model = _model(encoding)
        _outputs(model, toy_batch(model.encoder.dictionary, [9, 5], tgt_len=4))
        if _kept(model):
            found.add(encoding)
    assert found == set(KEEPING), f"keeps_tables says {sorted(KEEPING)}; no-grad forwards kept {sorted(found)}"


@pytest.mark.parametrize("encoding", KEEPING)
def test_the_key_holds_the_device_and_a_move_drops_what_was_kept(encoding):
    """A CPU-to-CPU copy cannot show a device bug: the key is read, and a move to another
    device (torch's ``meta``, which every machine has) must make what was kept stale. RoPE has no
    parameters whose device would tell."""
    model = _model(encoding)
    _outputs(model, toy_batch(model.encoder.dictionary, [9, 5], tgt_len=4))
    holders = list(_kept(model))
    for holder in holders:
        config, device, dtype = _key(holder)
        assert (device, dtype) == (torch.device("cpu"), torch.float32)
        assert config == _current_key(holder)[0]
    model.to("meta")
    for holder in holders:
        assert _current_key(holder)[1] == torch.device("meta")
        if hasattr(holder, "_solved_from"):
            assert not holder._solution_is_current()
        else:
            holder._tables_checked = False
            holder._check_kept_tables()
            assert holder._tables == {}


@pytest.mark.parametrize("encoding", KEEPING)
def test_a_dtype_change_rebuilds_what_is_kept(encoding):
    """``model.double()`` after tables (a solution) were kept, in memory and loaded from a state
    dict: the same outputs as a float64 model that never kept anything (the same operations on
    equal weights: exactly equal)."""
    model = _model(encoding)
    batch = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=6)
    _outputs(model, batch)
    state = model.state_dict()  # FLOATER's carries its float32 solution
    loaded = _model(encoding, seed=99)
    loaded.load_state_dict(state)
    if encoding not in SOLVED:  # a solution stays as loaded, its float32 fingerprint unchecked
        _outputs(loaded, batch)
    reference = _model(encoding, seed=99).double()
    reference.load_state_dict(_without_kept(reference, state), strict=False)
    expected = _outputs(reference.eval(), batch)
    for kept in (model, loaded):
        assert torch.equal(_outputs(kept.double().eval(), batch), expected)


def _another(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    return "another" if isinstance(value, str) else 1


@pytest.mark.parametrize("encoding", SOLVED)
def test_every_setting_of_the_solver_is_in_the_key(encoding):
    """Each public plain attribute of the ODE (or recurrence) and its submodules but the running
    state: changed, the kept solution is stale, in memory and loaded with its fingerprint; a
    setting added later is in the key without anyone listing it."""
    model = _model(encoding)
    _outputs(model, toy_batch(model.encoder.dictionary, [9, 5], tgt_len=4))
    loaded = _model(encoding, seed=99)
    loaded.load_state_dict(model.state_dict())
    settings = 0
    for ode, by_fingerprint in ((model.encoder.position_encoding.ode, False),
                                (loaded.encoder.position_encoding.ode, True)):
        def current():
            if by_fingerprint:  # as loaded: nothing remembered, the stored fingerprint decides
                ode._solved_from.forget()
            return ode._solution_is_current()

        assert current()
        for _, module in ode.named_modules():
            skip = {"training", *getattr(type(module), "running_state", ())}
            for name, value in list(vars(module).items()):
                if name.startswith("_") or name in skip or not isinstance(value, (bool, int, float, str, type(None))):
                    continue
                settings += 1
                setattr(module, name, _another(value))
                assert not current(), name
                setattr(module, name, value)
                assert current(), name
    assert settings >= 2 * 5  # dt, step, solver, adjoint, lr scale or the RNN's input form, ...


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("encoding", KEEPING)
def test_a_move_to_cuda_rebuilds_what_is_kept(encoding):
    model = _model(encoding)
    batch = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=6)
    _outputs(model, batch)
    state = model.state_dict()
    reference = _model(encoding, seed=99).cuda()
    reference.load_state_dict(_without_kept(reference, state), strict=False)
    cuda_batch = tuple(t.cuda() for t in batch)
    # the same operations on the same device on equal weights
    assert torch.equal(_outputs(model.cuda(), cuda_batch), _outputs(reference.eval(), cuda_batch))


@pytest.mark.parametrize("encoding,flag,value", SOLVER_FLAGS)
def test_a_stored_solution_is_not_reused_under_another_solver_flag(encoding, flag, value):
    """Weights and their solution loaded into a model built with another dt, step, solver, lr
    scale or --rnn-dt compute as the same weights loaded without a solution (exactly: the same
    operations on equal weights)."""
    model = _model(encoding)
    batch = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=6)
    before = _outputs(model, batch)
    state = model.state_dict()
    # built as a decode with --model-overrides is (a training run refuses another lr scale)
    changed = _model(encoding, _flag(flag), str(value), seed=99, from_checkpoint=True)
    reference = _model(encoding, _flag(flag), str(value), seed=99, from_checkpoint=True)
    changed.load_state_dict(state)
    reference.load_state_dict(_without_kept(reference, state), strict=False)
    after = _outputs(changed, batch)
    assert torch.equal(after, _outputs(reference, batch))
    if flag != "floater_lr_scale":  # weights stored with their lr scale load as the same h
        # the flag acts: ignored, it would leave the same operations on equal weights (equal
        # outputs); a smaller rk4 step changes them by less than float32 rounding bounds, so the
        # test is for any difference
        assert not torch.equal(after, before)


# --- through fairseq's CLI -----------------------------------------------------------------

TRAIN = ["--arch", "transformer_posenc", "--cpu", *TINY, "--optimizer", "adam", "--lr", "1e-2", "--max-tokens", "500",
         "--max-update", "2", "--seed", "1", "--num-workers", "0", "--no-epoch-checkpoints", "--no-progress-bar"]
GENERATE = ["--gen-subset", "valid", "--beam", "2", "--batch-size", "8", "--max-len-b", "10"]


def _overrides(flag, value):
    return ["--model-overrides", repr({flag: value})]


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """Two fairseq-train runs of 2 updates (FLOATER, RNN; one process), then in a second process:
    fairseq-generate of each checkpoint as saved and without its solution (as averaging leaves
    it), with each solver flag overridden and as trained, and fairseq-train resumed from each
    with a changed flag for one more update at lr 0."""
    root = tmp_path_factory.mktemp("kept_keys")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (40, 3, 8), "valid": (8, 3, 8)})
    data_bin = preprocess_here(prefixes, str(root / "bin"))
    trained = run_all([(e, "fairseq-train", train_command(data_bin, str(root / e), ["--position-encoding", e, *TRAIN]))
                       for e in SOLVED], str(root / "runs1"))
    checkpoints = {}
    for encoding in SOLVED:
        if not trained.get(encoding, {}).get("ok"):
            continue
        checkpoints[encoding] = path = str(root / encoding / "checkpoint_last.pt")
        state = torch.load(path, map_location="cpu")
        for key in [k for k in state["model"] if k.endswith(".ode.solution")]:
            state["model"][key] = state["model"][key][:0]
        torch.save(state, path.replace(".pt", "_unsolved.pt"))
    jobs = []
    for encoding, path in checkpoints.items():
        jobs.append((f"{encoding}-plain", "fairseq-generate", generate_command(data_bin, path, GENERATE)))
        for enc, flag, value in SOLVER_FLAGS:
            if enc == encoding:
                for name, p in (("saved", path), ("unsolved", path.replace(".pt", "_unsolved.pt"))):
                    jobs.append((f"{flag}-{name}", "fairseq-generate",
                                 generate_command(data_bin, p, [*GENERATE, *_overrides(flag, value)])))
        if encoding not in RESTORED:
            continue
        flag, value = RESTORED[encoding]
        resumed = str(root / f"{encoding}-resumed")
        os.makedirs(resumed)
        shutil.copy(path, os.path.join(resumed, "checkpoint_last.pt"))
        flags = [*TRAIN, "--position-encoding", encoding, _flag(flag), str(value), "--max-update", "3", "--lr", "0",
                 "--reset-lr-scheduler"]
        jobs.append((f"{encoding}-resumed", "fairseq-train", train_command(data_bin, resumed, flags)))
    return root, trained, run_all(jobs, str(root / "runs2"))


#: a flag a run may go on with changed (models/checkpoint_settings.py: the solver, not the model; the RNN's
#: --rnn-dt is the model's and is refused, tests/fairseq/test_checkpoint_settings.py)
RESTORED = {"floater": ("floater_solver", "euler")}


def _hypotheses(stdout):
    """fairseq-generate's H lines (id, score, words), in a fixed order."""
    return sorted(line for line in stdout.splitlines() if line.startswith("H-"))


@pytest.mark.parametrize("encoding,flag,value", SOLVER_FLAGS)
def test_generate_with_a_solver_flag_overridden_solves_anew(cli, encoding, flag, value):
    """``fairseq-generate --model-overrides`` of a solver flag: the checkpoint's solution, solved
    with the trained flags, is not used; the hypotheses and their scores are those of the same
    weights without a stored solution (the same operations on equal weights: equal to the last
    digit printed)."""
    root, trained, runs = cli
    outcome(trained, encoding)
    saved, unsolved = (_hypotheses(outcome(runs, f"{flag}-{name}")["stdout"]) for name in ("saved", "unsolved"))
    assert len(saved) == 8
    assert saved == unsolved
    if flag != "floater_lr_scale":  # weights stored with their lr scale load as the same h
        assert saved != _hypotheses(outcome(runs, f"{encoding}-plain")["stdout"])  # the override acts


@pytest.mark.parametrize("encoding", list(RESTORED))
def test_training_resumed_with_a_changed_flag_saves_the_solution_of_that_flag(cli, encoding):
    """``fairseq-train --restore-file`` with a changed solver and one more update at lr 0 (the weights
    stay those loaded, so only the flag can tell the loaded solution stale): validation and the
    checkpoint it saves holds a solution solved with the new flag, not the one loaded."""
    root, trained, runs = cli
    outcome(runs, f"{encoding}-resumed")
    state = torch.load(str(root / f"{encoding}-resumed" / "checkpoint_last.pt"), map_location="cpu")
    flag, value = RESTORED[encoding]
    assert getattr(state["cfg"]["model"], flag) == value
    old = torch.load(str(root / encoding / "checkpoint_last.pt"), map_location="cpu")
    for key, v in old["model"].items():
        if v.is_floating_point() and not key.endswith(".ode.solution"):
            assert torch.equal(state["model"][key], v), key  # lr 0: the weights are those loaded
    dictionary = Dictionary.load(os.path.join(root, "bin", "dict.src.txt"))

    class Task:
        source_dictionary = target_dictionary = dictionary

    model = PosencTransformerModel.build_model(state["cfg"]["model"], Task())
    model.load_state_dict(_without_kept(model, state["model"]), strict=False)
    ode = model.encoder.position_encoding.ode
    stored = state["model"]["encoder.position_encoding.ode.solution"]
    with torch.no_grad():
        fresh = ode._solve(ode.initial, 0, stored.size(0))
    tolerance = solution_tolerance(ode, stored.size(0), fresh)
    assert_within(stored, fresh, tolerance, "the saved solution against one solved with the new flag")
    loaded_solution = old["model"]["encoder.position_encoding.ode.solution"][: stored.size(0)]
    assert (loaded_solution - fresh).abs().max() > 10 * tolerance  # the comparison tells the two apart
