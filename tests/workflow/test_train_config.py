"""The checkpoint directory of a training job is named by the hash of its resolved fairseq
configuration (recipes/posenc_workflow/train_config.py): every field but those LEFT_OUT, each with
its reason. The argument lists are the workflow's own (recipes/Snakefile's commands for a WMT base
and an IWSLT model); then every option of fairseq's training parser is changed in turn, in
process, and the hash must change (hashed) or stay (left out, or DECIDED by the encoding). The
classification must equal the parser's options, so an option that fairseq or the plugin adds
later fails here until it is weighed."""
import argparse
import os

import pytest

from posenc_workflow import pipeline
from posenc_workflow import train_config, workflow

REPO = os.path.dirname(pipeline.USER_DIR)

# architecture: the study whose command is walked (the workflow's schema defaults filled by Study)
RUNS = {
    "wmt": {"models": {"arch": "base"}, "train": {}},
    "iwslt": {"models": {"arch": "iwslt"}, "train": {"share_embeddings": "decoder", "weight_decay": 0.0001,
                                                     "adam_eps": None, "warmup_init_lr": None, "precision": "fp32",
                                                     "batch_target": 4096}},
}
# registry choices: another component, with the options the old one took removed
REGISTRY = {
    "optimizer": (["--optimizer", "nag"], ["--adam-betas", "--adam-eps"]),
    "criterion": (["--criterion", "cross_entropy"], ["--label-smoothing"]),
    "lr_scheduler": (["--lr-scheduler", "fixed"], ["--warmup-init-lr"]),
    "task": (["--task", "translation_lev"], []),
    "tokenizer": (["--tokenizer", "space"], []),
    "bpe": (["--bpe", "subword_nmt"], []),
    "scoring": (["--scoring", "sacrebleu"], []),
}
# values a type cannot give: None defaults, strings, lists, tuples, floats at 0
VALUES = {
    "log_format": "json", "log_file": "{tmp}/log.txt", "aim_repo": "{tmp}/aim", "aim_run_hash": "abc",
    "tensorboard_logdir": "{tmp}/tb", "wandb_project": "p", "fp16_scale_window": "64",
    "fp16_scale_tolerance": "0.25", "threshold_loss_scale": "1.0", "amp_scale_window": "64",
    "user_dir": "{user_dir}/.", "quantization_config_path": "{tmp}/q.yaml", "plasma_path": "{tmp}/plasma",
    "batch_size": "16", "dataset_impl": "mmap", "train_subset": "valid", "valid_subset": "train",
    "fixed_validation_seed": "7", "max_valid_steps": "3", "gen_subset": "valid", "batch_size_valid": "16",
    "distributed_backend": "gloo", "distributed_init_method": "tcp://127.0.0.1:29999", "slowmo_momentum": "0.5",
    "slowmo_base_algorithm": "sgp", "pipeline_balance": "[1]", "pipeline_devices": "[0]",
    "pipeline_encoder_balance": "[1]", "pipeline_encoder_devices": "[0]", "pipeline_decoder_balance": "[1]",
    "pipeline_decoder_devices": "[0]", "arch": "transformer_learned_{suffix}", "max_epoch": "100",
    "stop_time_hours": "1.5", "clip_norm": "0.1", "update_freq": "1", "lr": "0.005", "save_dir": "{tmp}/elsewhere",
    "restore_file": "checkpoint_best.pt", "continue_once": "{tmp}/c.pt", "finetune_from_model": "{tmp}/f.pt",
    "optimizer_overrides": '{"lr": 0.1}', "best_checkpoint_metric": "bleu", "checkpoint_suffix": "-x",
    "ema_seed_model": "{tmp}/e.pt", "attention_dropout": "0.1", "activation_dropout": "0.1",
    "encoder_embed_path": "{tmp}/emb.txt", "decoder_embed_path": "{tmp}/emb.txt", "encoder_layerdrop": "0.1",
    "decoder_layerdrop": "0.1", "encoder_layers_to_keep": "0,1", "decoder_layers_to_keep": "0,1",
    "encoder_xformers_att_config": '{"name": "scaled_dot_product"}',
    "decoder_xformers_att_config": '{"name": "scaled_dot_product"}',
    "adaptive_softmax_cutoff": "100,200", "adaptive_softmax_dropout": "0.1", "quant_noise_pq": "0.1",
    "quant_noise_scalar": "0.1", "relu_dropout": "0.1", "segment_separator": "<s2>", "position_blocks": "all",
    "position_sharing": "heads", "diet_rank": "4", "max_relative_distance": "8", "alibi_encoder": "crossed",
    "floater_solver": "euler", "floater_lr_scale": "2.0", "floater_dissipation": "1.0", "floater_step": "0.05", "floater_hidden": "16", "floater_init_from": "{tmp}/v.pt",
    "data": "{tmp}/copy-of-data", "source_lang": "de", "target_lang": "en", "eval_bleu_args": '{"beam": 2}',
    "eval_bleu_detok": "moses", "eval_bleu_detok_args": '{"target_lang": "de"}', "eval_bleu_remove_bpe": "@@ ",
    "adam_betas": "(0.9, 0.99)", "weight_decay": "0.01", "warmup_init_lr": "1e-6", "label_smoothing": "0.2",
    "adam_eps": "1e-6", "max_source_positions": "512", "max_target_positions": "512",
    "adaptive_softmax_factor": "2", "min_params_to_wrap": "1000", "base_layers": "1", "base_sublayers": "2",
    "base_shuffle": "0", "decoder_output_dim": "256", "attention_head_dim": "16", "max_tokens_valid": "1000",
    "update_epoch_batch_itr": "True", "distributed_world_size": "2",
}
# the batch layout changes together, tokens per update kept: (options, new values)
LAYOUT = {
    "max_tokens": {"max_tokens": "256", "update_freq": "1"},
    "update_freq": {"update_freq": "1", "max_tokens": "256"},
    "distributed_world_size": {"distributed_world_size": "2", "update_freq": "4"},  # the 8 GPUs of the argv: 8 x 1 = 2 x 4
}


