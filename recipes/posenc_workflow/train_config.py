"""The configuration a fairseq-train job runs with, as fairseq itself resolves it, and the hash
of it that names the job's checkpoint directory (recipes/rules/train.smk).

The hash covers ``convert_namespace_to_omegaconf(args)`` of the job's argument list (architecture
defaults applied, interpolations such as ``lr_scheduler.max_update`` filled), every field but
those of :data:`LEFT_OUT`, each left out with its reason; the batch layout enters as the tokens
per update it gives. :data:`KEYED` names the rest of the training parser's options, so that
``tests/workflow/test_train_config.py`` can tell an option fairseq or the plugin adds later from one that
was weighed: the two lists and :data:`DECIDED` (what the encoding sets) must equal the parser's options.

A left-out field is named by its option (``log_interval``: in whatever section fairseq keeps it)
or by its section (``optimization.max_update``, the budget; ``lr_scheduler.max_update``, which a
cosine schedule reads, stays hashed: another budget is another schedule there). The model's
namespace of fairseq's legacy architectures repeats every option: ``model.X`` is left out where
another section holds X, so that the section decides.
"""
import argparse
import contextlib
import hashlib
import io
import json
import os
import warnings
from typing import Any, Dict, Iterable, List, Optional

PATHS = ("a path: what is read there enters the hash by content (the training data's fingerprint, the "
         "checkpoint a warm start reads), not by where it lies")
LOGGING = "logging and progress output: what is printed or written beside the run, not what it computes"
WORKERS = "data-loader processes and prefetch: the batches and their order are the same"
DISTRIBUTED = "how the processes of one run find each other: rank, address, port, backend, timeout"
BUDGET = ("the budget: a larger one goes on from the directory's checkpoint_last.pt; one below what the "
          "directory holds is refused by the training job")
BATCH = ("the batch layout across devices, hashed as the tokens per update it gives (max_tokens x "
         "update_freq x world size): the GPU count at equal tokens per update is the same model")
DEVICE = "where the same computation runs; precision (fp16, bf16, amp) is hashed on its own"
RETENTION = ("how many of the saved checkpoints are kept: what an averaging can read, not what is trained "
             "(recipes/posenc_workflow/retention.py refuses an averaging the kept ones cannot serve)")

# every field left out of the hash, with its reason: by option name (any section) or section.option
LEFT_OUT: Dict[str, str] = {
    "data": PATHS, "save_dir": PATHS, "user_dir": PATHS, "plasma_path": PATHS,
    "finetune_from_model": PATHS, "floater_init_from": PATHS,
    "no_progress_bar": LOGGING, "log_interval": LOGGING, "log_format": LOGGING, "log_file": LOGGING,
    "aim_repo": LOGGING, "aim_run_hash": LOGGING, "tensorboard_logdir": LOGGING, "wandb_project": LOGGING,
    "azureml_logging": LOGGING, "reset_logging": LOGGING, "profile": LOGGING, "debug_param_names": LOGGING,
    "eval_bleu_print_samples": LOGGING,
    "num_workers": WORKERS, "data_buffer_size": WORKERS,
    "distributed_rank": DISTRIBUTED, "distributed_port": DISTRIBUTED, "distributed_init_method": DISTRIBUTED,
    "distributed_backend": DISTRIBUTED, "distributed_no_spawn": DISTRIBUTED, "device_id": DISTRIBUTED,
    "heartbeat_timeout": DISTRIBUTED,
    "optimization.max_update": BUDGET, "optimization.max_epoch": BUDGET, "optimization.stop_time_hours": BUDGET,
    "max_tokens": BATCH, "update_freq": BATCH, "distributed_world_size": BATCH, "distributed_num_procs": BATCH,
    "nprocs_per_node": BATCH,
    "max_tokens_valid": "validation batches only (it follows max_tokens): the summed validation loss does not "
                        "depend on how the validation set is batched",
    "cpu": DEVICE,
    "keep_interval_updates": RETENTION, "keep_interval_updates_pattern": RETENTION, "keep_last_epochs": RETENTION,
    "keep_best_checkpoints": RETENTION,
}

# fairseq's own input position embedding, which the plugin's --position-encoding decides: hashed
# as not given under the plugin's architectures (a model.position_encoding), hashed elsewhere
DECIDED: Dict[str, str] = dict.fromkeys(
    ("encoder_learned_pos", "decoder_learned_pos", "no_token_positional_embeddings"),
    "set by the encoding (transformer_posenc's build_model; a value contradicting it is refused): "
    "none with --no-token-positional-embeddings or without is one model")

