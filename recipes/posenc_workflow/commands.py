"""The commands of a study's jobs: fairseq-train's complete argument list of each model (what the
train rule's params hold, so that Snakemake retrains a model whose command changed and its dry run
says how), with the checkpoint a warm start reads left as ``{start}`` (the start's checkpoint
directory, known when its job has run); the configuration fairseq resolves it to (two rows of one
configuration are refused); fairseq-generate's of a test set. ``study``: a Configuration
(configuration.py)."""
import dataclasses
import json
from typing import List, Optional

from posenc_workflow import paths, train_config
from posenc_workflow.base import USER_DIR, VANILLA, WARM_STARTED, ConfigError
from posenc_workflow.choices import ARCHS, PRECISION_FLAGS, SHARE_FLAGS
from posenc_workflow.flags import split
from posenc_workflow.plan import batch_for
from posenc_workflow.rows import Model


def train_command(study, model: Model) -> List[str]:
    """fairseq-train's argument list for ``model`` (without --save-dir, which the training job
    adds: a directory named by the hash of the resolved configuration)."""
    if study.train["recipe"] == "toy":
        return _toy_command(study, model)
    return _scaling_nmt_command(study, model)


def _common_end(study, model: Model, encoding_flags: List[str]) -> List[str]:
    flags = [str(f) for f in study.train.get("flags", [])]
    return [*encoding_flags, *flags, "--seed", str(model.seed)]


def _start_flags(model: Model, encoding: str) -> List[str]:
    if model.kind == "warm" and encoding in WARM_STARTED:
        return ["--floater-init-from", "{start}/checkpoint_best.pt"]
    if model.kind == "control":
        return ["--finetune-from-model", "{start}/checkpoint_best.pt"]
    return []


def _split_flags(study, model: Model):
    """(flags of the model, flags that stay with the warm-started stage): a vanilla start and the
    control take the study's flags without the warm-started encoding's own (flags.split)."""
    shared = study.model_flags(model.encoding)
    if model.kind in ("vanilla", "control"):
        warm = next((r for r in study.rows if r.encoding in WARM_STARTED), None)
        if warm is not None:
            shared = split(warm.encoding, study.model_flags(warm.encoding))[0]
        return shared
    return shared + model.flags


def _toy_command(study, model: Model) -> List[str]:
    """The demo's flags (pipeline.toy_train_flags) with the study's settings: each ``auto`` the
    toy recipe's value (choices.RECIPE_AUTO), a setting of fairseq's default passed only when
    it differs, so that the demo's commands stay what they were."""
    # pipeline imports the plugin (torch, fairseq: seconds): only the toy recipe's commands need it
    from posenc_workflow.pipeline import toy_train_flags

    t = study.train
    max_update, max_epoch = study.budget(model)
    keep = 5 if model.kind == "vanilla" else max(5, study.average(model))
    flags = toy_train_flags(model.encoding, max_update or 0, model.seed, keep_last_epochs=keep, size=study.arch,
                            lr=study.lr(model), max_tokens=int(study.recipe_default("max_tokens")),
                            device=device_flags(study), dropout=study.recipe_default("dropout"),
                            warmup_updates=int(study.recipe_default("warmup_updates")),
                            share=SHARE_FLAGS[t["share_embeddings"]])
    flags = _without(flags, "--seed")  # _common_end gives it
    interval = ["--save-interval-updates", str(study.arch_default("save_interval_updates"))] \
        if study.evaluate["checkpoints"] == "update" or t.get("save_interval_updates", "auto") != "auto" else []
    if study.evaluate["checkpoints"] == "update":
        # interval checkpoints to average: the scaling_nmt recipe's, every save_interval_updates
        flags = _without(flags, "--keep-last-epochs") + _keep_flags(study, model) + interval
    elif interval:  # besides the epoch checkpoints averaged, the last interval one (to resume from)
        flags += interval + ["--keep-interval-updates", "1"]
    flags += _optimizer_flags(study)
    if t["weight_decay"]:
        flags += ["--weight-decay", str(t["weight_decay"])]
    if study.recipe_default("update_freq") is not None:
        flags += ["--update-freq", str(study.recipe_default("update_freq"))]
    flags += _eval_bleu_flags(study)
    if max_epoch:
        flags += ["--max-epoch", str(max_epoch)]
    return [paths.data_bin(study), "--user-dir", USER_DIR, *flags, *_split_flags(study, model),
            *_start_flags(model, model.encoding), *_common_end(study, model, [])]


def _optimizer_flags(study) -> List[str]:
    """Adam's eps and the warmup's initial lr, where set (null: fairseq's defaults)."""
    flags = []
    if study.recipe_default("adam_eps") is not None:
        flags += ["--adam-eps", str(study.recipe_default("adam_eps"))]
    if study.recipe_default("warmup_init_lr") is not None:
        flags += ["--warmup-init-lr", str(study.recipe_default("warmup_init_lr"))]
    return flags


