"""fairseq's EMA (``--store-ema``) with every position encoding.

fairseq copies the model (``copy.deepcopy``) right after the first update, when the tables and
solutions a scheme keeps still carry autograd history, and then decays every entry of the state
dict into the copy at every update, integer buffers and kept solutions included. fairseq 0.12's
translation task never validates the EMA model, so the tests read the EMA weights stored in the
checkpoint (``extra_state["ema"]``, what ``--load-ema-from-checkpoint`` loads) and check that a
fresh model loaded with them computes with tables of its own weights.
"""
import copy

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary

from posenc_workflow import toy_data
from fairseq_posenc.models.transformer_posenc import PosencTransformerModel
from fairseq_posenc.positions import POSITION_ENCODINGS
from fairseq_posenc.positions.kept import kept_result_keys
from helpers.fairseq_runs import outcome, preprocess_here, run_all, train_command
from helpers.tolerances import assert_within, float32_tolerance, magnitude, solution_tolerance, transformer_terms
from helpers.toy import TINY, build_model, full_log_probs, toy_batch, with_strong_positions

ENCODINGS = list(POSITION_ENCODINGS)
SOLVED = ("floater", "rnn")  # the encodings whose kept solution is stored in the checkpoint

# decay 0.5 from the first update: after 3 updates the EMA weights are a quarter of update 1's, a
# quarter of update 2's and half of update 3's, away from the trained weights by about one Adam
# step (lr 1e-2 on every weight): far outside rounding, so a result computed from the wrong
# weights cannot pass for one computed from the right ones
FLAGS = ["--arch", "transformer_posenc", "--cpu", *TINY, "--optimizer", "adam", "--lr", "1e-2",
         "--max-tokens", "500", "--max-update", "3", "--seed", "1", "--num-workers", "0", "--no-epoch-checkpoints",
         "--no-progress-bar", "--store-ema", "--ema-start-update", "0", "--ema-decay", "0.5"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One 3-update fairseq-train with --store-ema per encoding (one process for them all:
    fairseq_runs.py), on 40 sentence pairs: one batch an update."""
    root = tmp_path_factory.mktemp("ema")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (40, 3, 8), "valid": (8, 3, 8)})
    data_bin = preprocess_here(prefixes, str(root / "bin"))
    jobs = [(e, "fairseq-train", train_command(data_bin, str(root / e), ["--position-encoding", e, *FLAGS]))
            for e in ENCODINGS]
    return data_bin, root, run_all(jobs, str(root / "runs"))


def _model(state, weights, dictionary, strict=True):
    class Task:
        source_dictionary = target_dictionary = dictionary

    model = PosencTransformerModel.build_model(state["cfg"]["model"], Task())
    model.load_state_dict(weights, strict=strict)
    return model.eval()


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_ema_weights_are_stored_and_compute_with_their_own_tables(runs, encoding):
    data_bin, root, results = runs
    outcome(results, encoding)
    path = str(root / encoding / "checkpoint_last.pt")
    state = torch.load(path, map_location="cpu")
    trained, ema = state["model"], checkpoint_utils.load_ema_from_checkpoint(path)["model"]
    dictionary = Dictionary.load(f"{data_bin}/dict.src.txt")
    loaded = _model(state, ema, dictionary)
    kept = kept_result_keys(loaded)
    assert ema.keys() == trained.keys()
    # integer buffers (lengths, forms) and settings saved with the weights (S, C): taken as they are
    taken = {k for k, v in trained.items() if not v.is_floating_point() or k.endswith("._extra_state")} - kept
    for key in taken:
        assert torch.equal(ema[key], trained[key]), key
    # averaged, not copied: an EMA of the trained weights differs from them by about one step
    assert max((ema[k] - trained[k]).abs().max().item() for k in set(trained) - kept - taken) > 1e-3

    src, lengths, prev = toy_batch(dictionary, [8, 5, 7], tgt_len=6)
    # nothing kept comes with the weights: the same model solves and builds everything itself
    own = _model(state, {k: v for k, v in ema.items() if k not in kept}, dictionary, strict=False)
    with torch.no_grad():
        out, expected = full_log_probs(loaded, src, lengths, prev), full_log_probs(own, src, lengths, prev)
        of_trained = full_log_probs(_model(state, trained, dictionary), src, lengths, prev)
    tolerance = float32_tolerance(transformer_terms(own, 8, 6), magnitude(expected, floor=1))
    assert_within(out, expected, tolerance, "EMA model, loaded against solved anew")
    assert (of_trained - expected).abs().max().item() > 10 * tolerance  # the comparison tells weights apart

    if encoding in SOLVED:
        ode = own.encoder.position_encoding.ode
        stored = ema["encoder.position_encoding.ode.solution"]
        with torch.no_grad():
            fresh = ode._solve(ode.initial, 0, stored.size(0))
            trained_solution = _model(state, trained, dictionary).encoder.position_encoding.ode
            trained_solution = trained_solution._solve(trained_solution.initial, 0, stored.size(0))
        solve_tolerance = solution_tolerance(ode, stored.size(0), fresh)
        assert_within(stored, fresh, solve_tolerance, "the EMA model's stored solution")
        assert (trained_solution - fresh).abs().max().item() > 10 * solve_tolerance


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_model_copies_right_after_forward_and_backward(encoding):
    """What fairseq's EMA does after the first update: the copy keeps nothing of the original's
    forward (tensors with autograd history cannot be deep-copied), computes as the original does,
    and the original keeps what it kept."""
    model = with_strong_positions(build_model("transformer_posenc", "--position-encoding", encoding)).train()
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=8)
    full_log_probs(model, src, lengths, prev).sum().backward()
    cached = dict(model.encoder.position_encoding._forward_cache)
    twin = copy.deepcopy(model)
    for scheme in (twin.encoder.position_encoding, twin.decoder.position_encoding):
        assert scheme._forward_cache == {} and scheme._tables == {} and scheme._kept_from.empty
    if encoding in SOLVED:
        assert twin.encoder.position_encoding.ode._graph is None
        assert twin.decoder.position_encoding.solver is twin.encoder.position_encoding.ode  # the tie is copied
    assert model.encoder.position_encoding._forward_cache.keys() == cached.keys()
    model.eval(), twin.eval()
    with torch.no_grad():
        # the same operations on equal weights
        assert torch.equal(full_log_probs(twin, src, lengths, prev), full_log_probs(model, src, lengths, prev))


@pytest.mark.parametrize("encoding", SOLVED)
def test_an_ema_step_after_the_solution_grew(encoding):
    """A longer input grows the trained model's kept solution past the EMA model's (validation on
    longer sentences than before): fairseq's EMA step compares shapes and would refuse it. The EMA
    model keeps its own solution, and what it stores is solved from its own weights."""
    from fairseq.dataclass.configs import EMAConfig
    from fairseq.models.ema import EMA

    model = with_strong_positions(build_model("transformer_posenc", "--position-encoding", encoding)).train()
    src, lengths, prev = toy_batch(model.encoder.dictionary, [9, 5, 7], tgt_len=8)
    full_log_probs(model, src, lengths, prev).sum().backward()
    ema = EMA(model, EMAConfig(store_ema=True, ema_decay=0.5))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)  # as an update would: the EMA model's weights differ from the trained ones
        model.eval()
        full_log_probs(model, *toy_batch(model.encoder.dictionary, [100], tgt_len=3))
    ode = model.encoder.position_encoding.ode
    assert ode.solution.size(0) >= 100
    solves = []
    solve = type(ode)._solve
    type(ode)._solve = lambda self, *args: solves.append(self) or solve(self, *args)
    try:
        ema.step(model)
    finally:
        type(ode)._solve = solve
    assert solves == []  # an EMA step reads weights: nothing is solved for it at every update
    own = ema.get_model().encoder.position_encoding.ode
    stored = ema.get_model().state_dict()["encoder.position_encoding.ode.solution"]
    with torch.no_grad():
        fresh = own._solve(own.initial, 0, stored.size(0))
    # the same solve on the same weights in this process: the same operations
    assert torch.equal(stored, fresh)
    assert not torch.equal(stored[:64], ode.solution[:64])
