"""--bf16 without a TPU (fairseq issue #4696, ``compat.bf16_without_tpu``), and decoding in bf16.

fairseq's ``options.py`` turns ``--bf16`` (and ``--memory-efficient-bf16``) into ``--tpu``, which
the config then holds in four places: ``common``, and copies in ``distributed_training``,
``optimizer`` and ``model``. One process asks torch_xla for its device; two wrap the model for
TPUs. With the fix, fairseq-train trains in bf16 on the CPU (``--cpu``), in one process and in
two; CUDA runs the same code with another device.

What fairseq keeps in bf16 (its trainer and ``optim/fp16_optimizer.py``): the model (weights,
activations, gradients) is cast to bf16; ``--bf16`` keeps an fp32 master copy of the weights in
its optimizer, ``--memory-efficient-bf16`` none; Adam's moments are fp32 in both, and there is no
loss scaling. A checkpoint stores the weights as fp32 (``utils.move_to_cpu`` casts bf16 to fp32)
holding bf16 values, and not the master copy.
"""
import json
import math
import os
import socket
import subprocess

import pytest
import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq.optim.fp16_optimizer import FP16Optimizer, MemoryEfficientFP16Optimizer
from fairseq.trainer import Trainer

from fairseq_posenc import compat
from posenc_workflow import pipeline, toy_data
from helpers.fairseq_runs import preprocess_here
from helpers.tolerances import assert_within, float32_tolerance, transformer_terms
from helpers.toy import build_model, model_that_saved

MAX_UPDATE = 3
TINY = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2"]
PRECISIONS = ["--bf16", "--memory-efficient-bf16"]
#: bf16 keeps 8 significant bits: rounding to nearest moves a value by at most 2**-8 of it
BF16_ROUNDING = torch.finfo(torch.bfloat16).eps / 2
TPU_SECTIONS = ("common", "distributed_training", "optimizer", "model")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (200, 3, 8), "valid": (20, 3, 8)})
    return {"root": root, "bin": preprocess_here(prefixes, str(root / "bin"))}


def _train_command(data_bin, save_dir, *extra):
    return [pipeline.executable("fairseq-train"), data_bin, "--user-dir", pipeline.USER_DIR, "--save-dir", save_dir,
            "--arch", "transformer_posenc", "--cpu", *TINY, "--optimizer", "adam", "--lr", "1e-3",
            "--max-tokens", "500", "--max-update", str(MAX_UPDATE), "--no-epoch-checkpoints", "--seed", "1",
            "--log-format", "json", "--log-interval", "1", "--no-progress-bar", "--num-workers", "0", *extra]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_together(commands):
    """{name: log} of fairseq-train processes started at once: their start-up (imports, one core
    each) is most of their time. Two at a time: the suite runs on 2 cores."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    procs = {name: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for name, cmd in commands.items()}
    logs = {name: proc.communicate(timeout=300)[0] for name, proc in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 0, f"{name}:\n" + "\n".join(logs[name].splitlines()[-20:])
    return logs


@pytest.fixture(scope="module")
def trained(corpus):
    """One fairseq-train process per precision."""
    root = corpus["root"]
    logs = _run_together({precision: _train_command(corpus["bin"], str(root / precision.strip("-")), precision)
                          for precision in PRECISIONS})
    return {"root": root, "logs": logs}


@pytest.fixture(scope="module")
def two_ranks(corpus):
    """Two --bf16 ranks started by hand (gloo over loopback), as a node's launcher would."""
    root, init = corpus["root"], f"tcp://127.0.0.1:{_free_port()}"
    logs = _run_together({rank: _train_command(
        corpus["bin"], str(root / "two_ranks"), "--bf16", "--distributed-world-size", "2",
        "--distributed-rank", str(rank), "--distributed-init-method", init, "--distributed-no-spawn",
        "--distributed-backend", "gloo") for rank in (0, 1)})
    return {"save_dir": root / "two_ranks", "logs": logs}


def _losses(log_text):
    """Every update's row as fairseq logs it (json lines of train_inner)."""
    rows = [json.loads(line.split("| train_inner | ", 1)[1]) for line in log_text.splitlines()
            if "| train_inner | " in line]
    assert [int(r["num_updates"]) for r in rows] == list(range(1, MAX_UPDATE + 1))
    return rows


