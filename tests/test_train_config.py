"""A finished training stage is reused only by a re-run whose resolved fairseq configuration
differs in the fields fairseq_posenc/recipe/train_config.py lets differ, each with its reason.

One finished stage per architecture is made by the real recipe (recipes/*/train.sh with the stub
fairseq-train of tests/stubs, which logs the argument list it was given); then every option of
fairseq's training parser is changed in turn, in process, and the stage decision must refuse
(keyed) or accept (allowed). The classification must equal the parser's options, so an option that
fairseq or the plugin adds later fails here until it is weighed."""
import json
import os
import shutil
import subprocess

import pytest

from fairseq_posenc import pipeline, toy_data
from fairseq_posenc.recipe import stages, train_config

REPO = os.path.dirname(pipeline.USER_DIR)
STUBS = os.path.join(REPO, "tests", "stubs")

# architecture: (recipe, corpus recipe name, environment of the finished run)
RUNS = {
    "wmt": ("wmt14_en_de", {"ARCH": "base"}),
    "iwslt": ("iwslt14_de_en", {}),
}
BASE_ENV = {"DEVICE": "cpu", "MAX_UPDATE": "6", "SAVE_INTERVAL_UPDATES": "2", "AVERAGE": "2", "WARMUP": "3",
            "MAX_TOKENS": "128", "UPDATE_FREQ": "2", "ALLOW_BATCH": "1", "ENC": "sinusoidal",
            "OMP_NUM_THREADS": "1"}

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
    "position_sharing": "layer", "diet_rank": "4", "max_relative_distance": "8", "alibi_encoder": "crossed",
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
    "distributed_world_size": {"distributed_world_size": "2", "update_freq": "1"},
}


def _corpus_dir(directory, recipe):
    """What a recipe's prepare.sh leaves: data-bin and corpus.env."""
    prefixes = toy_data.write_toy_corpus(os.path.join(directory, "raw"), {"train": (120, 3, 8), "valid": (20, 3, 8)},
                                         seed=1)
    pipeline.preprocess(prefixes, os.path.join(directory, "data-bin"))
    with open(os.path.join(directory, "corpus.env"), "w") as f:
        f.write(f"RECIPE={recipe}\nSRC=src\nTGT=tgt\nBPE=subword-nmt\nBPE_SIZE=100\nVALID_NAME=x\nTEST_NAME=y\n")
    return directory


WMT_ARGV = []  # the WMT run's argument list, once its fixture is built (the IWSLT walk compares with it)


@pytest.fixture(scope="module", params=list(RUNS))
def finished(request, tmp_path_factory):
    """(arch, the argument list the recipe ran, its save dir, its settings) of a finished run."""
    arch = request.param
    recipe, env = RUNS[arch]
    base = tmp_path_factory.mktemp(arch)
    data = _corpus_dir(str(base / "data"), recipe)
    log = str(base / "calls.jsonl")
    out = str(base / "run")
    path = f"{STUBS}:{os.path.join(REPO, '.venv', 'bin')}:{os.environ['PATH']}"
    proc = subprocess.run(["bash", os.path.join(REPO, "recipes", recipe, "train.sh")], capture_output=True, text=True,
                          env={**os.environ, **BASE_ENV, **env, "DATA": data, "OUT": out, "STUB_LOG": log, "PATH": path})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(log) as f:
        (call,) = [json.loads(line) for line in f]
    record = stages.read_json(os.path.join(out, stages.RECORD))
    if arch == "wmt":
        WMT_ARGV[:] = [call["argv"]]
    assert record["finished"] and record["config"]["model.arch"].endswith(call["argv"][call["argv"].index("--arch") + 1])
    return arch, call["argv"], out, record["settings"], str(base)


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
    kind = type(action).__name__
    if kind in ("_StoreTrueAction", "_StoreFalseAction"):
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


