"""An fp16 overflow through fairseq-train: fairseq skips the update, halves its loss scale and trains
the same update on the next batch. With FLOATER's ``--floater-solve-every N`` the skipped update
must leave the cycle exactly as before it: the flow update at the cycle's end is the one of the same
training without the overflowed batch, and the run reaches its budget.

Each case is a pair of runs in one fresh process (tests/helpers/overflow_runs.py): one with the loss of one
training pass multiplied by inf (what a loss scale too large for a batch does), at an update that is
not the first of its cycle and whose batch is no longer than an earlier one of the cycle (where a
cycle's total modified in place could not be rolled back), and its twin that drops that batch
unseen. fairseq's Adam without moving averages (betas 0) and with an eps far above every gradient:
its step is lr / eps times the gradient the optimizer was handed, linear in it as SGD's is (fairseq's
SGD does not run under --memory-efficient-fp16), so that a gradient counted twice, or a mean over the wrong
number of updates, moves a parameter by a third or half as much again. Controls in the same process: FLOATER solving every update, and
sinusoidal, each with the same injection.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from posenc_workflow import pipeline, toy_data
from helpers.tolerances import float32_tolerance, magnitude
from helpers.fairseq_runs import preprocess_here

HELPERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers")
MODEL = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
         "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "4"]
#: Adam's step g lr / (|g| + eps) with betas 0: SLOPE = lr / eps times the gradient, to |g| / eps
#: (< 1e-3); large enough that the flow model moves by many fp16 spacings
ADAM = ["--optimizer", "adam", "--adam-betas", "(0, 0)", "--adam-eps", "1000", "--lr", "1000"]
SLOPE = 1.0
FLOATER = [(every, precision) for every in (2, 3) for precision in ("--fp16", "--memory-efficient-fp16")]
CONTROLS = {"floater-1": ["--position-encoding", "floater"], "sinusoidal": ["--position-encoding", "sinusoidal"]}
#: the flow model: h and the initial states (their checkpoint names)
FLOW = ("ode.initial", "ode.dynamics.")


def _argv(data_bin, save_dir, precision, *flags):
    return [data_bin, "--user-dir", pipeline.USER_DIR, "--save-dir", save_dir, "--arch", "transformer_posenc", *MODEL,
            "--cpu", precision, "--fp16-no-flatten-grads", "--criterion", "label_smoothed_cross_entropy",
            *ADAM, "--dropout", "0", "--max-tokens", "200", "--seed", "1",
            "--num-workers", "0", "--save-interval-updates", "1", "--no-epoch-checkpoints", "--disable-validation",
            "--no-progress-bar", *flags]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("overflow")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (200, 3, 10), "valid": (10, 3, 10)})
    data_bin = preprocess_here(prefixes, str(root / "bin"))
    jobs, budgets = [], {}

    def pair(name, precision, overflow, *flags):
        budgets[name] = int(flags[flags.index("--max-update") + 1])
        for twin, extra in ((name, {"overflow": overflow}), (name + "/without", {"skip_like": name})):
            jobs.append({"name": twin, "argv": _argv(data_bin, str(root / twin), precision, *flags), **extra})

    for every, precision in FLOATER:
        pair(f"floater-{every}{precision}", precision, {"every": every}, "--position-encoding", "floater",
             "--floater-solve-every", str(every), "--max-update", str(2 * every))
    for name, flags in CONTROLS.items():
        pair(name, "--fp16", 1, *flags, "--max-update", "3")
    spec, out = root / "spec.json", root / "out.json"
    spec.write_text(json.dumps(jobs))
    log = root / "runs.log"
    with open(log, "w") as f:
        subprocess.run([sys.executable, os.path.join(HELPERS, "overflow_runs.py"), str(spec), str(out)],
                       stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=root)
    if not out.exists():
        pytest.fail("the fairseq-train runs did not start:\n" + log.read_text()[-3000:])
    return root, json.loads(out.read_text()), budgets


def _result(results, name):
    if name not in results:
        pytest.fail(f"{name}: not run (the process stopped before it)")
    result = results[name]
    assert result["ok"], f"{name} died:\n{result.get('error')}"
    return result


def _params(path, names):
    """A checkpoint's floating-point entries (those whose name holds one of ``names``; None: all)."""
    state = torch.load(path, map_location="cpu", weights_only=False)["model"]
    return {k: v.double() for k, v in state.items()
            if v.is_floating_point() and not k.endswith("_extra_state") and (names is None or any(n in k for n in names))}