def _command(arch):
    """The workflow's fairseq-train command for a sinusoidal model of ``arch`` (GPU, 8 GPUs: the
    distributed flags included)."""
    import yaml

    with open(os.path.join(REPO, "recipes", "conf", "schema.yaml")) as f:
        schema = yaml.safe_load(f)

    def defaults(node):
        return {key: (defaults(sub) if sub.get("type") == "object" and "properties" in sub else sub.get("default"))
                for key, sub in node["properties"].items() if "default" in sub or sub.get("type") == "object"}

    config = defaults(schema)
    config["corpus"] = {**config["corpus"], "name": "wmt14_en_de" if arch == "wmt" else "iwslt14_de_en",
                        "data": "/nodata"}
    config["models"] = {**config["models"], **RUNS[arch]["models"], "encodings": ["sinusoidal"]}
    # fp32: --fp16 would refuse --bf16 and the other precisions the walk sets
    config["train"] = {**config["train"], **RUNS[arch]["train"], "gpus_per_node": 8, "precision": "fp32"}
    config.pop("split"), config.pop("distillation")
    study = workflow.Study(config, preflight=False)
    return study.command(study.models[0])


WMT_ARGV = []  # the WMT run's argument list, once its fixture is built (the IWSLT walk compares with it)


@pytest.fixture(scope="module", params=list(RUNS))
def finished(request):
    """(arch, the argument list the workflow runs)."""
    argv = _command(request.param)
    if request.param == "wmt":
        WMT_ARGV[:] = [argv]
    return request.param, argv


def _option_strings(parser):
    return {a.dest: a for a in parser._actions if a.dest != "help"}


def _without(argv, option, takes_value=True):
    """argv without ``option`` (and its value)."""
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        if item == option:
            skip = takes_value
            continue
        out.append(item)
    return out


def _set(argv, action, value):
    flag = action.option_strings[0] if action.option_strings else None
    if flag is None:  # the positional data directory
        return [value] + argv[1:]
    return _without(argv, flag) + [flag, value]


def changed(argv, dest, action, args, fill):
    """argv with ``dest`` changed: by type where that works, else from VALUES / REGISTRY."""
    if dest in REGISTRY:
        new, dropped = REGISTRY[dest]
        for option in dropped:
            argv = _without(argv, option)
        return _without(argv, new[0]) + new
    # (the plugin's --no-token-positional-embeddings is a subclass: it also marks itself given)
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        flag = action.option_strings[0]
        return _without(argv, flag, False) if flag in argv else argv + [flag]
    current = getattr(args, dest, None)
    if dest in VALUES:
        value = VALUES[dest]
        for name, text in fill.items():
            value = value.replace("{" + name + "}", text)
        return _set(argv, action, value)
    if action.choices and not isinstance(action.choices, dict):
        return _set(argv, action, next(str(c) for c in action.choices if str(c) != str(current)))
    if isinstance(current, bool):
        return _set(argv, action, str(not current))
    if isinstance(current, int):
        return _set(argv, action, str(current + 1))
    if isinstance(current, float) and current:
        return _set(argv, action, str(current * 2))
    return None  # the caller names it: add a value to VALUES


LEFT_OUT = {train_config.option_of(entry) for entry in train_config.LEFT_OUT}