def test_the_classification_is_the_training_parsers_options(finished):
    _, argv, _, _, _ = finished
    parser, _ = train_config.parse(argv)
    options = train_config.parser_options(parser)
    classified = set(train_config.MAY_DIFFER) | train_config.KEYED
    assert not set(train_config.MAY_DIFFER) & train_config.KEYED
    assert options - classified == set(), "options nobody weighed: add each to KEYED or MAY_DIFFER with a reason"
    assert classified - options == set(), "classified names the parser no longer has"


def _decide(out, settings, argv, tmp):
    """The decision for ``argv`` against the finished record, on a copy of the run."""
    copy = os.path.join(tmp, "decide")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(out, copy)
    config = train_config.resolve(argv)
    return config, stages.decide(copy, settings, config)


def _reached(dest, config, recorded):
    return any(train_config.field_name(k) == dest and config.get(k) != recorded.get(k)
               for k in set(config) | set(recorded))


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


def test_every_option_is_keyed_or_may_differ_as_classified(finished, tmp_path):
    arch, argv, out, settings, base = finished
    data = argv[0]
    shutil.copytree(data, str(tmp_path / "copy-of-data"))
    fill = {"tmp": str(tmp_path), "user_dir": pipeline.USER_DIR,
            "suffix": next(a for a in argv if a.startswith("transformer_")).split("_", 2)[2]}
    parser, args = train_config.parse(argv)
    recorded = train_config.resolve(argv)
    assert stages.decide(out, settings, recorded)[0] == "skip"
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
            config, (decision, reason) = _decide(out, settings, new, str(tmp_path))
        except stages.Refusal as refusal:
            config, decision, reason = train_config.resolve(new), "refused", str(refusal)
        except ValueError as error:
            if len(dests) > 1:  # one of them is refused by the parser: see which, alone
                groups[:0] = [[d] for d in dests]
            elif "fairseq-train would refuse" not in str(error):
                wrong.append(f"--{dests[0]}: {error}")
            continue  # alone and refused by fairseq's (or the plugin's) parser: no run to reuse
        for dest in dests:
            if not _reached(dest, config, recorded):
                wrong.append(f"--{dest}: the changed value did not reach the configuration")
            elif decision != "refused" or f"{dest}: " not in reason:
                wrong.append(f"--{dest} is keyed but {decision}: {reason}")
    # every option that may differ, changed at once (the batch layout keeping its tokens per update)
    may_differ = [d for d in options if d in train_config.MAY_DIFFER and d not in ("max_tokens", "update_freq")]
    new = _changes(argv, may_differ, parser, args, fill)
    assert new is not None
    config, (decision, reason) = _decide(out, settings, new, str(tmp_path))
    assert decision == ("resume" if "max_update" in may_differ else "skip"), reason  # max_update + 1: resume
    wrong += [f"--{d}: the changed value did not reach the configuration" for d in may_differ
              if d not in ("max_tokens_valid", "cpu") and not _reached(d, config, recorded)]
    assert wrong == []


@pytest.mark.parametrize("option,value", [("max_tokens", "256"), ("update_freq", "4"),
                                          ("distributed_world_size", "2")])
def test_another_batch_layout_alone_changes_the_tokens_per_update_and_is_refused(finished, tmp_path, option, value):
    _, argv, out, settings, _ = finished
    parser, _ = train_config.parse(argv)
    new = _set(argv, _option_strings(parser)[option], value)
    with pytest.raises(stages.Refusal, match=r"tokens per update \(max_tokens x update_freq x world size\): 256 -> "):
        _decide(out, settings, new, str(tmp_path))


def test_a_layout_within_the_plans_tolerance_is_the_same_batch():
    recorded = {"dataset.max_tokens": 3641, "optimization.update_freq": [3],
                "distributed_training.distributed_world_size": 3}  # 32769 tokens: the plan's 3 GPUs
    asked = {"dataset.max_tokens": 2048, "optimization.update_freq": [16],
             "distributed_training.distributed_world_size": 1}  # 32768: one GPU
    assert train_config.differences(recorded, asked) == []
    asked["dataset.max_tokens"] = 2100  # 33600: 2.5% more
    assert train_config.differences(recorded, asked) == [
        "tokens per update (max_tokens x update_freq x world size): 32769 -> 33600"]


