"""Kept position tables never outlive the parameters they were built from.

Schemes keep tables (relative biases, DIET-ABS's P_Q P_K^T, RoPE's angles, FLOATER's solution)
across no-grad forwards for decoding. fairseq's optimizers write parameters through ``p.data``,
which bumps no version counter; so do EMA or averaging code that swaps values in memory. Each
test changes the parameters that way after the tables were kept, then compares the model's
no-grad forward with a newly built model loaded with the same parameters (the same code path,
so exactly equal) and with its own grad-mode forward (no kept tables; a bound derived below).
"""
import pytest
import torch
from fairseq.optim.adam import Adam

from fairseq_posenc.positions import POSITION_ENCODINGS
from helpers.toy import build_model, full_log_probs, incremental_log_probs, toy_batch, with_strong_positions

ENCODINGS = list(POSITION_ENCODINGS)
U32 = 2.0**-24  # float32 unit roundoff


def _grad_mode_tolerance(log_probs: torch.Tensor) -> float:
    """Grad-mode and no-grad forwards differ only in rounding: SDPA takes its math kernel for a
    bias that requires grad, and kept tables are built over 64 positions (FLOATER extends its
    solution from there). A forward of the toy model is a chain of about 12 roundings of
    reductions of at most 64 terms (embeddings, 2 + 2 layers of attention and FFN, the output
    projection and log-softmax); each contributes at most 64 u of the largest magnitude."""
    return U32 * 64 * 12 * log_probs.abs().max().item()


def _model(encoding):
    return with_strong_positions(build_model("transformer_posenc", "--position-encoding", encoding))


def _reloaded(model, encoding):
    """A newly built model with ``model``'s parameters: nothing kept, nothing shared."""
    fresh = build_model("transformer_posenc", "--position-encoding", encoding, seed=99)
    fresh.load_state_dict(model.state_dict())
    return fresh.eval()


def _batch(model):
    return toy_batch(model.encoder.dictionary, [11, 6, 9], tgt_len=8)


def _fairseq_adam_step(model, batch, lr=0.05):
    """One bare step of fairseq's own Adam (it writes ``p.data``), outside fairseq's trainer."""
    src, lengths, prev = batch
    optimizer = Adam(model.parameters(), lr=lr)
    loss = -full_log_probs(model, src, lengths, prev).gather(-1, torch.roll(prev, -1, 1)[..., None]).mean()
    loss.backward()
    optimizer.step()


def _keep_tables(model, batch):
    with torch.no_grad():
        full_log_probs(model, *batch)
        incremental_log_probs(model, *batch)


def _position_parameters(model):
    return [p for name, p in model.named_parameters() if "position_encoding" in name or "embed_positions" in name]


#: the encodings with learned position parameters (the others have nothing for p.data to change)
LEARNED = [e for e in ENCODINGS if _position_parameters(_model(e))]


def _kept(model):
    """Everything the model's position schemes keep across no-grad forwards: tables, ODE solutions."""
    kept = []
    for stack in (model.encoder, model.decoder):
        scheme = stack.position_encoding
        kept += [table for table, _ in getattr(scheme, "_tables", {}).values()]
        solution = getattr(getattr(scheme, "ode", None), "solution", None)
        if solution is not None:
            kept.append(solution)
    return kept


def _keeps_tables(encoding):
    model = _model(encoding)
    _keep_tables(model, _batch(model))
    return bool(_kept(model))


#: the encodings with learned position parameters that keep something computed from them
KEEPING = [e for e in LEARNED if _keeps_tables(e)]
#: the others read their parameters in every forward: nothing to go stale
NOT_KEEPING = [e for e in LEARNED if e not in KEEPING]


def test_the_learned_encodings_are_found():
    assert {"learned", "diet_abs", "diet_rel", "shaw", "t5", "floater"} <= set(LEARNED)
    assert not {"none", "sinusoidal", "rope", "alibi"} & set(LEARNED)
    assert {"diet_abs", "diet_rel", "t5", "floater", "rnn"} <= set(KEEPING)
    assert {"learned", "shaw"} <= set(NOT_KEEPING)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_no_grad_forward_after_a_fairseq_adam_step_uses_current_tables(encoding):
    model, batch = _model(encoding), None
    batch = _batch(model)
    _keep_tables(model, batch)
    _fairseq_adam_step(model, batch)

    with torch.no_grad():
        after = full_log_probs(model, *batch)
        stepwise = incremental_log_probs(model, *batch)
    fresh = _reloaded(model, encoding)  # state_dict() after the no-grad forwards: it may refresh
    with torch.no_grad():
        expected = full_log_probs(fresh, *batch)
        expected_stepwise = incremental_log_probs(fresh, *batch)
    assert torch.equal(after, expected)
    assert torch.equal(stepwise, expected_stepwise)

    grad_mode = full_log_probs(model, *batch).detach()
    assert (after - grad_mode).abs().max().item() <= _grad_mode_tolerance(grad_mode)


@pytest.mark.parametrize("encoding", KEEPING)
@torch.no_grad()
def test_kept_tables_follow_values_written_through_data(encoding):
    """EMA or checkpoint averaging in memory: new values copied into ``p.data``, no optimizer.
    Only the encodings that keep something: for the others (learned, shaw) there is nothing to
    go stale, and the test would pass with the value comparison of ``kept.py`` removed."""
    model = _model(encoding)
    batch = _batch(model)
    _keep_tables(model, batch)
    before = _kept(model)
    assert before
    g = torch.Generator().manual_seed(3)
    for p in _position_parameters(model):
        p.data.copy_(p.data + 0.3 * torch.randn(p.shape, generator=g) * p.data.abs().mean())
    after = full_log_probs(model, *batch)
    stepwise = incremental_log_probs(model, *batch)
    fresh = _reloaded(model, encoding)
    assert torch.equal(after, full_log_probs(fresh, *batch))
    assert torch.equal(stepwise, incremental_log_probs(fresh, *batch))
    assert not any(a is b for a, b in zip(_kept(model), before))  # rebuilt, not reused