def test_the_classification_is_the_training_parsers_options(finished):
    _, argv = finished
    parser, _ = train_config.parse(argv)
    options = train_config.parser_options(parser)
    decided = set(train_config.DECIDED)
    classified = LEFT_OUT | train_config.KEYED | decided
    assert not LEFT_OUT & train_config.KEYED and not decided & (LEFT_OUT | train_config.KEYED)
    assert options - classified == set(), "options nobody weighed: add each to KEYED or LEFT_OUT with a reason"
    assert classified - options == set(), "classified names the parser no longer has"


def _reached(dest, config, recorded):
    return any(k.rpartition(".")[2] == dest and config.get(k) != recorded.get(k) for k in set(config) | set(recorded))


def _changes(argv, dests, parser, args, fill):
    """argv with every option of ``dests`` changed (see :func:`changed`), or None for one without a value."""
    actions = _option_strings(parser)
    for dest in dests:
        if dest in LAYOUT:
            for other, value in LAYOUT[dest].items():
                argv = _set(argv, actions[other], value)
            continue
        argv = changed(argv, dest, actions[dest], args, fill)
        if argv is None:
            return None
    return argv


#: keyed options changed together (a refusal names every field that differs, so one parse checks
#: them all; fairseq's hydra composition costs ~0.2 s a configuration): registry choices and the
#: batch layout go alone, they bring or take other options with them
CHUNK = 40


def test_every_option_is_hashed_or_left_out_as_classified(finished, tmp_path):
    arch, argv = finished
    fill = {"tmp": str(tmp_path), "user_dir": pipeline.USER_DIR,
            "suffix": next(a for a in argv if a.startswith("transformer_")).split("_", 2)[2]}
    parser, args = train_config.parse(argv)
    recorded = train_config.resolve(argv)
    options = sorted(train_config.parser_options(parser))
    if arch != "wmt":
        # the same parser (test_the_classification_...): walked whole for WMT, here the options whose
        # value the IWSLT architecture or recipe sets otherwise, and the registry choices
        wmt = train_config.parse(WMT_ARGV[0])[1] if WMT_ARGV else None
        options = [d for d in options if d in REGISTRY or d in LAYOUT or wmt is None
                   or getattr(wmt, d, None) != getattr(args, d, None)]
    keyed = [d for d in options if d in train_config.KEYED]
    alone = [d for d in keyed if d in REGISTRY]
    together = [d for d in keyed if d not in REGISTRY]
    groups = [[d] for d in alone] + [together[i:i + CHUNK] for i in range(0, len(together), CHUNK)]
    wrong = []
    while groups:
        dests = groups.pop(0)
        new = _changes(argv, dests, parser, args, fill)
        if new is None:
            if len(dests) > 1:
                groups[:0] = [[d] for d in dests]
            else:
                wrong.append(f"--{dests[0]}: no changed value for its default: add one to VALUES")
            continue
        try:
            config = train_config.resolve(new)
        except ValueError as error:
            if len(dests) > 1:  # one of them is refused by the parser: see which, alone
                groups[:0] = [[d] for d in dests]
            elif "fairseq-train would refuse" not in str(error):
                wrong.append(f"--{dests[0]}: {error}")
            continue  # alone and refused by fairseq's (or the plugin's) parser: no run to reuse
        named = [line.split(":")[0] for line in train_config.differences(recorded, config)]
        for dest in dests:
            if not _reached(dest, config, recorded):
                wrong.append(f"--{dest}: the changed value did not reach the configuration")
            elif dest not in named:
                wrong.append(f"--{dest} is classified as hashed but the hash does not hold it")
        if train_config.identity(config) == train_config.identity(recorded):
            wrong.append(f"{dests}: changed, the same hash")
    # fairseq's input position options, each given to the encoding that takes it (the others refuse
    # it): the encoding sets it anyway, one model
    takers = {"no_token_positional_embeddings": "none", "encoder_learned_pos": "learned",
              "decoder_learned_pos": "learned"}
    assert set(takers) == set(train_config.DECIDED)
    actions = _option_strings(parser)
    for dest, encoding in takers.items():
        plain = _set(argv, actions["arch"], f"transformer_{encoding}_{fill['suffix']}")
        if train_config.identity(train_config.resolve(changed(plain, dest, actions[dest], args, fill))) != \
                train_config.identity(train_config.resolve(plain)):
            wrong.append(f"--{dest}: the encoding {encoding} sets it, but giving it changed the hash")
    # every option left out, changed at once (the batch layout keeping its tokens per update): one hash
    left_out = [d for d in options if d in LEFT_OUT and d not in ("max_tokens", "update_freq")]
    new = _changes(argv, left_out, parser, args, fill)
    assert new is not None
    config = train_config.resolve(new)
    assert train_config.identity(config) == train_config.identity(recorded), train_config.differences(recorded, config)
    wrong += [f"--{d}: the changed value did not reach the configuration" for d in left_out
              if d not in ("max_tokens_valid", "cpu") and not _reached(d, config, recorded)]
    assert wrong == []