def _eval_bleu_flags(study) -> List[str]:
    """train.eval_bleu: checkpoint_best.pt by validation BLEU decoded in process (fairseq's
    IWSLT example), with the test decode's beam and length limit."""
    if not study.train.get("eval_bleu"):
        return []
    remove = ["--eval-bleu-remove-bpe"] + (["sentencepiece"] if study.config["corpus"]["bpe"] == "sentencepiece" else [])
    flags = ["--eval-bleu", "--eval-bleu-args", json.dumps({"beam": int(study.evaluate["beam"]), "max_len_a": 1.5,
                                                            "max_len_b": 50}),
             "--eval-bleu-detok", "moses", *remove, "--best-checkpoint-metric", "bleu",
             "--maximize-best-checkpoint-metric"]
    if study.tgt != "en":
        flags += ["--eval-bleu-detok-args", json.dumps({"target_lang": study.tgt})]
    return flags


def _keep_flags(study, model: Model) -> List[str]:
    """The checkpoints a run keeps: the last ``average`` of the kind evaluate.checkpoints
    averages (a vanilla stage: its checkpoint_best.pt is what is used), one interval checkpoint
    besides epoch checkpoints (checkpoint_last.pt resumes anyway)."""
    keep = str(1 if model.kind == "vanilla" else study.average(model))
    if study.evaluate["checkpoints"] == "epoch":
        return ["--keep-last-epochs", keep, "--keep-interval-updates", "1"]
    return ["--no-epoch-checkpoints", "--keep-interval-updates", keep]


def _scaling_nmt_command(study, model: Model) -> List[str]:
    """The Scaling NMT flags (Ott et al., 2018) with the papers' base/big settings; IWSLT's
    config gives fairseq's example's (decoder-only sharing, weight decay, Adam's own eps)."""
    t = study.train
    arch = study.model_arch(model)
    max_update, max_epoch = study.budget(model)
    max_tokens, update_freq = batch(study)
    argv = [paths.data_bin(study), "--user-dir", USER_DIR, *SHARE_FLAGS[t["share_embeddings"]], "--optimizer", "adam",
            "--adam-betas", "(0.9, 0.98)"]
    eps = study.recipe_default("adam_eps")
    argv += ["--adam-eps", str(eps)] if eps is not None else []
    argv += ["--clip-norm", "0.0", "--lr-scheduler", "inverse_sqrt",
             "--warmup-updates", str(study.recipe_default("warmup_updates"))]
    init = study.recipe_default("warmup_init_lr")
    argv += ["--warmup-init-lr", str(init)] if init is not None else []
    criterion = "relation_distillation" if model.kind == "distilled" else "label_smoothed_cross_entropy"
    argv += ["--criterion", criterion, "--label-smoothing", "0.1", "--weight-decay", str(t["weight_decay"]),
             "--dropout", str(study.arch_default("dropout", arch, "distillation" if model.kind == "distilled" else "train")),
             "--max-tokens", str(max_tokens), "--update-freq", str(update_freq),
             "--save-interval-updates", str(study.arch_default("save_interval_updates", arch)),
             *_keep_flags(study, model), "--no-progress-bar", "--log-interval", "100", "--log-format", "simple"]
    argv += _eval_bleu_flags(study)
    argv += [*arch_flags(study, model.encoding, arch), "--lr", repr(study.lr(model))]
    argv += ["--max-update", str(max_update)] if max_update else []
    argv += ["--max-epoch", str(max_epoch)] if max_epoch else []
    if model.kind == "distilled":
        d = study.config["distillation"]
        argv += [*[str(f) for f in d.get("student_flags", [])], "--teacher-path", "{teacher}",
                 "--relation-heads", str(d["relation_heads"]), "--relations", d["relations"],
                 "--relation-weight", str(d["relation_weight"])]
    argv += _split_flags(study, model) + _start_flags(model, model.encoding)
    argv += device_flags(study)
    return argv + _common_end(study, model, [])


def arch_flags(study, encoding: str, arch: Optional[str] = None) -> List[str]:
    arch = arch or study.arch
    if arch in ARCHS:
        return ["--arch", f"transformer_{encoding}_{ARCHS[arch].suffix}"]
    from fairseq_posenc.models.from_flags import size_flags  # the plugin: torch, fairseq (seconds)

    return ["--arch", "transformer_posenc", "--position-encoding", encoding, *size_flags(arch)]