def _config(data_bin, *flags):
    """The config fairseq-train makes of these flags, before ``call_main``."""
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[
        data_bin, "--user-dir", pipeline.USER_DIR, "--arch", "transformer_posenc", "--cpu", *TINY,
        "--optimizer", "adam", "--lr", "1e-3", "--distributed-world-size", "1", *flags])
    return convert_namespace_to_omegaconf(args)


def _through_call_main(cfg):
    """The config ``main`` receives from fairseq's ``call_main`` (with the plugin: compat's)."""
    received = []
    distributed_utils.call_main(cfg, received.append)
    return received[0]


def _trainer(cfg):
    task = tasks.setup_task(cfg.task)
    return Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))


def _tpu(cfg):
    return {name: getattr(cfg[name], "tpu") for name in TPU_SECTIONS}


@pytest.mark.parametrize("precision", PRECISIONS)
def test_stock_fairseq_takes_the_tpu_path_for_bf16(corpus, precision):
    """What the fix is for: the config stock fairseq passes to ``main`` (``call_main`` does not
    change it for one process) asks every part of fairseq for a TPU."""
    cfg = _config(corpus["bin"], precision)
    assert _tpu(cfg) == dict.fromkeys(TPU_SECTIONS, True)
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'xla_device'"):
        _trainer(cfg)


def test_bf16_trainer_runs_on_the_cpu_with_an_fp32_master_copy(corpus):
    compat.apply()
    cfg = _through_call_main(_config(corpus["bin"], "--bf16"))
    assert _tpu(cfg) == dict.fromkeys(TPU_SECTIONS, False)
    trainer = _trainer(cfg)
    assert trainer.device == torch.device("cpu") and not trainer.tpu
    params = list(trainer.model.parameters())
    assert {p.dtype for p in params} == {torch.bfloat16}
    optimizer = trainer.optimizer
    assert type(optimizer) is FP16Optimizer and optimizer.scaler is None
    # one fp32 copy per parameter (not flattened: bf16 skips fairseq's CUDA-only flat buffer)
    masters = optimizer.fp32_params
    assert [m.dtype for m in masters] == [torch.float32] * len(params)
    assert [m.shape for m in masters] == [p.shape for p in params]
    assert all(torch.equal(m.to(torch.bfloat16), p) for m, p in zip(masters, params))


def test_memory_efficient_bf16_trainer_runs_on_the_cpu_without_a_master_copy(corpus):
    compat.apply()
    cfg = _through_call_main(_config(corpus["bin"], "--memory-efficient-bf16"))
    assert cfg.common.bf16 and _tpu(cfg) == dict.fromkeys(TPU_SECTIONS, False)
    trainer = _trainer(cfg)
    assert trainer.device == torch.device("cpu")
    optimizer = trainer.optimizer
    assert type(optimizer) is MemoryEfficientFP16Optimizer and optimizer.scaler is None
    # Adam updates the bf16 weights themselves
    stepped = [p for group in optimizer.wrapped_optimizer.optimizer.param_groups for p in group["params"]]
    assert {p.dtype for p in stepped} == {torch.bfloat16}
    assert {id(p) for p in stepped} == {id(p) for p in trainer.model.parameters()}


def test_tpu_stays_where_torch_xla_is_installed_or_without_bf16(corpus):
    cfg = _config(corpus["bin"], "--bf16")
    assert not compat.clear_tpu_for_bf16(cfg, xla_available=True)
    assert _tpu(cfg) == dict.fromkeys(TPU_SECTIONS, True)
    cfg = _config(corpus["bin"], "--tpu")
    assert not compat.clear_tpu_for_bf16(cfg, xla_available=False)
    assert cfg.common.tpu and not cfg.common.bf16
    cfg = _config(corpus["bin"])
    assert not compat.clear_tpu_for_bf16(cfg, xla_available=False)
    assert _tpu(cfg) == dict.fromkeys(TPU_SECTIONS, False)


@pytest.mark.parametrize("precision, wrapper", [("--bf16", "FP16Optimizer"),
                                                ("--memory-efficient-bf16", "MemoryEfficientFP16Optimizer")])