def test_floaters_stages_get_the_corpus_recipes_settings_unlisted(tmp_path):
    """FLOATER's protocol runs in the corpus recipe's shell (recipes/floater/protocol.sh), so what
    the recipe read from corpus.env reaches it: with EVAL_BLEU=1, validation BLEU detokenizes the
    corpus's target language (a child process given a hand-kept list of variables fell back to
    English). The warm-started encoding's own flags reach its stage only."""
    data = _corpus_dir(str(tmp_path / "data"), "wmt14_en_de")
    log = str(tmp_path / "calls.jsonl")
    path = f"{STUBS}:{os.path.join(REPO, '.venv', 'bin')}:{os.environ['PATH']}"
    env = {**os.environ, **BASE_ENV, "ENC": "rnn", "MODEL_FLAGS": "--rnn-layers 2", "EVAL_BLEU": "1",
           "FLOATER_EPOCHS": "1", "FLOATER_MAX_UPDATE": "4", "DATA": data, "OUT": str(tmp_path / "run"),
           "STUB_LOG": log, "PATH": path}
    proc = subprocess.run(["bash", os.path.join(REPO, "recipes", "wmt14_en_de", "train.sh")], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(log) as f:
        calls = {os.path.basename(c["save_dir"]).split("-")[0]: c["argv"] for c in map(json.loads, f)}
    assert set(calls) == {"vanilla", "rnn"}
    for argv in calls.values():
        assert argv[argv.index("--eval-bleu-detok-args") + 1] == '{"target_lang": "tgt"}'
    assert "--rnn-layers" not in calls["vanilla"]
    assert calls["rnn"][calls["rnn"].index("--rnn-layers") + 1] == "2"


def test_a_cached_resolution_is_the_same_and_any_input_of_the_resolution_keys_it(tmp_path, monkeypatch):
    """steps.py's cache of resolved configurations (one fairseq import per argument list, not per
    call): a hit equals a fresh resolution; another argument, another plugin source (a copy of
    --user-dir with one byte changed) or another fairseq version is another key; the checkpoints
    a stage starts from are fingerprinted every time, not cached."""
    start = tmp_path / "start.pt"
    start.write_bytes(b"one")
    argv = ["/nodata", "--user-dir", pipeline.USER_DIR, "--task", "translation", "--arch", "transformer_sinusoidal_wmt_en_de",
            "--optimizer", "adam", "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt", "--criterion",
            "label_smoothed_cross_entropy", "--max-tokens", "4096", "--max-update", "100",
            "--finetune-from-model", str(start)]
    fresh = train_config.resolve(argv, lambda path: open(path, "rb").read().decode())
    cache = str(tmp_path / "cache")
    assert train_config.resolve(argv, lambda path: open(path, "rb").read().decode(), cache) == fresh
    assert len(os.listdir(cache)) == 1
    calls = []
    real = train_config._resolve
    monkeypatch.setattr(train_config, "_resolve", lambda a: calls.append(a) or real(a))
    start.write_bytes(b"two")  # the start's content is read again: not part of the cached entry
    hit = train_config.resolve(argv, lambda path: open(path, "rb").read().decode(), cache)
    assert calls == [] and hit == {**fresh, "inputs.finetune_from_model": "two"}
    key = train_config.cache_key(argv)
    assert train_config.cache_key(argv[:-2] + ["--max-update", "101"] + argv[-2:]) != key
    # a copy of the plugin as --user-dir (keyed, not imported here: fairseq registers a plugin once)
    user_dir = tmp_path / "plugin"
    shutil.copytree(pipeline.USER_DIR, user_dir, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    copy = [str(user_dir) if a == pipeline.USER_DIR else a for a in argv]
    before = train_config.cache_key(copy)
    assert before != key
    with open(user_dir / "models" / "__init__.py", "a") as f:
        f.write("\n")
    assert train_config.cache_key(copy) != before
    # fairseq by its installed files, whatever its version says (this one's distribution is
    # ve-fairseq: a key by metadata.version("fairseq") held "none" for every fairseq)
    import importlib.util
    from importlib import metadata

    fake = tmp_path / "site" / "fairseq"
    fake.mkdir(parents=True)
    (fake / "options.py").write_text("A = 1\n")
    spec = importlib.machinery.ModuleSpec("fairseq", None, is_package=True)
    spec.submodule_search_locations.append(str(fake))
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "fairseq" else real_find(name, *a))
    changed = train_config.cache_key(argv)
    assert changed != key
    (fake / "options.py").write_text("A = 22\n")  # an edited fairseq of the same version
    assert train_config.cache_key(argv) != changed
    edited = train_config.cache_key(argv)
    real_version = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "0.0" if name == "torch" else real_version(name))
    assert train_config.cache_key(argv) != edited


