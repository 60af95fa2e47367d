"""The relation_distillation criterion: MiniLMv2's relations for encoder-decoder translation."""
import inspect
import os
import re
import subprocess

import pytest
import torch
from fairseq import checkpoint_utils, options
from fairseq.models import ARCH_MODEL_REGISTRY

from posenc_workflow import pipeline, toy_data
from fairseq_posenc.compat import PosencError
from fairseq_posenc.criterions.relation_distillation import (
    RelationDistillationConfig,
    RelationDistillationCriterion,
    relation_kl,
    relation_log_probs,
    student_widths,
)
from fairseq_posenc.models import from_flags
from helpers.tolerances import assert_within, float32_tolerance
from helpers.toy import TINY, model_args
from helpers.fairseq_runs import preprocess_here

TEACHER = TINY  # 2 + 2 layers, d=32, 4 heads
STUDENT = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
           "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
           "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("distil")
    prefixes = toy_data.write_toy_corpus(str(root / "raw"), {"train": (600, 3, 10), "valid": (40, 3, 10)})
    data_bin = preprocess_here(prefixes, str(root / "bin"))
    pipeline.train(data_bin, str(root / "teacher"), [
        "--arch", "transformer_posenc", "--position-encoding", "t5", "--cpu", *TEACHER, "--share-all-embeddings",
        "--optimizer", "adam", "--lr", "2e-3", "--max-tokens", "1000", "--max-update", "40",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--no-epoch-checkpoints", "--no-progress-bar", "--seed", "1", "--num-workers", "0"])
    teacher_path = str(root / "teacher" / "checkpoint_last.pt")
    _, _, task = checkpoint_utils.load_model_ensemble_and_task([teacher_path])
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    sample = dataset.collater([dataset[i] for i in range(6)])
    return {"root": root, "bin": data_bin, "teacher": teacher_path, "task": task, "sample": sample}


def criterion(setup, **kw):
    return RelationDistillationCriterion(setup["task"], False, 0.1, teacher_path=setup["teacher"],
                                         **{"relation_heads": 4, **kw})


def student(setup, *flags, encoding="sinusoidal", seed=3):
    torch.manual_seed(seed)
    args = model_args("transformer_posenc", "--position-encoding", encoding, *flags, max_positions=1024)
    return ARCH_MODEL_REGISTRY["transformer_posenc"].build_model(args, setup["task"])


def largest_relation_log_prob(*log_probs):
    """The largest |log-probability| of relations, leaving out the masked entries (-1e9)."""
    return max(lp[lp > -1e8].abs().max().item() for lp in log_probs)


def relation_losses(crit, model, sample):
    _, _, log = crit(model, sample)
    return {k: (log[k] / log[f"rel_{k.split('_')[1]}_rows"]).item() for k in log
            if k.startswith("rel_") and not k.endswith("_rows")}


@pytest.mark.numerics
def test_relation_loss_is_zero_for_a_copy_of_the_teacher(setup):
    crit = criterion(setup)
    teacher = crit._teacher[0]
    copy = ARCH_MODEL_REGISTRY["transformer_posenc"].build_model(teacher.args, setup["task"])
    copy.load_state_dict(teacher.state_dict())
    copy.eval()  # as the teacher: no dropout
    sample = setup["sample"]
    losses = relation_losses(crit, copy, sample)
    assert sorted(losses) == ["rel_dec_kk", "rel_dec_qq", "rel_dec_vv", "rel_enc_kk", "rel_enc_qq", "rel_enc_vv"]
    # The copy's relations are the teacher's up to the rounding of its forward (with gradients
    # it may pick other kernels). Both are normalised, so KL's first-order term in their
    # difference cancels: what is left is each row's log-softmax and KL sum, T + 1 and T terms
    # at the size of the teacher's relation log-probabilities (the mean over rows keeps it)
    net_input = sample["net_input"]
    masks = {"enc": net_input["src_tokens"].eq(crit.padding_idx),
             "dec": net_input["prev_output_tokens"].eq(crit.padding_idx)}
    teacher_inputs = crit._teacher[1]
    largest = largest_relation_log_prob(*(
        relation_log_probs(teacher_inputs.project(site, r), crit.heads, masks[site], causal=site == "dec")
        for site in crit.sites for r in crit.relations))
    length = max(net_input["src_tokens"].size(1), net_input["prev_output_tokens"].size(1))
    tolerance = float32_tolerance(2 * length + 1, largest)
    assert tolerance < 1e-3  # what another student scores, below
    assert_within(torch.tensor(list(losses.values())), torch.zeros(len(losses)), tolerance)


def test_relation_loss_is_positive_for_another_student(setup):
    losses = relation_losses(criterion(setup), student(setup, *STUDENT), setup["sample"])
    assert min(losses.values()) > 1e-3


@pytest.mark.numerics
def test_relation_loss_does_not_depend_on_the_students_head_count(setup):
    # one layer: the self-attention input is the embedding, the same for both students
    four = student(setup, *STUDENT, "--encoder-attention-heads", "4", "--decoder-attention-heads", "4")
    one = student(setup, *STUDENT, "--encoder-attention-heads", "1", "--decoder-attention-heads", "1")
    one.load_state_dict(four.state_dict())
    four.eval(), one.eval()
    crit = criterion(setup)
    a, b = relation_losses(crit, four, setup["sample"]), relation_losses(crit, one, setup["sample"])
    assert sorted(a) == sorted(b) == [f"rel_{site}_{r}" for site in ("dec", "enc") for r in ("kk", "qq", "vv")]
    for key in a:
        # exactly: the relations are computed from the layer's projections of its input, the same
        # operations on the same values in both students; only the attention after them differs
        assert a[key] == b[key], key


def test_no_gradient_reaches_the_teacher(setup):
    crit = criterion(setup)
    model = student(setup, *STUDENT)
    loss, _, _ = crit(model, setup["sample"])
    loss.backward()
    teacher = crit._teacher[0]
    assert not teacher.training
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert model.encoder.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    assert "teacher" not in str(list(crit.state_dict()))  # not saved with the student's checkpoints


@pytest.mark.numerics
def test_padding_and_future_positions_contribute_nothing():
    g = torch.Generator().manual_seed(0)
    t, s = torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)
    pad = torch.tensor([[True, True, False, False, False], [False] * 5])
    # padded keys get no probability, padded queries no weight: the padded sentence scores as if alone
    total, rows = relation_kl(t, s, 2, pad, causal=False)
    alone0 = relation_kl(t[:1, 2:], s[:1, 2:], 2, pad[:1, 2:], causal=False)
    alone1 = relation_kl(t[1:], s[1:], 2, pad[1:], causal=False)
    assert rows.item() == 8
    # a relation logit (4 terms), its log-softmax and the KL (5 keys each), the sum over 8 rows
    largest = largest_relation_log_prob(relation_log_probs(t, 2, pad, False), relation_log_probs(s, 2, pad, False))
    assert_within(total, alone0[0] + alone1[0], float32_tolerance(4 + 5 + 5 + 8, largest))
    # in the decoder, changing a later position changes no earlier row
    causal = relation_log_probs(s, 2, torch.zeros(2, 5, dtype=torch.bool), causal=True)
    s2 = s.clone()
    s2[:, 4] += 1.0
    changed = relation_log_probs(s2, 2, torch.zeros(2, 5, dtype=torch.bool), causal=True)
    # exactly: rows 0-3 are the same dot products of the same vectors, the changed key masked in both
    assert torch.equal(changed[:, :, :4], causal[:, :, :4])
    assert causal.exp()[:, :, 1, 2:].abs().max() == 0  # no probability on the future


def test_relation_heads_that_do_not_divide_the_teacher_stop_at_construction(setup):
    with pytest.raises(PosencError) as error:
        criterion(setup, relation_heads=48)
    assert str(error.value) == ("--relation-heads 48 does not divide the attention width 32 of the teacher's "
                                "encoder; choose a divisor of 32")


def test_a_criterion_value_is_refused_while_fairseq_parses():
    """fairseq parses again once the criterion added its options: a bad value stops there, before
    the model and the criterion are built (positions/values.py's ``check_when_parsed``)."""
    with pytest.raises(PosencError, match=r"^--relation-heads must be positive, got 0$"):
        options.parse_args_and_arch(options.get_training_parser(), input_args=[
            "data", "--user-dir", pipeline.USER_DIR, "--arch", "transformer_posenc", "--criterion",
            "relation_distillation", "--relation-heads", "0"])


def test_relation_heads_that_do_not_divide_the_student_stop_fairseq_train_before_training(setup, tmp_path):
    # 32 divides the teacher's width (32), not the student's (16): one line naming both
    proc = subprocess.run([
        pipeline.executable("fairseq-train"), setup["bin"], "--user-dir", pipeline.USER_DIR,
        "--save-dir", str(tmp_path / "run"), "--arch", "transformer_posenc", "--cpu", *STUDENT,
        "--criterion", "relation_distillation", "--teacher-path", setup["teacher"], "--relation-heads", "32",
        "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "1000", "--max-update", "1",
        "--no-progress-bar", "--num-workers", "0"], capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1
    assert lines[-1] == ("fairseq-train: error: --relation-heads 32 must divide both attention widths, the teacher's "
                         "(32) and the student's (16); choose one of 1, 2, 4, 8, 16")
    assert not any("Traceback" in line for line in lines)
    assert "examples from:" not in proc.stderr  # no data set was read
    assert not (tmp_path / "run").exists() or os.listdir(tmp_path / "run") == []


def _untrained_teacher(setup, path, arch):
    """A checkpoint of ``arch``'s width and heads (one layer per stack, small FFN: only the widths
    matter here) in the format fairseq-train saves, sharing the toy data's dictionaries."""
    state = torch.load(setup["teacher"], map_location="cpu")
    args = from_flags.model_args(arch, ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-ffn-embed-dim",
                                        "32", "--decoder-ffn-embed-dim", "32", "--position-encoding", "t5"])
    state["cfg"]["model"] = args
    state["model"] = ARCH_MODEL_REGISTRY[arch].build_model(args, setup["task"]).state_dict()
    torch.save(state, path)
    return args


def test_default_relation_heads_divide_base_and_big_widths(setup, tmp_path):
    default = inspect.signature(RelationDistillationCriterion).parameters["relation_heads"].default
    assert RelationDistillationConfig().relation_heads == default == 64
    big = _untrained_teacher(setup, tmp_path / "big.pt", "transformer_posenc_wmt_en_de_big")
    base = _untrained_teacher(setup, tmp_path / "base.pt", "transformer_posenc_wmt_en_de")
    assert student_widths(big) == {"enc": 1024, "dec": 1024} and student_widths(base) == {"enc": 512, "dec": 512}
    # a big teacher distilled into a base student, with the default relation heads
    crit = RelationDistillationCriterion(setup["task"], False, 0.1, teacher_path=str(tmp_path / "big.pt"))
    assert crit.heads == 64
    crit.check_widths(student_widths(base), "student")
    torch.manual_seed(0)
    model = ARCH_MODEL_REGISTRY["transformer_posenc"].build_model(base, setup["task"])
    losses = relation_losses(crit, model, setup["sample"])
    assert sorted(losses) == ["rel_dec_kk", "rel_dec_qq", "rel_dec_vv", "rel_enc_kk", "rel_enc_qq", "rel_enc_vv"]
    assert all(0 < v < float("inf") for v in losses.values())
    # and a value that divides neither stops when the criterion is built
    with pytest.raises(PosencError, match="--relation-heads 48 does not divide the attention width 1024 of the "
                                          "teacher's encoder; choose a divisor of 1024"):
        RelationDistillationCriterion(setup["task"], False, 0.1, teacher_path=str(tmp_path / "big.pt"),
                                      relation_heads=48)


def test_a_teacher_with_another_dictionary_is_refused(setup, tmp_path):
    state = torch.load(setup["teacher"], map_location="cpu")
    for side in ("encoder", "decoder"):
        key = f"{side}.embed_tokens.weight"
        state["model"][key] = torch.cat([state["model"][key], state["model"][key][:1]])
    torch.save(state, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="has a encoder vocabulary of .* entries, the data's dictionary has"):
        RelationDistillationCriterion(setup["task"], False, 0.1, teacher_path=str(tmp_path / "other.pt"))


def test_fairseq_train_with_relation_distillation_lowers_the_relation_loss(setup):
    save_dir = str(setup["root"] / "student")
    log = pipeline.train(setup["bin"], save_dir, [
        "--arch", "transformer_posenc", "--position-encoding", "rope", "--cpu", *STUDENT, "--share-all-embeddings",
        "--criterion", "relation_distillation", "--teacher-path", setup["teacher"], "--relation-heads", "4",
        "--relation-weight", "5", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--lr", "3e-3", "--max-tokens", "1000", "--max-update", "60",
        "--no-epoch-checkpoints", "--no-progress-bar", "--log-format", "simple", "--log-interval", "10",
        "--seed", "1", "--num-workers", "0"])
    inner = [line for line in log.splitlines() if "| train_inner |" in line]
    values = [float(re.search(r"rel_enc_qq=([0-9.]+)", line).group(1)) for line in inner]
    assert len(values) == 6, log[-2000:]  # every 10 of 60 updates
    print("rel_enc_qq over training:", values)
    # measured 0.286 over updates 1-10 (the student barely trained), 0.141 over updates 51-60:
    # a ratio of 0.49; a student that did not learn the relations stays near 1
    assert values[-1] < 0.8 * values[0]
    assert all(re.search(r"ce_loss=[0-9.]+,", line) for line in inner)