def test_cpu_bf16_trains_through_fairseq_train(trained, precision, wrapper):
    log = trained["logs"][precision]
    assert "bf16 without torch_xla: --tpu cleared, training on the CPU" in log
    rows = _losses(log)
    assert all(math.isfinite(float(r["loss"])) for r in rows)
    assert not any("loss_scale" in r for r in rows)  # bf16 has fp32's range: no loss scaling
    state = torch.load(trained["root"] / precision.strip("-") / "checkpoint_last.pt", map_location="cpu")
    assert state["optimizer_history"][-1]["num_updates"] == MAX_UPDATE
    assert state["optimizer_history"][-1]["optimizer_name"] == wrapper
    cfg = state["cfg"]
    assert cfg["common"]["bf16"] and cfg["common"]["memory_efficient_bf16"] == (precision != "--bf16")
    assert cfg["common"]["cpu"] and not cfg["common"]["fp16"]
    assert {name: getattr(cfg[name], "tpu", None) if name == "model" else cfg[name]["tpu"]
            for name in TPU_SECTIONS} == dict.fromkeys(TPU_SECTIONS, False)
    # saved as fp32, every value a bf16 number: casting it to bf16 and back is exact (an fp32 run's
    # weights, with 24 significant bits, are not)
    weights = {k: v for k, v in state["model"].items() if v.is_floating_point()}
    assert {v.dtype for v in weights.values()} == {torch.float32}
    assert [k for k, v in weights.items() if not torch.equal(v, v.to(torch.bfloat16).float())] == []
    moments = [v for s in state["last_optimizer_state"]["state"].values() for k, v in s.items()
               if k in ("exp_avg", "exp_avg_sq")]
    assert moments and {m.dtype for m in moments} == {torch.float32}
    assert "loss_scale" not in state["last_optimizer_state"]


def test_two_processes_train_bf16_on_the_cpu(two_ranks):
    """Without clearing ``distributed_training.tpu`` too, fairseq wraps the model for TPUs and the
    first gradient all-reduce imports torch_xla."""
    logs = two_ranks["logs"]
    assert "distributed init (rank 0)" in logs[0] and "distributed init (rank 1)" in logs[1]
    # rank 0 logs the statistics of both
    assert all(math.isfinite(float(r["loss"])) for r in _losses(logs[0]))
    state = torch.load(two_ranks["save_dir"] / "checkpoint_last.pt", map_location="cpu")
    assert state["optimizer_history"][-1]["num_updates"] == MAX_UPDATE
    dist = state["cfg"]["distributed_training"]
    assert dist["distributed_world_size"] == 2 and not dist["tpu"] and state["cfg"]["common"]["bf16"]


@pytest.mark.parametrize("flags, dtype", [([], torch.float32), (["--bf16"], torch.bfloat16),
                                          (["--memory-efficient-bf16"], torch.bfloat16),
                                          # fairseq-generate halves the model itself, before
                                          (["--fp16"], torch.float32)])
def test_prepare_for_inference_casts_to_bf16_for_bf16(corpus, flags, dtype):
    args = options.parse_args_and_arch(options.get_generation_parser(), input_args=[
        corpus["bin"], "--user-dir", pipeline.USER_DIR, "--path", "unused.pt", "--cpu", *flags])
    cfg = convert_namespace_to_omegaconf(args)
    model = build_model("transformer_posenc")
    model.prepare_for_inference_(cfg)
    assert {p.dtype for p in model.parameters()} == {dtype}