def test_a_batch_in_tokens_on_one_side_only_changes_the_tokens_per_update_and_0_is_no_budget():
    """max_tokens x update_freq x world size, update_freq and the world size 1 where unset; a run
    without --max-tokens on either side is another batch; fairseq's 0 is no limit (None)."""
    tokens = "tokens per update (max_tokens x update_freq x world size)"
    assert train_config.tokens_per_update({"dataset.max_tokens": 100, "optimization.update_freq": [4],
                                           "distributed_training.distributed_world_size": 2}) == 800
    assert train_config.tokens_per_update({"dataset.max_tokens": 100}) == 100
    assert train_config.tokens_per_update({"optimization.update_freq": [4]}) is None
    with_tokens = {"dataset.max_tokens": 100, "optimization.update_freq": [2]}
    without = {"optimization.update_freq": [2]}
    assert train_config.differences(without, with_tokens)[-1] == f"{tokens}: None -> 200"
    assert train_config.differences(with_tokens, without)[-1] == f"{tokens}: 200 -> None"
    assert train_config.differences(without, without) == train_config.differences(with_tokens, with_tokens) == []
    assert train_config.budget({"optimization.max_update": 0, "optimization.max_epoch": 3}) == (None, 3)
    assert train_config.budget({"optimization.max_update": 6, "optimization.max_epoch": 0}) == (6, None)


def test_a_runs_identity_leaves_out_paths_and_the_batch_layout_not_the_content_it_starts_from():
    base = {"checkpoint.save_dir": "/a", "task.data": "/d1", "optimization.lr": [0.001], "dataset.max_tokens": 100,
            "optimization.update_freq": [2], "model.floater_init_from": "/v1.pt", "inputs.floater_init_from": "abc"}
    moved = {**base, "checkpoint.save_dir": "/b", "task.data": "/d2", "dataset.max_tokens": 200,
             "optimization.update_freq": [1], "model.floater_init_from": "/v2.pt"}  # 200 tokens per update each
    assert train_config.identity(base) == train_config.identity(moved)
    for changed in ({"optimization.lr": [0.002]}, {"inputs.floater_init_from": "abd"}, {"dataset.max_tokens": 101}):
        assert train_config.identity({**base, **changed}) != train_config.identity(base), changed


def test_a_refused_argument_is_named_by_fairseqs_own_last_error_line():
    import fairseq_posenc

    argv = ["data-bin", "--user-dir", os.path.dirname(os.path.abspath(fairseq_posenc.__file__)),
            "--arch", "no_such_arch"]
    with pytest.raises(ValueError) as error:
        train_config.parse(argv)
    message = str(error.value)
    assert message.startswith("fairseq-train would refuse its arguments: ")
    assert "error: argument --arch/-a: invalid choice: 'no_such_arch'" in message