def batch(study):
    """(max_tokens, update_freq) of every model: auto keeps ``train.batch_target`` padded tokens
    an update at any GPU count (recipes/posenc_workflow/plan.py)."""
    target = study.train["batch_target"] * (16 if study.train.get("large_batch") else 1)
    max_tokens = None if study.train["max_tokens"] == "auto" else int(study.train["max_tokens"])
    update_freq = None if study.train["update_freq"] == "auto" else int(study.train["update_freq"])
    max_tokens, update_freq, _ = batch_for(max_tokens, study.world(), update_freq, target=target)
    return max_tokens, update_freq


def device_flags(study) -> List[str]:
    if study.train["device"] == "cpu":
        return ["--cpu"]
    flags = PRECISION_FLAGS[study.train["precision"]] + ["--distributed-world-size", str(study.world())]
    if int(study.train["nodes"]) > 1 and study.train["distributed_port"] is not None:
        # one task a node (srun inside the job): fairseq-train infers SLURM's world from it and
        # spawns a process per GPU; the port is where rank 0 listens on the first node (none
        # given: train_job.py derives one from the SLURM job id)
        flags += ["--distributed-port", str(study.train["distributed_port"])]
    return flags


def resolve(study, model: Model):
    """(fairseq's resolved configuration of the model's command, its identity), cached on disk under
    train_config.config_cache()."""
    try:
        config = train_config.resolve(train_command(study, model), cache=train_config.config_cache())
    except ValueError as error:
        raise ConfigError(f"{model.key}: {error}") from None
    # FLOATER's vanilla stage with a budget of its own (warm_start.vanilla) is another model
    # than a sinusoidal row of the same configuration: its own directory (with the rows'
    # budget it is that row's model, trained once: recipes/rules/train.smk's _same_as)
    stage = None
    if model.kind == "vanilla" and study.budget(model) != study.budget(dataclasses.replace(model, kind="scratch")):
        stage = {"stage": VANILLA}
    return config, train_config.identity(config, stage)


def check_same_rows(study, resolved):
    """Two rows are one model where fairseq resolves their commands to one configuration
    (train_config.identity) from one start: refused, the report would show one model twice.
    Rows that differ in any other flag (``--encoder-layers``, ``--dropout``) are two models.
    Called where the rows are trained (recipes/rules/train.smk, scripts/demo.py): it resolves
    each row's command, seconds a study. ``resolved``: model -> :func:`resolve`'s pair (cached)."""
    seen = {}
    for row in study.rows:
        model = study.model(row.slug, study.seeds[0])
        key = (resolved(model)[1], model.start, model.teacher, model.encoding)
        if key in seen:
            raise ConfigError(f"models.encodings {seen[key].spec} and {row.spec} are the same model, "
                              f"{row.label!r}: fairseq resolves them to one configuration")
        seen[key] = row


def _without(flags: List[str], option: str) -> List[str]:
    """``flags`` less ``option`` and its value."""
    i = flags.index(option)
    return flags[:i] + flags[i + 2:]


def generate_command(study, averaged: str, test=None) -> List[str]:
    """fairseq-generate of the test set with the averaged checkpoint: beam search with fairseq's
    |Y|^lenpen, or (lenpen_form gnmt) every finished hypothesis with its raw score for rerank.py to
    pick by GNMT's ((5+|Y|)/6)^lenpen. Outputs are capped at 1.5 x source + 50 tokens: never below
    Vaswani et al.'s source + 50, and it lets a model that runs on past the training lengths show it.
    ``test``: the test set (corpus.TestSet) decoded, by default the study's first."""
    e = study.evaluate
    test = test or study.test_sets()[0]
    cmd = ["fairseq-generate", paths.test_data_bin(study, test), "--user-dir", USER_DIR, "--path", averaged, "--gen-subset",
           test.subset, "--beam", str(e["beam"])]
    if e["lenpen_form"] == "gnmt":
        cmd += ["--nbest", str(e["beam"]), "--unnormalized"]
    else:
        cmd += ["--lenpen", str(e["lenpen"])]
    cmd += ["--max-len-a", "1.5", "--max-len-b", "50"]
    cmd += ["--batch-size", "64"] if study.train["recipe"] == "toy" else ["--max-tokens", str(e["max_tokens"])]
    if study.config["corpus"]["name"] != "toy" and (not study.split or study.split["unit"] == "words"):
        cmd += ["--remove-bpe=sentencepiece" if study.config["corpus"]["bpe"] == "sentencepiece" else "--remove-bpe"]
    if study.train["device"] == "cpu":
        cmd += ["--cpu"]
    else:  # fairseq-generate decodes on one GPU; --amp is a training option: it decodes in fp32
        cmd += {"fp16": ["--fp16"], "memory-efficient-fp16": ["--fp16"], "bf16": ["--bf16"]}.get(
            study.train["precision"], [])
    return cmd
