"""fairseq_posenc/bias_bound.py: the sum of the learning rates of an inverse_sqrt run, the largest
bias each learned logit bias adds, and both read from a fairseq checkpoint; the demo's table."""
import importlib.util
import math
import os

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.optim import FairseqOptimizer
from fairseq.optim.lr_scheduler.inverse_square_root_schedule import (
    InverseSquareRootLRScheduleConfig,
    InverseSquareRootSchedule,
)

from fairseq_posenc import bias_bound
from posenc_workflow import pipeline, toy_data
from fairseq_posenc.positions import POSITION_ENCODINGS, AttentionPositions
from fairseq_posenc.positions.bias_scale import uses_bias_scale
from helpers.toy import ToyTask, model_args, with_strong_positions
from helpers.fairseq_runs import preprocess_here

SCALED = [name for name, scheme in POSITION_ENCODINGS.items() if uses_bias_scale(scheme)]


@pytest.mark.parametrize("peak, warmup, updates, init, expected", [
    # lr of updates 1..6: 0, 1/4, 2/4, 3/4 (warmup from 0), then sqrt(4/4), sqrt(4/5)
    (1.0, 4, 6, -1.0, 0 + 0.25 + 0.5 + 0.75 + 1 + math.sqrt(0.8)),
    (1.0, 4, 3, -1.0, 0 + 0.25 + 0.5),  # still warming up
    # --warmup-init-lr 0.1: 0.1, 0.1 + 0.9 / 2, then sqrt(2/2)
    (1.0, 2, 3, 0.1, 0.1 + 0.55 + 1.0),
    (1.0, 4, 0, -1.0, 0.0),
])
def test_the_lr_sum_matches_a_hand_computation(peak, warmup, updates, init, expected):
    assert bias_bound.inverse_sqrt_lr_sum(peak, warmup, updates, init) == pytest.approx(expected, rel=1e-12)


class _LrRecorder(FairseqOptimizer):
    def __init__(self):
        super().__init__(None)
        self._optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)


@pytest.mark.parametrize("peak, warmup, updates, init", [
    (3e-3, 100, 800, -1.0),  # the demo
    (7e-4, 4000, 10_000, 1e-7),  # the WMT base recipe's schedule, cut short
    (5e-4, 10, 7, -1.0),
])
def test_the_lr_sum_is_what_fairseqs_schedule_sets_update_by_update(peak, warmup, updates, init):
    optimizer = _LrRecorder()
    schedule = InverseSquareRootSchedule(
        InverseSquareRootLRScheduleConfig(warmup_updates=warmup, warmup_init_lr=init, lr=[peak]), optimizer)
    # as fairseq's Trainer: step_update(0) when training begins, each update runs at the lr set,
    # and step_update(n) after the n-th
    schedule.step_update(0)
    total = 0.0
    for n in range(1, updates + 1):
        total += optimizer.get_lr()
        schedule.step_update(n)
    assert bias_bound.inverse_sqrt_lr_sum(peak, warmup, updates, init) == pytest.approx(total, rel=1e-9)


def test_the_budgets_the_finding_quotes():
    # the demo: 100 warmup updates sum to 3e-3 x 99 / 2 = 0.1485, then 3e-3 x sqrt(100) x
    # sum_{n=100}^{799} n^(-1/2) ~ 0.03 x 2 (sqrt(799.5) - sqrt(99.5)) = 1.098
    assert bias_bound.inverse_sqrt_lr_sum(3e-3, 100, 800) == pytest.approx(1.2465, abs=1e-3)
    # the WMT base recipe: 7e-4, 4000 warmup updates from 1e-7, 100k updates
    assert bias_bound.inverse_sqrt_lr_sum(7e-4, 4000, 100_000, 1e-7) == pytest.approx(23.8, abs=0.1)


def test_a_schedule_without_warmup_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--warmup-updates must be at least 1"):
        bias_bound.inverse_sqrt_lr_sum(1e-3, 0, 10)