# the training parser's other options, weighed and hashed: another value is another model
KEYED = frozenset("""
seed tpu bf16 memory_efficient_bf16 fp16 memory_efficient_fp16 fp16_no_flatten_grads fp16_init_scale
fp16_scale_window fp16_scale_tolerance on_cpu_convert_precision min_loss_scale threshold_loss_scale amp
amp_batch_retries amp_init_scale amp_scale_window empty_cache_freq all_gather_list_size model_parallel_size
quantization_config_path suppress_crashes use_plasma_view criterion tokenizer bpe optimizer lr_scheduler
scoring task skip_invalid_size_inputs_valid_test batch_size required_batch_size_multiple
required_seq_len_multiple dataset_impl train_subset valid_subset combine_valid_subsets
ignore_unused_valid_subsets validate_interval validate_interval_updates validate_after_updates
fixed_validation_seed disable_validation batch_size_valid max_valid_steps curriculum gen_subset num_shards
shard_id grouped_shuffling update_epoch_batch_itr update_ordered_indices_seed ddp_backend ddp_comm_hook
bucket_cap_mb fix_batches_to_gpus find_unused_parameters gradient_as_bucket_view fast_stat_sync
broadcast_buffers slowmo_momentum slowmo_base_algorithm localsgd_frequency pipeline_model_parallel
pipeline_balance pipeline_devices pipeline_chunks pipeline_encoder_balance pipeline_encoder_devices
pipeline_decoder_balance pipeline_decoder_devices pipeline_checkpoint zero_sharding no_reshard_after_forward
fp32_reduce_scatter cpu_offload use_sharded_state not_fsdp_flatten_parameters arch clip_norm sentence_avg lr
stop_min_lr use_bmuf skip_remainder_batch restore_file continue_once reset_dataloader reset_lr_scheduler
reset_meters reset_optimizer optimizer_overrides save_interval save_interval_updates
no_save no_epoch_checkpoints
no_last_checkpoints no_save_optimizer_state best_checkpoint_metric maximize_best_checkpoint_metric patience
checkpoint_suffix checkpoint_shard_count load_checkpoint_on_all_dp_ranks write_checkpoints_asynchronously
store_ema ema_decay ema_start_update ema_seed_model ema_update_freq ema_fp32
activation_fn dropout attention_dropout activation_dropout adaptive_input encoder_embed_path encoder_embed_dim
encoder_ffn_embed_dim encoder_layers encoder_attention_heads encoder_normalize_before
encoder_layerdrop encoder_layers_to_keep encoder_xformers_att_config max_source_positions decoder_embed_path
decoder_embed_dim decoder_ffn_embed_dim decoder_layers decoder_attention_heads decoder_normalize_before
decoder_layerdrop decoder_layers_to_keep decoder_xformers_att_config decoder_output_dim
max_target_positions share_decoder_input_output_embed share_all_embeddings merge_src_tgt_embed
adaptive_softmax_cutoff adaptive_softmax_dropout adaptive_softmax_factor
layernorm_embedding tie_adaptive_weights tie_adaptive_proj no_scale_embedding checkpoint_activations
offload_activations no_cross_attention cross_self_attention quant_noise_pq quant_noise_pq_block_size
quant_noise_scalar min_params_to_wrap char_inputs relu_dropout base_layers base_sublayers base_shuffle export
no_decoder_final_norm
position_encoding keep_input_positions attention_head_dim segment_attention segment_separator max_segments
position_blocks position_bias_scale position_sharing diet_rank max_relative_distance t5_num_buckets
t5_max_distance rope_theta alibi_encoder floater_dt floater_solver floater_step floater_adjoint floater_hidden
floater_cross_attention floater_solve_every floater_lr_scale floater_dissipation rnn_layers rnn_input rnn_dt
kerple_kernel fire_encoder xpos_gamma xpos_scale_base xpos_encoder rope_ntk_factor rope_pi_factor rope_yarn_factor
randomized_positions randomized_decoder randomized_max_position
source_lang target_lang load_alignments left_pad_source left_pad_target upsample_primary truncate_source
num_batch_buckets eval_bleu eval_bleu_args eval_bleu_detok eval_bleu_detok_args eval_tokenized_bleu
eval_bleu_remove_bpe label_smoothing report_accuracy ignore_prefix_size
adam_betas adam_eps weight_decay use_old_adam fp16_adam_stats warmup_updates warmup_init_lr
pad eos unk
""".split())