def _fp16_spacing(x):
    """The distance between neighbouring fp16 values at |x| (a checkpoint holds the fp16 model)."""
    exponent = torch.floor(torch.log2(x.abs().clamp_min(2.0 ** -14)))
    return 2.0 ** (exponent - 10)


def _checkpoint(root, name, updates):
    found = [f for f in os.listdir(root / name) if f.endswith(f"_{updates}.pt")]
    assert len(found) == 1, (name, updates, sorted(os.listdir(root / name)))
    return root / name / found[0]


def _assert_same_update(root, name, before, after, names, grad_terms):
    """The update of ``names`` from checkpoint ``before`` to ``after`` equals its twin's without
    the overflowed batch: to 1 fp16 spacing of the parameter (each side rounds its fp32 result to
    the fp16 model) plus SLOPE times the gradient's float32 rounding bound (``grad_terms`` roundings)
    and fp16's subnormal spacing 2**-24 (the two loss scales, powers of 2, differ only there)."""
    start, start_twin = _params(_checkpoint(root, name, before), names), \
        _params(_checkpoint(root, name + "/without", before), names)
    end = _params(_checkpoint(root, name, after) if after else root / name / "checkpoint_last.pt", names)
    end_twin = _params(_checkpoint(root, name + "/without", after) if after else
                       root / name / "without" / "checkpoint_last.pt", names)
    assert end.keys() == end_twin.keys() and len(end) >= 1
    moved = []
    for key in end:
        # until the overflow the two runs are the same run: the parameters it starts from are equal
        assert torch.equal(start[key], start_twin[key]), key
        got, want = end[key] - start[key], end_twin[key] - start_twin[key]
        tolerance = (torch.maximum(_fp16_spacing(end[key]), _fp16_spacing(end_twin[key]))
                     + SLOPE * (float32_tolerance(grad_terms, magnitude(want) / SLOPE, sides=2) + 2.0 ** -24))
        difference = (got - want).abs()
        assert (difference <= tolerance).all(), (name, key, difference.max().item(), tolerance.max().item())
        moved.append((want.abs().max() / tolerance.max()).item())
    # the update compared is far larger than the bound: for every entry of the flow model, for the
    # model's largest mover where every entry is compared
    assert (min(moved) if names else max(moved)) > 10, (name, moved)


@pytest.mark.parametrize("every, precision", FLOATER, ids=[f"N={e}{p}" for e, p in FLOATER])
def test_an_overflow_leaves_floaters_cycle_as_without_its_batch(runs, every, precision):
    root, results, budgets = runs
    name = f"floater-{every}{precision}"
    result, twin = _result(results, name), _result(results, name + "/without")
    # the overflow hit an update inside a cycle, after a batch at least as long, and was skipped
    assert "overflowed" in result and result["update"] % every != 0, result
    assert result["skipped"] == [result["overflowed"]] and twin["skipped"] == []
    assert result["updates"] == twin["updates"] == budgets[name]  # the run reached its budget
    # the flow update of the cycle that saw the overflow: 12 positions at most of 5 rk4 steps of 4
    # evaluations, each a sum over the width of 32, and the cycle's sums
    end = (result["update"] // every + 1) * every
    _assert_same_update(root, name, end - 1, end if end < budgets[name] else None, FLOW, 12 * 5 * 4 * 32 + every + 4)


@pytest.mark.parametrize("name", list(CONTROLS))
def test_without_a_cycle_an_overflow_skips_one_update(runs, name):
    """The controls: FLOATER solving every update and sinusoidal skip the overflowed batch, and the
    next update is that of the same training without it (every parameter of the model: each an
    update of its own gradient, a chain of sums through the tiny model)."""
    root, results, budgets = runs
    result, twin = _result(results, name), _result(results, name + "/without")
    assert result["overflowed"] == 1 and result["skipped"] == [1] and twin["skipped"] == []
    assert result["updates"] == twin["updates"] == budgets[name]
    _assert_same_update(root, name, 1, 2, None, 0)