def _generate(data_bin, checkpoint, *flags):
    out = subprocess.run(
        [pipeline.executable("fairseq-generate"), data_bin, "--user-dir", pipeline.USER_DIR, "--path", checkpoint,
         "--gen-subset", "valid", "--cpu", "--beam", "2", "--max-len-b", "12", "--batch-size", "8", *flags],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = {}
    for line in out.stdout.splitlines():
        if line[:2] in ("S-", "H-", "P-"):
            key, _, rest = line.partition("\t")
            lines[(key[0], int(key[2:]))] = rest
    return lines


def _bf16_roundings(model):
    """bf16 roundings along the chain from the tokens to a logit. A bf16 kernel (matrix product,
    softmax, layer norm) accumulates in fp32 and rounds its output once. Per side, the embedding
    is scaled, the position table cast and added (3); an attention block rounds its projections,
    the scaled query, the logits, the softmax, the weighted sum, the output projection, the
    residual sum and its layer norm (8); a feed-forward block fc1, fc2, the residual sum and its
    layer norm (4); then the output projection (1)."""
    layers = len(model.encoder.layers) + len(model.decoder.layers)
    attention = layers + sum(layer.encoder_attn is not None for layer in model.decoder.layers)
    return 2 * 3 + 8 * attention + 4 * layers + 1


def _peak(model):
    """Hooks recording the largest |value| any module of ``model`` outputs."""
    peak = [1.0]  # layer-normed activations are of size 1

    def record(module, inputs, output):
        for t in output if isinstance(output, tuple) else (output,):
            if torch.is_tensor(t) and t.is_floating_point() and t.numel():
                peak[0] = max(peak[0], t.detach().abs().max().item())

    return peak, [m.register_forward_hook(record) for m in model.modules()]


@pytest.mark.numerics
def test_generate_with_bf16_decodes_in_bf16(trained, corpus):
    """fairseq-generate casts a model only for --fp16; the plugin's models cast themselves for
    --bf16 (``prepare_for_inference_``). Each positional score of the bf16 beam search is compared
    with the fp32 model's log-probability of the same token (teacher-forced, one sentence at a
    time). The weights are bf16 numbers (the model trained in bf16), so the two differ by the
    arithmetic alone. A token's log-probability moves by at most twice the largest logit error (the
    token's logit and the log-sum-exp), and each of the roundings along the chain adds at most
    2**-8 of the values it passes, the largest of which the fp32 forward records. An fp32 decode
    stays within the fp32 tolerance (tests/fairseq/test_cli_encodings.py): bf16 must leave it somewhere
    and stay within the bf16 bound everywhere. Printed scores are 4 decimals (up to 5e-5 off)."""
    checkpoint = str(trained["root"] / "bf16" / "checkpoint_last.pt")
    lines = _generate(corpus["bin"], checkpoint, "--bf16")
    model, dictionary = model_that_saved(checkpoint, corpus["bin"])
    peak, hooks = _peak(model)
    sentences = sorted(i for kind, i in lines if kind == "H")
    assert sentences == list(range(20))
    beyond_fp32 = []
    with torch.no_grad():
        for i in sentences:
            src = dictionary.encode_line(lines["S", i], add_if_not_exist=False).long()[None]
            target = dictionary.encode_line(lines["H", i].split("\t", 1)[1], add_if_not_exist=False).long()[None]
            decoded = torch.tensor([float(x) for x in lines["P", i].split()], dtype=torch.float64)
            assert decoded.numel() == target.size(1)
            prev = torch.cat([target.new_tensor([[dictionary.eos()]]), target[:, :-1]], dim=1)
            peak[0] = 1.0
            lprobs = model.get_normalized_probs(model(src, torch.tensor([src.size(1)]), prev), log_probs=True)
            expected = lprobs[0].gather(-1, target[0, :, None])[:, 0].double() / math.log(2)
            # the beam's running sums of n log-probabilities, of which a positional score is a difference
            n = target.size(1)
            fp32 = (float32_tolerance(transformer_terms(model, src.size(1), n), peak[0])
                    + float32_tolerance(2 * n, n * expected.abs().max().item())) / math.log(2) + 0.5e-4
            bf16 = 2 * _bf16_roundings(model) * BF16_ROUNDING * peak[0] / math.log(2)
            assert_within(decoded, expected, fp32 + bf16, f"sentence {i}: bf16 decode against fp32")
            beyond_fp32.append(((decoded - expected).abs().max().item(), fp32))
    for hook in hooks:
        hook.remove()
    largest, fp32 = max(beyond_fp32)
    print(f"largest |bf16 - fp32| positional score {largest:.4g} bits (an fp32 decode: within {fp32:.3g})")
    assert any(difference > fp32 for difference, fp32 in beyond_fp32), beyond_fp32