def _quietly():
    """fairseq and hydra print deprecation warnings and INFO lines while parsing: not the user's."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    return stack


def parse(argv: List[str]):
    """fairseq-train's parser with the plugin (``--user-dir`` in ``argv``), after parsing
    ``argv``: registry choices add their own options to it as fairseq-train's does."""
    from fairseq import options

    errors = io.StringIO()
    try:
        with _quietly(), contextlib.redirect_stderr(errors):
            parser = options.get_training_parser()
            args = options.parse_args_and_arch(parser, input_args=list(argv))
    except SystemExit:  # argparse's error: its last line says what
        lines = errors.getvalue().strip().splitlines()
        raise ValueError(f"fairseq-train would refuse its arguments: {lines[-1] if lines else 'parse error'}") from None
    return parser, args


def parser_options(parser: argparse.ArgumentParser) -> set:
    return {action.dest for action in parser._actions if action.dest != "help"}


def _plain(value: Any) -> Any:
    """JSON's view of a value: what a record stores and a re-run compares with."""
    return json.loads(json.dumps(value, default=repr))


def config_cache() -> str:
    """Where the workflow caches resolved configurations (:func:`resolve`'s ``cache``), under
    Snakemake's own directory of the working directory."""
    return os.path.join(".snakemake", "fairseq_posenc", "configs")


def resolve(argv: List[str], cache: Optional[str] = None) -> Dict[str, Any]:
    """``section.field -> value`` of ``convert_namespace_to_omegaconf`` for ``argv``, every
    section and the model's namespace (fairseq's legacy architectures keep every argument there).

    ``cache``: a directory of resolved configurations keyed by :func:`cache_key` (everything the
    resolution reads: ``argv``, the plugin's source, fairseq's and torch's versions, the CUDA
    devices torch sees), so that a recipe's several calls with one argument list import fairseq
    (seconds) once. A key never names another resolution, so an entry never goes stale."""
    path = flat = None
    if cache:
        path = os.path.join(cache, cache_key(argv) + ".json")
        try:
            with open(path, encoding="utf-8") as f:
                entry = json.load(f)
            flat = dict(entry["config"])
        except (OSError, ValueError, KeyError, TypeError):  # not there yet (or cut short): resolved anew
            flat = None
    if flat is None:
        flat = _resolve(argv)
        if path:
            os.makedirs(cache, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"argv": list(argv), "config": flat}, f)
            os.replace(tmp, path)
    return dict(flat)


def _source_digest(directory: str, digest) -> None:
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        for name in sorted(files):
            if name.endswith((".py", ".so")):
                with open(os.path.join(root, name), "rb") as f:
                    digest.update(os.path.relpath(os.path.join(root, name), directory).encode() + b"\0" + f.read())


def _files_digest(directory: str, digest) -> None:
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".pyc"):
                stat = os.stat(os.path.join(root, name))
                digest.update(f"{os.path.relpath(os.path.join(root, name), directory)}:{stat.st_size}:"
                              f"{stat.st_mtime_ns}\0".encode())


def cache_key(argv: List[str]) -> str:
    """What a resolved configuration depends on, hashed: the argument list; the source of the
    plugin (``--user-dir`` and this package, which registers the architectures and their
    defaults); Python's version, the installed files of fairseq, hydra and omegaconf, torch's
    version; and the GPUs torch
    sees (fairseq's default world size is their count): none without a GPU driver's device node,
    else torch is imported to count them (about a third of fairseq's import)."""
    import hashlib
    import sys
    from importlib import metadata

    import importlib.util

    digest = hashlib.sha256(json.dumps({"argv": list(argv), "python": sys.version}).encode())
    # fairseq, hydra and omegaconf by their installed files (an edited or reinstalled fairseq is
    # another fairseq whatever its version says; this one's distribution is not even named
    # "fairseq"): the name, size and modification time of each, a stat, not a read (0.01 s)
    for package in ("fairseq", "hydra", "omegaconf"):
        spec = importlib.util.find_spec(package)
        for location in (spec.submodule_search_locations or []) if spec else ["none"]:
            digest.update(f"{package}@{location}\0".encode())
            _files_digest(location, digest)
    try:  # torch: by its version (its tree is 1 GB; a build always carries its version)
        digest.update(f"torch={metadata.version('torch')}\0".encode())
    except metadata.PackageNotFoundError:
        digest.update(b"torch=none\0")
    digest.update(f"cuda={_gpus()}\0".encode())
    plugin = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = {plugin}
    for i, arg in enumerate(argv):
        if arg == "--user-dir" and i + 1 < len(argv):
            dirs.add(os.path.abspath(argv[i + 1]))
        elif arg.startswith("--user-dir="):
            dirs.add(os.path.abspath(arg.split("=", 1)[1]))
    for directory in sorted(dirs):
        digest.update(directory.encode() + b"\0")
        _source_digest(directory, digest)
    return digest.hexdigest()[:32]