def _model(*flags, seed=1):
    """A model with position parameters (and segment scalars) of size 0.5, and its args."""
    task = ToyTask()
    task.source_dictionary.add_symbol("<sep>")
    args = model_args("transformer_posenc", *flags, *(["--max-segments", "2"] if "--segment-attention" in flags else []))
    torch.manual_seed(seed)
    model = ARCH_MODEL_REGISTRY["transformer_posenc"].build_model(args, task)
    if getattr(model.encoder, "segment_bias", None) is not None:  # initialised at 0
        model.encoder.segment_bias.weight.data.normal_(0, 0.5)
    return with_strong_positions(model), args


def _largest_added(term, tokens):
    """The largest |bias| ``term`` adds to any layer's logits over the tokens' frame."""
    pos = AttentionPositions.build(tokens.size(1), tokens.size(1), None, tokens.device)
    with torch.no_grad():
        term.begin_forward(tokens)
        return max(term.attention_bias(layer, None, pos).abs().max().item() for layer in range(term.num_layers))


@pytest.mark.parametrize("encoding", SCALED)
def test_the_largest_bias_is_the_largest_that_attention_adds(encoding):
    model, args = _model("--position-encoding", encoding, "--position-bias-scale", "2.5", "--segment-attention")
    # a frame that uses every parameter: DIET-ABS's whole table (64 positions), every T5 bucket
    # and DIET-REL offset (distances past 128), both segments of --max-segments 2 and all four pairs
    length = 200 if POSITION_ENCODINGS[encoding].extrapolates else 64
    tokens = torch.full((1, length), 4)
    tokens[0, length // 2] = model.encoder.dictionary.index("<sep>")
    found = bias_bound.largest_biases(model.state_dict(), args)
    assert set(found) == {"encoder", "decoder", "segments"}
    for name, term in (("encoder", model.encoder.position_encoding), ("decoder", model.decoder.position_encoding),
                       ("segments", model.encoder.segment_bias)):
        # the same maths on the same parameters in another order (S * w, or the float32 sum of
        # r = 8 products scaled before or after, its largest entry far from cancelling): measured
        # within 5e-8 relative
        assert found[name] == pytest.approx(_largest_added(term, tokens), rel=1e-6), name


def test_a_model_without_learned_logit_biases_has_none():
    model, args = _model("--position-encoding", "sinusoidal")
    assert bias_bound.largest_biases(model.state_dict(), args) == {}
    model, args = _model("--position-encoding", "rope", "--segment-attention", "--position-bias-scale", "3")
    assert bias_bound.largest_biases(model.state_dict(), args) == {
        "segments": pytest.approx(3 * model.encoder.segment_bias.weight.abs().max().item())}


@pytest.fixture(scope="module")
def three_updates(tmp_path_factory):
    """fairseq-train, t5 with --position-bias-scale 10, a checkpoint after each of 3 updates."""
    root = tmp_path_factory.mktemp("bias_bound")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (400, 3, 8), "valid": (20, 3, 8)})
    data_bin = preprocess_here(prefixes, str(root / "bin"))
    flags = pipeline.toy_train_flags("t5", max_update=3, seed=4, size="tiny", lr=3e-3, max_tokens=500)
    pipeline.train(data_bin, str(root / "checkpoints"),
                   flags + ["--position-bias-scale", "10", "--save-interval-updates", "1", "--disable-validation"])
    return root / "checkpoints"


@pytest.mark.slow  # fairseq-train
def test_a_checkpoint_report_reads_the_scale_and_schedule_and_rebuilds_the_initial_model(three_updates):
    # fairseq's first update runs at --warmup-init-lr, 0: its checkpoint holds the initial
    # parameters, which the report rebuilds from the seed exactly
    first = bias_bound.checkpoint_bias_report(str(three_updates / "checkpoint_1_1.pt"))
    assert first["position_bias_scale"] == 10.0 and first["updates"] == 1 and first["lr_sum"] == 0.0
    assert first["trained"] == first["initial"] == first["bound"]
    assert set(first["trained"]) == {"encoder", "decoder"}
    third = bias_bound.checkpoint_bias_report(str(three_updates / "checkpoint_1_3.pt"))
    # updates 2 and 3 run at 3e-3 x 1/100 and 2/100
    assert third["updates"] == 3 and third["lr_sum"] == pytest.approx(9e-5, rel=1e-12)
    assert third["initial"] == first["initial"]
    assert all(third["trained"][name] <= bound for name, bound in third["bound"].items())
    assert third["bound"]["encoder"] == pytest.approx(third["initial"]["encoder"] + 10 * 9e-5)
    # Adam's steps 2 and 3 (step 1 ran at lr 0) move w by at most 1.001 and 1.003 lr (the bound
    # in bias_bound's docstring, bias-corrected, at t = 2 and 3): the bias, 10 w, by at most
    # 10 x sum(lr) x 1.003, and its entries that learn by about that
    first_state = bias_bound._load(str(three_updates / "checkpoint_1_1.pt"))["model"]
    third_state = bias_bound._load(str(three_updates / "checkpoint_1_3.pt"))["model"]
    for stack in ("encoder", "decoder"):
        key = f"{stack}.position_encoding.bias.weight"
        moved = 10 * (third_state[key] - first_state[key]).abs().max().item()
        assert 0.5 * 10 * 9e-5 < moved <= 1.01 * 10 * 9e-5, stack