@pytest.mark.parametrize("option,value", [("max_tokens", "256"), ("update_freq", "4"),
                                          ("distributed_world_size", "2")])
def test_another_batch_layout_alone_changes_the_tokens_per_update_and_the_hash(finished, option, value):
    _, argv = finished
    parser, _ = train_config.parse(argv)
    new = _set(argv, _option_strings(parser)[option], value)
    before, after = train_config.resolve(argv), train_config.resolve(new)
    assert [d for d in train_config.differences(before, after) if d.startswith("tokens_per_update")]
    assert train_config.identity(before) != train_config.identity(after)


def test_the_budget_is_left_out_but_a_cosine_schedules_max_update_is_not(finished):
    """A larger budget goes on in the same directory; under --lr-scheduler cosine the budget is also
    the schedule's length (lr_scheduler.max_update): another budget is another model there."""
    _, argv = finished
    longer = train_config.resolve(_set_flag(argv, "--max-update", "2000"))
    assert train_config.identity(longer) == train_config.identity(train_config.resolve(argv))
    cosine = [*_without(_without(argv, "--lr-scheduler"), "--warmup-init-lr"), "--lr-scheduler", "cosine"]
    short, long_ = (train_config.resolve(_set_flag(cosine, "--max-update", n)) for n in ("1000", "2000"))
    assert short["lr_scheduler.max_update"] == 1000 and long_["lr_scheduler.max_update"] == 2000
    assert train_config.identity(short) != train_config.identity(long_)
    assert train_config.differences(short, long_) == ["max_update: 1000 -> 2000"]


def _set_flag(argv, flag, value):
    return _without(argv, flag) + [flag, value]


def test_a_batch_in_tokens_on_one_side_only_changes_the_tokens_per_update_and_0_is_no_budget():
    """max_tokens x update_freq x world size, update_freq and the world size 1 where unset; a run
    without --max-tokens on either side is another batch; fairseq's 0 is no limit (None)."""
    tokens = "tokens_per_update"
    assert train_config.tokens_per_update({"dataset.max_tokens": 100, "optimization.update_freq": [4],
                                           "distributed_training.distributed_world_size": 2}) == 800
    assert train_config.tokens_per_update({"dataset.max_tokens": 100}) == 100
    assert train_config.tokens_per_update({"optimization.update_freq": [4]}) is None
    with_tokens = {"dataset.max_tokens": 100, "optimization.update_freq": [2]}
    without = {"optimization.update_freq": [2]}
    assert train_config.differences(without, with_tokens)[-1] == f"{tokens}: null -> 200"
    assert train_config.differences(with_tokens, without)[-1] == f"{tokens}: 200 -> null"
    assert train_config.differences(without, without) == train_config.differences(with_tokens, with_tokens) == []
    assert train_config.budget({"optimization.max_update": 0, "optimization.max_epoch": 3}) == (None, 3)
    assert train_config.budget({"optimization.max_update": 6, "optimization.max_epoch": 0}) == (6, None)


def test_a_runs_identity_leaves_out_paths_and_the_batch_layout_not_what_it_reads_by_content():
    base = {"checkpoint.save_dir": "/a", "task.data": "/d1", "optimization.lr": [0.001], "dataset.max_tokens": 100,
            "optimization.update_freq": [2], "model.floater_init_from": "/v1.pt", "model.lr": [0.001]}
    moved = {**base, "checkpoint.save_dir": "/b", "task.data": "/d2", "dataset.max_tokens": 200,
             "optimization.update_freq": [1], "model.floater_init_from": "/v2.pt"}  # 200 tokens per update each
    assert train_config.identity(base) == train_config.identity(moved)
    for changed in ({"optimization.lr": [0.002]}, {"dataset.max_tokens": 101}):
        assert train_config.identity({**base, **changed}) != train_config.identity(base), changed
    # the model namespace repeats the sections: optimization decides
    assert train_config.identity({**base, "model.lr": [9]}) == train_config.identity(base)
    # what the training job adds by content: the data, the start's checkpoint, the code
    assert train_config.identity(base, {"data": "abc"}) != train_config.identity(base, {"data": "abd"})


def test_a_refused_argument_is_named_by_fairseqs_own_last_error_line():
    import fairseq_posenc

    argv = ["data-bin", "--user-dir", os.path.dirname(os.path.abspath(fairseq_posenc.__file__)),
            "--arch", "no_such_arch"]
    with pytest.raises(ValueError) as error:
        train_config.parse(argv)
    message = str(error.value)
    assert message.startswith("fairseq-train would refuse its arguments: ")
    assert "error: argument --arch/-a: invalid choice: 'no_such_arch'" in message