def _gpus() -> int:
    """torch.cuda.device_count(), without importing torch where no NVIDIA or ROCm device node
    exists (torch then sees none, whatever CUDA_VISIBLE_DEVICES says)."""
    if not any(os.path.exists(node) for node in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")):
        return 0
    import torch

    return torch.cuda.device_count()


def _resolve(argv: List[str]) -> Dict[str, Any]:
    """The flat configuration of :func:`resolve`."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import DictConfig, OmegaConf

    _, args = parse(argv)
    try:
        with _quietly():
            cfg = convert_namespace_to_omegaconf(args)
    except Exception as error:  # hydra's: a component without a config of its own, an override it refuses
        raise ValueError(f"fairseq could not resolve its configuration: {str(error).splitlines()[0]}") from None
    flat: Dict[str, Any] = {}
    for section in cfg:
        value = cfg[section]
        if isinstance(value, argparse.Namespace):
            value = vars(value)
        elif isinstance(value, DictConfig):
            value = OmegaConf.to_container(value, resolve=True)
        if isinstance(value, dict):
            for name, field in value.items():
                flat[f"{section}.{name}"] = field
        else:
            flat[section] = value
    return _plain(flat)


def option_of(entry: str) -> str:
    """The option a :data:`LEFT_OUT` entry names (``optimization.max_update`` -> ``max_update``)."""
    return entry.rsplit(".", 1)[-1]


def left_out(key: str, sectioned: Iterable[str] = ()) -> bool:
    """Whether ``section.field`` stays out of the hash; ``sectioned``: the fields that a section
    other than the model's namespace holds (``model.X`` is then a repetition)."""
    section, _, field = key.rpartition(".")
    if field in LEFT_OUT or key in LEFT_OUT:
        return True
    return section == "model" and field in sectioned


POSITIONS_REMOVED_GIVEN = "posenc_no_token_positional_embeddings_given"  # fairseq_posenc/models/config.py


def hashed_fields(config: Dict[str, Any]) -> Dict[str, Any]:
    """What the hash covers: every field not :func:`left_out`, and the tokens per update. Under the
    plugin's architectures (a ``model.position_encoding``) fairseq's input position flags are hashed
    as not given: ``none`` and ``none:--no-token-positional-embeddings`` build one model."""
    sectioned = {key.rpartition(".")[2] for key in config if not key.startswith("model.")}
    kept = {k: v for k, v in config.items() if not left_out(k, sectioned)}
    if "model.position_encoding" in kept:
        kept.pop(f"model.{POSITIONS_REMOVED_GIVEN}", None)
        kept.update({f"model.{name}": False for name in DECIDED if f"model.{name}" in kept})
    kept["tokens_per_update"] = tokens_per_update(config)
    return kept


def tokens_per_update(config: Dict[str, Any]) -> Optional[int]:
    """max_tokens x update_freq x world size: what an update holds, whatever the devices."""
    max_tokens = config.get("dataset.max_tokens")
    update_freq = config.get("optimization.update_freq") or [1]
    world = config.get("distributed_training.distributed_world_size") or 1
    if not max_tokens:
        return None
    return int(max_tokens) * int(update_freq[0]) * int(world)


def budget(config: Dict[str, Any]):
    """(max_update, max_epoch), None for fairseq's 0 (no limit)."""
    return (config.get("optimization.max_update") or None, config.get("optimization.max_epoch") or None)


def identity(config: Dict[str, Any], extra: Optional[Dict[str, str]] = None) -> str:
    """12 hex digits naming the model of ``config`` trained on what ``extra`` names by content (the
    training data, the checkpoint it starts from, the code: recipes/posenc_workflow/train_job.py)."""
    text = json.dumps([hashed_fields(config), sorted((extra or {}).items())], sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def differences(old: Dict[str, Any], new: Dict[str, Any]) -> List[str]:
    """``field: old -> new`` for each hashed field that differs (what makes two configurations two
    models), a field that fairseq keeps in several sections named once."""
    old, new = hashed_fields(old), hashed_fields(new)
    changed: Dict[str, None] = {}
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key, "(unset)"), new.get(key, "(unset)")
        if before != after:
            changed.setdefault(f"{key.rpartition('.')[2]}: {_show(before)} -> {_show(after)}", None)
    return list(changed)


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