def _demo_module():
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts", "demo.py")
    spec = importlib.util.spec_from_file_location("demo", path)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    return demo


def test_the_demo_reports_the_mean_bias_over_seeds_next_to_its_bound():
    from posenc_workflow import report as demo  # the demo's report, written by the workflow

    def report(enc, dec, bound=True):
        return {"position_bias_scale": 10.0, "updates": 800, "lr_sum": 1.25,
                "trained": {"encoder": enc, "decoder": dec}, "initial": {"encoder": 0.05, "decoder": 0.07},
                "bound": {"encoder": 12.55 if bound else None, "decoder": 12.57 if bound else None}}

    t5 = demo.mean_bias([report(1.0, 2.0), report(3.0, 4.0)])
    assert t5["trained"] == {"encoder": 2.0, "decoder": 3.0} and t5["bound"]["encoder"] == pytest.approx(12.55)
    assert len(t5["seeds"]) == 2
    abs_ = demo.mean_bias([report(5.0, 6.0, bound=False)])
    table = demo.bias_table([{"encoding": "sinusoidal"}, {"encoding": "t5", "bias": t5},
                             {"encoding": "diet_abs", "bias": abs_}])
    assert "| t5 | encoder | 2.000 | 0.050 | 12.550 |" in table
    assert "| diet_abs | decoder | 6.000 | 0.070 | - (a product) |" in table
    assert "sinusoidal" not in table
    assert "S = 10, sum(lr) = 1.250 over the 800 updates of the newest checkpoint averaged." in table
    assert "diet_abs: a product of parameters" in table
    assert demo.bias_table([{"encoding": "sinusoidal"}]) == ""


def test_the_demo_refuses_a_scale_that_is_not_positive_before_any_work(tmp_path, capsys):
    demo = _demo_module()
    for scale in ("0", "-2", "inf"):
        with pytest.raises(SystemExit) as exit_:
            demo.main(["--position-bias-scale", scale, "--out", str(tmp_path)])
        assert exit_.value.code == 2
        assert "--position-bias-scale must be a positive finite number" in capsys.readouterr().err
        assert not os.path.exists(tmp_path / "raw")


def test_the_demo_passes_the_scale_only_to_the_encodings_that_take_it():
    """The demo's study (recipes/conf/demo.yaml) with --position-bias-scale 10 (train's
    position_bias_scale): each model's fairseq-train command has the flag where its encoding takes
    it, and not elsewhere, where it would be refused as changing nothing."""
    import yaml
    from snakemake.utils import validate

    from posenc_workflow import workflow

    conf = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "recipes", "conf")
    with open(os.path.join(conf, "demo.yaml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    config["models"]["encodings"] = list(POSITION_ENCODINGS)
    config["train"]["position_bias_scale"] = 10.0
    validate(config, os.path.join(conf, "schema.yaml"))
    study = workflow.Study(config, preflight=False)
    seen = set()
    for model in study.models:
        flags = study.command(model)
        seen.add(model.encoding)
        assert (flags[flags.index("--position-bias-scale") + 1] == "10.0") if model.encoding in SCALED \
            else "--position-bias-scale" not in flags, model.encoding
    assert seen >= set(POSITION_ENCODINGS)