@pytest.mark.parametrize("encoding", NOT_KEEPING)
@torch.no_grad()
def test_encodings_without_kept_tables_keep_nothing(encoding):
    """learned and shaw look their parameters up in every forward: no table, no solution, nothing
    remembered to compare (were one added, it belongs in the test above)."""
    model = _model(encoding)
    _keep_tables(model, _batch(model))
    assert _kept(model) == []
    assert all(stack.position_encoding._kept_from.empty for stack in (model.encoder, model.decoder))


@torch.no_grad()
def test_a_swap_that_keeps_sums_is_seen():
    """Values permuted between positions keep every sum and sum of squares: the check compares
    the values themselves."""
    model = _model("diet_rel")
    batch = _batch(model)
    _keep_tables(model, batch)
    weight = model.encoder.position_encoding.weight
    weight.data.copy_(weight.data.flip(-1))
    assert torch.equal(full_log_probs(model, *batch), full_log_probs(_reloaded(model, "diet_rel"), *batch))


@pytest.mark.parametrize("encoding", ["t5", "floater"])
@torch.no_grad()
def test_tables_are_checked_once_per_decode_not_every_step(monkeypatch, encoding):
    """The key, the tensors' identity and their values are checked at the first step of a decode
    only; later steps reuse the tables (FLOATER: its solution) unchecked (fairseq's cached keys and
    values are of the first step's parameters too)."""
    from fairseq_posenc.positions import kept

    model = _model(encoding)
    batch = _batch(model)
    calls = []
    real = kept.KeptFrom.still_current
    monkeypatch.setattr(kept.KeptFrom, "still_current",
                        lambda self, key, tensors, contents=True: calls.append(contents) or real(self, key, tensors,
                                                                                                 contents))
    _keep_tables(model, batch)  # solved and kept
    calls.clear()
    encoder_out = model.encoder(batch[0], batch[1])
    state = {}
    for t in range(batch[2].size(1)):
        model.decoder(batch[2][:, : t + 1], encoder_out, incremental_state=state)
    # the encoder and the first decoding step check; the 7 later steps do not
    assert calls == [True, True]
    # a new decode checks again at its first step
    model.decoder(batch[2][:, :1], encoder_out, incremental_state={})
    assert calls == [True, True, True]


@pytest.mark.parametrize("encoding", ["t5", "floater"])
def test_a_frozen_model_keeps_its_tables_while_another_model_steps(encoding):
    """A distillation teacher (no_grad, frozen) beside a student whose optimizer steps: after the
    step the teacher's values are compared, found equal, and its tables (FLOATER: its ODE
    solution) are reused, not rebuilt every update; the student's are rebuilt."""
    teacher, student = _model(encoding), _model(encoding)
    batch = _batch(teacher)
    _keep_tables(teacher, batch)
    _keep_tables(student, batch)

    def kept(model):
        scheme = model.encoder.position_encoding
        if encoding == "floater":
            return [scheme.ode.solution]  # replaced, not written in place, when solved anew
        return [table for table, _ in scheme._tables.values()]

    teacher_kept, student_kept = kept(teacher), kept(student)
    assert teacher_kept and student_kept
    _fairseq_adam_step(student, batch)
    _keep_tables(teacher, batch)
    _keep_tables(student, batch)
    assert all(a is b for a, b in zip(kept(teacher), teacher_kept))
    assert not any(a is b for a, b in zip(kept(student), student_kept))


def test_a_kept_key_holds_every_plain_setting_none_included_and_no_object():
    """A setting that is None (FLOATER's --floater-step unset) is in the key like any other, so
    that setting it later does not reuse what was kept; objects that are not values are left out
    (their identity would make every forward recompute)."""
    from fairseq_posenc.positions.kept import configuration

    module = torch.nn.Linear(2, 2)
    module.step, module.dt, module.sizes, module.schedule, module._private = None, 0.1, [1, 2], object(), 3
    settings = dict(configuration(module))
    assert settings[".step"] is None and settings[".dt"] == 0.1 and settings[".sizes"] == (1, 2)
    assert ".schedule" not in settings and "._private" not in settings and ".training" not in settings
    assert settings[""] == "Linear"


def test_state_dicts_are_for_saving_except_inside_not_saving():
    """FLOATER brings its kept solution up to date for a state dict that is saved, not for the
    two fairseq's EMA reads every update (kept.not_saving); nested uses keep it off until the last ends."""
    from fairseq_posenc.positions import kept

    assert kept.saving()
    with kept.not_saving():
        assert not kept.saving()
        with kept.not_saving():
            assert not kept.saving()
        assert not kept.saving()
    assert kept.saving()


def test_kept_result_keys_are_the_state_dict_keys_of_the_solution():
    from fairseq_posenc.positions.kept import kept_result_keys

    model = build_model("transformer_posenc", "--position-encoding", "floater")
    ode = model.encoder.position_encoding.ode
    keys = kept_result_keys(model)
    assert {"encoder.position_encoding.ode.solution", "encoder.position_encoding.ode.fingerprint"} <= keys
    assert all(k.startswith("encoder.position_encoding.ode.") for k in keys)
    assert kept_result_keys(ode) == set(type(ode).kept_results)  # the module itself: no prefix, no dot
    assert {"solution", "fingerprint"} <= set(ode.state_dict())
