"""MiniLMv2 self-attention relation distillation (Wang et al., 2020) for translation models.

Label-smoothed cross-entropy plus, for each chosen relation (Q-Q, K-K, V-V) of the encoder's and
the decoder's self-attention, KL(teacher || student) between relation distributions: the heads'
vectors are concatenated and re-split into ``--relation-heads`` heads of size d_r, and
relation = softmax(A A^T / sqrt(d_r)) with padding (and, in the decoder, the future) masked.
Teacher and student may differ in depth, width, head count and position encoding; they share
the dictionaries and the number of relation heads.

The vectors are the layers' query/key/value projections of the self-attention input, before any
position term (RoPE rotation, FLOATER bias), so that models with different encodings compare.
"""
import argparse
import dataclasses
import inspect
import math
import os
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq import metrics, utils
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from torch import Tensor

from ..compat import PosencError
from ..positions import values
from ..positions.values import Values

RELATIONS = {"qq": "q_proj", "kk": "k_proj", "vv": "v_proj"}
SITES = {"enc": "encoder", "dec": "decoder"}


def relation_log_probs(x: Tensor, heads: int, key_padding_mask: Tensor, causal: bool) -> Tensor:
    """log softmax(A A^T / sqrt(d_r)) per relation head: x (B, T, C) -> (B, heads, T, T).

    ``key_padding_mask`` (B, T) is True at padding; masked keys get probability 0.
    """
    bsz, length, width = x.shape
    if width % heads:
        raise ValueError(f"--relation-heads {heads} does not divide the attention width {width}; "
                         f"choose a divisor of {width}")
    # (B, T, C) -> (B, R, T, d_r)
    a = x.float().view(bsz, length, heads, width // heads).transpose(1, 2)
    logits = torch.matmul(a, a.transpose(-1, -2)) / math.sqrt(width // heads)
    blocked = key_padding_mask[:, None, None, :]
    if causal:
        blocked = blocked | torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
    # a finite fill: masked entries get exactly 0 probability and never produce NaN
    return F.log_softmax(logits.masked_fill(blocked, -1e9), dim=-1)


def relation_kl(teacher: Tensor, student: Tensor, heads: int, padding_mask: Tensor,
                causal: bool) -> Tuple[Tensor, Tensor]:
    """Sum over real query positions of the mean over relation heads of KL(teacher || student),
    and the number of real query positions. ``teacher`` (B, T, C_t), ``student`` (B, T, C_s)."""
    log_t = relation_log_probs(teacher, heads, padding_mask, causal)
    log_s = relation_log_probs(student, heads, padding_mask, causal)
    kl = (log_t.exp() * (log_t - log_s)).sum(-1).mean(1)  # (B, T)
    real = ~padding_mask
    return kl.masked_select(real).sum(), real.sum()


def _check_layer(who: str, site: str, index: int, count: int):
    reason = values.layer_refusal(_FIELD[f"{who}_{SITES[site]}_layer"], index, count)
    if reason:
        raise PosencError(reason)


class SelfAttentionInputs:
    """Records the input of one self-attention layer per site, and projects it on demand."""

    def __init__(self, model, layers: Dict[str, int], who: str):
        self.inputs: Dict[str, Tensor] = {}
        self.attention = {}
        for site, index in layers.items():
            stack = getattr(model, SITES[site])
            _check_layer(who, site, index, len(stack.layers))
            attention = stack.layers[index].self_attn
            attention.register_forward_pre_hook(self._recorder(site), with_kwargs=True)
            self.attention[site] = attention

    def _recorder(self, site):
        def record(module, args, kwargs):
            x = kwargs["query"] if "query" in kwargs else args[0]
            self.inputs[site] = x.transpose(0, 1)  # (T, B, C) -> (B, T, C)

        return record

    def widths(self) -> Dict[str, int]:
        return {site: attention.q_proj.out_features for site, attention in self.attention.items()}

    def project(self, site: str, relation: str) -> Tensor:
        projection = getattr(self.attention[site], RELATIONS[relation])
        return F.linear(self.inputs[site], projection.weight, projection.bias)


def _layer(who: str, side: str):
    return field(default=-1, metadata={"help": f"{who} {side} layer (default: last)",
                                       "values": Values(layer=f"{who}'s {side}")})


@dataclass
class RelationDistillationConfig(LabelSmoothedCrossEntropyCriterionConfig):
    teacher_path: Optional[str] = field(
        default=None, metadata={"help": "checkpoint of the teacher (any plugin architecture, same dictionaries)",
                                "values": Values(file=True)}
    )
    relation_heads: int = field(
        default=64,
        metadata={"help": "relation heads A_r, shared by teacher and student; must divide both attention widths "
                          "(64 divides every power-of-two width from 64 up; MiniLMv2 used 48 at BERT's 768)",
                  "values": Values(low=1)},
    )
    relations: str = field(default="qq,kk,vv", metadata={"help": "comma-separated relations among qq, kk, vv",
                                                         "values": Values(choices=tuple(RELATIONS), subset=True)})
    # 0 would train plain label-smoothed cross-entropy with a teacher run for nothing: a flag that
    # changes nothing is refused
    relation_weight: float = field(default=1.0, metadata={
        "help": "weight of the relation loss",
        "values": Values(low=0, above=True, why="at 0 use --criterion label_smoothed_cross_entropy")})
    no_encoder_relations: bool = field(default=False, metadata={"help": "do not distil encoder self-attention"})
    no_decoder_relations: bool = field(default=False, metadata={"help": "do not distil decoder self-attention"})
    teacher_encoder_layer: int = _layer("teacher", "encoder")
    teacher_decoder_layer: int = _layer("teacher", "decoder")
    student_encoder_layer: int = _layer("student", "encoder")
    student_decoder_layer: int = _layer("student", "decoder")


#: the options the criterion adds to fairseq's label-smoothed cross-entropy
OPTIONS = [f for f in dataclasses.fields(RelationDistillationConfig)
           if f.name not in {g.name for g in dataclasses.fields(LabelSmoothedCrossEntropyCriterionConfig)}]
_FIELD = {f.name: f for f in OPTIONS}


def check_options(args):
    """One line (:class:`PosencError`) for the first option of the criterion in ``args`` whose value
    it does not take, or for both sites switched off; what needs the models is checked where they
    are known (:class:`RelationDistillationCriterion`)."""
    values.check(OPTIONS, args)
    if getattr(args, "no_encoder_relations", False) and getattr(args, "no_decoder_relations", False):
        raise PosencError("--no-encoder-relations and --no-decoder-relations leave nothing to distil")


@register_criterion("relation_distillation", dataclass=RelationDistillationConfig)
class RelationDistillationCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 teacher_path=None, relation_heads=64, relations="qq,kk,vv", relation_weight=1.0,
                 no_encoder_relations=False, no_decoder_relations=False, teacher_encoder_layer=-1,
                 teacher_decoder_layer=-1, student_encoder_layer=-1, student_decoder_layer=-1, student=None):
        """``student``: the student's model config where it is known before the model (fairseq-train
        builds the criterion from it, :meth:`build_criterion`): its layers and widths are checked
        here, with the teacher's, before any training step."""
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        given = {name: value for name, value in locals().items() if name in _FIELD}
        check_options(argparse.Namespace(**given))
        self.relations = [r.strip() for r in relations.split(",")]
        self.sites = [s for s, off in (("enc", no_encoder_relations), ("dec", no_decoder_relations)) if not off]
        self.heads, self.weight = relation_heads, relation_weight
        self.teacher_layers = {"enc": teacher_encoder_layer, "dec": teacher_decoder_layer}
        self.student_layers = {"enc": student_encoder_layer, "dec": student_decoder_layer}
        if student is not None:  # before the teacher is loaded
            for site in self.sites:
                _check_layer("student", site, self.student_layers[site], getattr(student, f"{SITES[site]}_layers"))
        teacher = load_teacher(teacher_path, task)
        # A plain tuple: the teacher is neither trained, nor saved with the criterion, nor put
        # in training mode by criterion.train().
        self._teacher = (teacher, SelfAttentionInputs(teacher, {s: self.teacher_layers[s] for s in self.sites},
                                                      "teacher"))
        if student is None:
            self.check_widths(self._teacher[1].widths(), "teacher")
        else:
            self.check_both_widths(self._teacher[1].widths(), student_widths(student))
        self._student = None

    @classmethod
    def add_args(cls, parser):
        """fairseq's, and the options' values checked once parsed, before any data is read."""
        super().add_args(parser)
        values.check_when_parsed(parser, OPTIONS, check_options)

    @classmethod
    def build_criterion(cls, cfg, task):
        """As fairseq builds every criterion, with the student's config (fairseq-train builds the
        model first): a bad --relation-heads or student layer stops at start-up, not at the first
        training step."""
        taken = {name: getattr(cfg, name) for name in inspect.signature(cls).parameters
                 if name not in ("task", "student") and hasattr(cfg, name)}
        return cls(task, **taken, student=_model_config(cfg))

    def check_widths(self, widths: Dict[str, int], who: str):
        """``widths``: the attention width (heads x head size) of each site."""
        for site in self.sites:
            if widths[site] % self.heads:
                raise PosencError(
                    f"--relation-heads {self.heads} does not divide the attention width {widths[site]} of the "
                    f"{who}'s {SITES[site]}; choose a divisor of {widths[site]}"
                )

    def check_both_widths(self, teacher: Dict[str, int], student: Dict[str, int]):
        """One line naming the teacher's and the student's widths where ``--relation-heads`` does not
        divide one of them."""
        if all(widths[site] % self.heads == 0 for widths in (teacher, student) for site in self.sites):
            return
        common = math.gcd(*(widths[site] for widths in (teacher, student) for site in self.sites))
        divisors = [d for d in range(1, common + 1) if common % d == 0]

        def named(widths):
            return " and ".join(str(w) for w in sorted({widths[site] for site in self.sites}))

        raise PosencError(
            f"--relation-heads {self.heads} must divide both attention widths, the teacher's ({named(teacher)}) and "
            f"the student's ({named(student)}); choose one of {', '.join(map(str, divisors))}")

    def forward(self, model, sample, reduce=True):
        student_inputs = self._hook_student(model)
        net_output = model(**sample["net_input"])
        loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {"loss": loss.data, "nll_loss": nll_loss.data, "ce_loss": loss.data,
                          "ntokens": sample["ntokens"], "nsentences": sample["target"].size(0),
                          "sample_size": sample_size}

        teacher, teacher_inputs = self._teacher
        param = next(model.parameters())
        teacher.to(device=param.device, dtype=param.dtype)
        with torch.no_grad():
            teacher(**sample["net_input"])
        masks = {"enc": sample["net_input"]["src_tokens"].eq(self.padding_idx),
                 "dec": sample["net_input"]["prev_output_tokens"].eq(self.padding_idx)}
        for site in self.sites:
            for relation in self.relations:
                with torch.no_grad():
                    target = teacher_inputs.project(site, relation)
                kl_sum, rows = relation_kl(target, student_inputs.project(site, relation), self.heads,
                                           masks[site], causal=site == "dec")
                loss = loss + self.weight * kl_sum / rows.clamp(min=1) * sample_size
                logging_output[f"rel_{site}_{relation}"] = kl_sum.data
                logging_output[f"rel_{site}_rows"] = rows.data
        logging_output["loss"] = loss.data
        return loss, sample_size, logging_output

    def _hook_student(self, model) -> SelfAttentionInputs:
        if self._student is None or self._student[0] is not model:
            inputs = SelfAttentionInputs(model, {s: self.student_layers[s] for s in self.sites}, "student")
            self.check_widths(inputs.widths(), "student")  # a model given in Python, not built by fairseq-train
            self._student = (model, inputs)
        return self._student[1]

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        ce = sum(log.get("ce_loss", 0) for log in logging_outputs)
        metrics.log_scalar("ce_loss", ce / max(sample_size, 1) / math.log(2), sample_size, round=3)
        keys = {k for log in logging_outputs for k in log if k.startswith("rel_") and not k.endswith("_rows")}
        for key in sorted(keys):
            site = key.split("_")[1]
            rows = sum(utils.item(log.get(f"rel_{site}_rows", 0)) for log in logging_outputs)
            total = sum(utils.item(log.get(key, 0)) for log in logging_outputs)
            metrics.log_scalar(key, total / max(rows, 1), rows, round=4)


def student_widths(args) -> Dict[str, int]:
    """Attention width of each site from a model config: heads x --attention-head-dim, or the
    embedding width when no head size is set (as the attention layers build their projections)."""
    head_dim = getattr(args, "attention_head_dim", None)
    widths = {}
    for site, side in SITES.items():
        heads, embed = getattr(args, f"{side}_attention_heads"), getattr(args, f"{side}_embed_dim")
        widths[site] = heads * head_dim if head_dim else embed
    return widths


def _model_config(cfg):
    """The model's config next to the criterion's in fairseq's composed config, or None when the
    criterion was given a config of its own (built in Python)."""
    from omegaconf import DictConfig

    if not isinstance(cfg, DictConfig):
        return None
    model = cfg._get_root().get("model")
    needed = ("encoder_embed_dim", "decoder_embed_dim", "encoder_attention_heads", "decoder_attention_heads",
              "encoder_layers", "decoder_layers")
    return model if model is not None and all(getattr(model, k, None) for k in needed) else None


def load_teacher(path: Optional[str], task):
    """The teacher, frozen, in eval mode; a clear error if it cannot be this data's teacher."""
    from fairseq import checkpoint_utils

    if not path:
        raise PosencError("--criterion relation_distillation needs --teacher-path: the teacher's checkpoint")
    if not os.path.isfile(path):
        raise PosencError(f"--teacher-path: no checkpoint at {path}")
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    for side, dictionary in (("encoder", task.source_dictionary), ("decoder", task.target_dictionary)):
        rows = state["model"][f"{side}.embed_tokens.weight"].shape[0]
        if rows != len(dictionary):
            raise PosencError(f"the teacher {path} has a {side} vocabulary of {rows} entries, the data's "
                             f"dictionary has {len(dictionary)}: teacher and student must share dictionaries")
    _check_same_symbols(path, state, task)
    models, _ = checkpoint_utils.load_model_ensemble([path], task=task, state=state)
    teacher = models[0].eval()
    teacher.requires_grad_(False)
    return teacher


def _check_same_symbols(path, state, task):
    """Where the teacher's training dictionaries are still on disk, their symbols must be the
    data's, in the same order (same sizes are not enough)."""
    from fairseq.data import Dictionary

    cfg = state.get("cfg") or {}
    data = (cfg.get("task") or {}).get("data")
    for lang, dictionary in ((task.cfg.source_lang, task.source_dictionary),
                             (task.cfg.target_lang, task.target_dictionary)):
        own = os.path.join(str(data).split(os.pathsep)[0], f"dict.{lang}.txt") if data and lang else None
        if own and os.path.isfile(own) and Dictionary.load(own).symbols != dictionary.symbols:
            raise PosencError(f"the teacher {path} was trained with a different {lang} dictionary ({own}): "
                             "teacher and student must share dictionaries")
