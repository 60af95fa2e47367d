"""Everything fairseq needs to run on this stack (Python 3.11, torch >= 2.6), in one place.

Applied once when the plugin is imported, which fairseq's CLI does (``--user-dir``) before it
touches a checkpoint. docs/development.md lists every patch of fairseq, torch and Python, why, for
which versions, and the test that fails without it.
"""
import argparse
import builtins
import collections
import difflib
import functools
import logging
import os
import re
import sys
import typing

import numpy as np
import torch

_applied = False


class PosencError(ValueError):
    """A mistake in what the user gave (a flag, a file). Uncaught in a command-line program, it
    prints one line, ``PROGRAM: error: MESSAGE``, and exits with status 1 (``short_user_errors``);
    in Python it is an ordinary ValueError."""


def _checkpoint_globals():
    """The classes fairseq pickles into checkpoints, and nothing else.

    torch >= 2.6 loads with ``weights_only=True`` by default and refuses any class not on its
    allow-list. fairseq stores its config as an ``argparse.Namespace`` (legacy models) or as
    omegaconf containers (older checkpoints), metric values as numpy scalars, and with
    ``--eval-bleu`` the BLEU n-gram counts of its validation meters as numpy arrays (without
    these, such a checkpoint can be neither resumed nor decoded). Allow-listing
    these keeps torch's safe unpickler on for everything else, unlike
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` or ``weights_only=False``.
    """
    from omegaconf import DictConfig, ListConfig
    from omegaconf.base import ContainerMetadata, Metadata
    from omegaconf.nodes import AnyNode

    numpy_dtypes = [type(np.dtype(t)) for t in (np.float64, np.float32, np.int64, np.int32, np.bool_)]
    return [
        argparse.Namespace,
        DictConfig,
        ListConfig,
        ContainerMetadata,
        Metadata,
        AnyNode,
        typing.Any,
        builtins.dict,
        builtins.list,
        builtins.int,
        collections.defaultdict,
        np._core.multiarray.scalar,
        np._core.multiarray._reconstruct,
        np.ndarray,
        np.dtype,
        *numpy_dtypes,
    ]


def allow_fairseq_checkpoints():
    torch.serialization.add_safe_globals(_checkpoint_globals())


def keep_last_batch():
    """fairseq drops the last batch of an epoch when its size is not a multiple of
    ``--required-batch-size-multiple`` (default 8): ``fairseq-generate`` silently translates
    fewer sentences than the test set holds, and BLEU is computed on what is left (fairseq
    issue #5036). Batches are consecutive slices of ``indices``, so the dropped one is the tail.
    """
    from fairseq.data import data_utils

    original = data_utils.batch_by_size
    if getattr(original, "keeps_last_batch", False):
        return

    @functools.wraps(original)
    def batch_by_size(indices, *args, **kwargs):
        if not isinstance(indices, np.ndarray):
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        batches = original(indices, *args, **kwargs)
        covered = sum(len(b) for b in batches)
        if covered < len(indices):
            batches = list(batches) + [indices[covered:]]
        return batches

    batch_by_size.keeps_last_batch = True
    data_utils.batch_by_size = batch_by_size


def ddp_on_cpu():
    """fairseq's ``--ddp-backend pytorch_ddp`` (its default, also called c10d) wraps the model in
    torch's DistributedDataParallel with ``device_ids=[device_id]`` even with ``--cpu``, which
    torch refuses for a CPU module ("device_ids and output_device arguments only work with
    single-device/multiple-device GPU modules"). CPU modules take no device ids: drop them.
    This is also what checks, on CPU, that every parameter receives a gradient (DDP fails on
    the next update otherwise, unless ``--find-unused-parameters``).
    """
    from fairseq.models import distributed_fairseq_model
    from torch.nn.parallel import DistributedDataParallel

    if getattr(distributed_fairseq_model.DistributedDataParallel, "cpu_aware", False):
        return

    class CpuAwareDistributedDataParallel(DistributedDataParallel):
        cpu_aware = True

        def __init__(self, module, device_ids=None, output_device=None, **kwargs):
            if all(p.device.type == "cpu" for p in module.parameters()):
                device_ids = output_device = None
            super().__init__(module, device_ids=device_ids, output_device=output_device, **kwargs)

    distributed_fairseq_model.DistributedDataParallel = CpuAwareDistributedDataParallel


def short_user_errors():
    """fairseq's CLI lets every exception end the program with its traceback: for a wrong flag
    or file the one line that matters is the last of ~30. Only :class:`PosencError` is shortened,
    also where fairseq re-raised it as its own (``Trainer.load_checkpoint`` turns any error of a
    load into "Cannot load model parameters ... ensure that the architectures match"); any other
    exception keeps its traceback."""
    previous = sys.excepthook
    if getattr(previous, "shortens_user_errors", False):
        return

    def excepthook(kind, value, traceback):
        uncaught = value is getattr(sys, "last_value", None) and sys.exc_info()[1] is None
        if not isinstance(value, PosencError) and isinstance(value.__context__, PosencError):
            value = value.__context__
        if isinstance(value, PosencError):
            print(f"{os.path.basename(sys.argv[0])}: error: {value}", file=sys.stderr)
            if uncaught:
                _exit_without_finalizing(1)
        else:
            previous(kind, value, traceback)

    excepthook.shortens_user_errors = True
    sys.excepthook = excepthook


def _exit_without_finalizing(status: int):
    """End the program after a refusal that fairseq's training loop raised: fairseq's batch
    prefetcher (``BufferedIterator``'s daemon thread) is then still in torch's C++ code, and at
    interpreter shutdown a daemon thread that asks for the GIL is ended by ``pthread_exit``, whose
    unwinding through a C++ frame that may not throw aborts the process ("terminate called without
    an active exception", status 134, issue 53). The exit functions run as at a normal exit (the
    process group's, logging's), then the process ends before the interpreter's teardown."""
    import atexit

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    atexit._run_exitfuncs()
    os._exit(status)


def _entries(path: str) -> str:
    try:
        state = torch.load(path, map_location="cpu")
    except Exception:
        return "it could not be read"
    if isinstance(state, dict):
        return "its entries are " + ", ".join(repr(k) for k in list(state)[:5])
    return f"it holds a {type(state).__name__}"


def clear_checkpoint_errors():
    """A truncated checkpoint stopped fairseq-generate with torch's zip-reader error, and a torch
    file that is not a fairseq checkpoint with ``KeyError: 'best_loss'``. Both now say which
    file is wrong and how (:class:`PosencError`)."""
    from fairseq import checkpoint_utils

    original = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(original, "clear_errors", False):
        return

    @functools.wraps(original)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        try:
            state = original(path, *args, **kwargs)
        except (RuntimeError, EOFError, OSError) as e:
            if not os.path.isfile(path):
                raise
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise PosencError(f"{path} is not a readable checkpoint (truncated or corrupted?): {first}") from e
        except (KeyError, AttributeError, TypeError) as e:
            raise PosencError(f"{path} is not a fairseq checkpoint: {_entries(path)}") from e
        if not isinstance(state, dict) or "model" not in state:
            raise PosencError(f"{path} is not a fairseq checkpoint: {_entries(path)}")
        return state

    load_checkpoint_to_cpu.clear_errors = True
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu


def _sizes(value, what: str) -> str:
    """(21, 21) -> "21 source and 21 target TOKENS"; 21 -> "21 TOKENS"."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return f"{int(value[0])} source and {int(value[1])} target {what}"
    return f"{value} {what}"


def clear_size_errors():
    """A sentence longer than the model takes stopped fairseq-generate (and fairseq-train) with a
    bare ``Exception`` and its traceback: "Size of sample #2 is invalid (=(np.int32(21),
    np.int32(21))) since max_positions=(12, 12), skip this example with
    --skip-invalid-size-inputs-valid-test". It now says the same in one line (:class:`PosencError`)."""
    from fairseq.tasks import FairseqTask

    original = FairseqTask.filter_indices_by_size
    if getattr(original, "clear_errors", False):
        return

    @functools.wraps(original)
    def filter_indices_by_size(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        try:
            return original(self, indices, dataset, max_positions, ignore_invalid_inputs)
        except Exception as e:
            found = re.match(r"Size of sample #(\d+) is invalid", str(e))
            if not found:
                raise
            index = int(found.group(1))
            raise PosencError(
                f"sentence {index} has {_sizes(dataset.size(index), 'tokens')}, more than the "
                f"{_sizes(max_positions, 'positions')} the model takes (--max-source-positions, "
                "--max-target-positions); skip such sentences with --skip-invalid-size-inputs-valid-test"
            ) from e

    filter_indices_by_size.clear_errors = True
    FairseqTask.filter_indices_by_size = filter_indices_by_size


def _xla_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch_xla") is not None


def _sections(cfg):
    """The parts of a fairseq config: omegaconf sections, and ``cfg.model``, which is an
    ``argparse.Namespace`` of every flag for models registered with ``add_args``."""
    if isinstance(cfg, argparse.Namespace):
        return [cfg]
    return [cfg[key] for key in cfg if cfg[key] is not None]


def clear_tpu_for_bf16(cfg, xla_available: bool) -> bool:
    """``tpu`` off in every section of ``cfg`` when bf16 put it there and no TPU can be used
    (True if it did). ``tpu`` in ``distributed_training``, ``optimizer`` and ``model`` is not an
    interpolation of ``common.tpu`` but a copy made when the flags became a config: clearing
    ``common`` alone leaves the DDP wrapper on torch_xla and skips inferring the init method."""
    common = cfg.common
    if xla_available or not (getattr(common, "bf16", False) and getattr(common, "tpu", False)):
        return False
    for section in _sections(cfg):
        if getattr(section, "tpu", False) is True:
            section.tpu = False
    return True


def bf16_without_tpu():
    """fairseq's ``options.py`` turns ``--bf16`` (and ``--memory-efficient-bf16``) into ``--tpu``
    (fairseq issue #4696): the trainer then asks torch_xla for its device and refuses CUDA
    (``'NoneType' object has no attribute 'xla_device'``), and with several processes the model
    is wrapped for TPUs (``No module named 'torch_xla'`` at the first gradient all-reduce) and
    the init method of torchrun, SLURM or one node's GPUs is never inferred. bf16 is a
    precision, not a device: where torch_xla is not installed (no TPU can be used), ``tpu`` is
    cleared before fairseq's ``call_main``, so bf16 trains on CUDA and, with ``--cpu``, on the
    CPU, as fp32 does. ``fairseq-validate``, ``-interactive`` and ``-eval-lm`` go through
    ``call_main`` too; ``fairseq-generate`` does not and never reads ``tpu``. The plugin is
    imported inside ``parse_args_and_arch``, before ``options.py`` sets ``tpu``, hence the patch
    at ``call_main``, which the CLIs look up at call time."""
    from fairseq.distributed import utils as distributed_utils

    original = distributed_utils.call_main
    if getattr(original, "bf16_without_tpu", False):
        return

    @functools.wraps(original)
    def call_main(cfg, main, **kwargs):
        if clear_tpu_for_bf16(cfg, _xla_available()):
            logging.getLogger(__name__).info("bf16 without torch_xla: --tpu cleared, training on %s",
                                             "the CPU" if cfg.common.cpu else "CUDA")
        return original(cfg, main, **kwargs)

    call_main.bf16_without_tpu = True
    distributed_utils.call_main = call_main


def _flag_hint(token: str, known, plugin: dict, training: bool, prog: str):
    """What to say of an unrecognized ``token`` (``--flag`` or ``--flag=value``): the plugin's flag
    it misspells or a plugin flag this parser lacks, and what selects it; None when it does not look
    like a plugin flag (its closest option is fairseq's, or none is close)."""
    flag = token.split("=", 1)[0]
    if flag in plugin:
        where = flag
    else:
        close = difflib.get_close_matches(flag, list(known) + list(plugin), n=1)
        if not close or close[0] not in plugin:
            return None
        where = close[0]
    if where in known:
        return f"did you mean {where}?"
    if training:
        said = f"{where} is an option of {plugin[where]}"
    else:
        said = (f"{where} is a training option (fairseq-train {plugin[where]}): {prog} takes the model's options "
                "from its checkpoint")
    return said if where == flag else f"did you mean {where}? {said}"


def one_line_flag_errors(plugin_flags):
    """argparse prints its parser's whole usage (fairseq-train's: about 200 lines) before the error
    line. Only the error line (argparse's exit status 2) for a bad value of one of the plugin's flags
    (``plugin_flags()``: {flag: what selects it}), and for an unrecognized flag that is one of them
    or whose closest option is one: with the flag meant, and where it is not in this parser, what
    selects it (fairseq-generate: it is a training option). fairseq's own flags keep argparse's
    output."""
    original = argparse.ArgumentParser.error
    if getattr(original, "posenc_one_line", False):
        return

    @functools.wraps(original)
    def error(self, message):
        plugin = plugin_flags()
        named = re.match(r"argument (--[\w-]+)", message)
        if named and named.group(1) in plugin:
            self.exit(2, f"{self.prog}: error: {message}\n")
        known = self._option_string_actions
        # fairseq's parsers only (they load the plugin: --user-dir), not another program's
        if message.startswith("unrecognized arguments: ") and "--user-dir" in known:
            # a training parser: fairseq-train's (fairseq-generate's has no --max-update)
            training = "--max-update" in known
            hints = [(token, _flag_hint(token, known, plugin, training, self.prog))
                     for token in message.split(": ", 1)[1].split() if token.startswith("--")]
            hints = [(token, hint) for token, hint in hints if hint]
            if len(hints) == 1:
                self.exit(2, f"{self.prog}: error: {message}; {hints[0][1]}\n")
            if hints:
                said = "; ".join(f"{token.split('=', 1)[0]}: {hint}" for token, hint in hints)
                self.exit(2, f"{self.prog}: error: {message}; {said}\n")
        original(self, message)

    error.posenc_one_line = True
    argparse.ArgumentParser.error = error


def apply():
    """Apply every fix; safe to call more than once."""
    global _applied
    if _applied:
        return
    allow_fairseq_checkpoints()
    keep_last_batch()
    ddp_on_cpu()
    short_user_errors()
    clear_checkpoint_errors()
    clear_size_errors()
    bf16_without_tpu()
    launchers_without_cuda()
    process_group_destroyed_at_exit()
    ema_averages_parameters()
    _applied = True


class _StateDictOf:
    """What fairseq's EMA step reads of the trained model: its state dict."""

    def __init__(self, state):
        self._state = state

    def state_dict(self):
        return self._state


def ema_averages_parameters():
    """fairseq's EMA (``--store-ema``) decays every entry of the trained model's state dict into
    the EMA model's in place (``ema_param.mul_(decay)``), version counters excepted. That fails on
    integer buffers ("result type Float can't be cast to the desired output type Long": the
    stacks' ``longest_trained``, ALiBi's ``encoder_form``), and its shape check fails on a kept
    result that grows (FLOATER's solution, solved for longer inputs as training meets them). Integer
    entries, and the settings saved with the weights (``_extra_state``: --position-bias-scale,
    --floater-lr-scale), are taken from the trained model as they are (fairseq's ``skip_keys``)
    instead of being averaged; kept results
    (``positions.kept.kept_result_keys``) are neither averaged nor copied: the EMA model keeps its
    own, solved for its own parameters when it is saved. Both state dicts of a step are read
    inside ``kept.not_saving()``, so that no kept result is recomputed for them at every update.
    Tested in tests/fairseq/test_ema.py (fairseq-train with --store-ema, every encoding)."""
    from fairseq.models.ema.ema import EMA

    original = EMA._step_internal
    if getattr(original, "ema_averages_parameters", False):
        return

    @functools.wraps(original)
    def _step_internal(self, new_model, updates=None):
        from .positions import kept

        with kept.not_saving():
            results = kept.kept_result_keys(new_model)
            state = {k: v for k, v in new_model.state_dict().items() if k not in results}
            taken = {k for k, v in state.items() if k.rsplit(".", 1)[-1] == "_extra_state"
                     or torch.is_tensor(v) and not v.is_floating_point()}
            self.skip_keys = set(self.skip_keys) | taken
            return original(self, _StateDictOf(state), updates)

    _step_internal.ema_averages_parameters = True
    EMA._step_internal = _step_internal


def process_group_destroyed_at_exit():
    """fairseq's ``distributed_main`` ends with a barrier and returns with the process group alive,
    and every rank exits when it likes. The rendezvous store is served from rank 0's process: when
    rank 0 left first, another rank's process could abort at exit ("terminate called without an
    active exception", after training had finished), which the launcher reports as a failed task
    (one run in three of a 4-task SLURM training failed so; 0 in 16 with this).
    At exit every rank destroys its process group, as torch asks, and rank 0 waits (60 s at most)
    until the others have, so it leaves last. For the launchers that run fairseq-train in the
    process (torchrun, SLURM tasks, one process); torch.multiprocessing's spawned workers end with
    ``os._exit`` and skip atexit."""
    import atexit
    import time

    import torch.distributed as dist

    def destroy():
        if not (dist.is_available() and dist.is_initialized()):
            return
        rank, world = dist.get_rank(), dist.get_world_size()
        store = dist.distributed_c10d._get_default_store() if world > 1 else None
        dist.destroy_process_group()
        if store is None:
            return
        # the TCP store lives in rank 0's process: it leaves last, once every other rank is done
        if rank != 0:
            store.add("fairseq_posenc_exited", 1)
            return
        deadline = time.monotonic() + 60
        while store.add("fairseq_posenc_exited", 0) < world - 1 and time.monotonic() < deadline:
            time.sleep(0.05)

    atexit.register(destroy)


def launchers_without_cuda():
    """fairseq finds its launcher (``distributed/utils.py``, ``infer_init_method``) assuming CUDA:
    under torchrun it takes the device as ``RANK % torch.cuda.device_count()`` (a
    ZeroDivisionError without a GPU), with several SLURM tasks a node it calls
    ``torch.cuda.set_device(SLURM_LOCALID)`` (a CPU build of torch has none to set), and with one
    task a node its world is nodes x 0 GPUs. Where torch sees no GPU: torchrun's ``LOCAL_RANK``
    is the device id, no CUDA device is set, and one task a node or a SLURM launch without
    ``--distributed-port`` is refused in one line. Where torch sees a GPU, fairseq's code runs
    unchanged. ``fairseq_cli/train.py``'s ``call_main`` looks the function up at call time."""
    from fairseq.distributed import utils as distributed_utils

    original = distributed_utils.infer_init_method
    if getattr(original, "without_cuda", False):
        return

    @functools.wraps(original)
    def infer_init_method(cfg, force_distributed=False):
        if (torch.cuda.device_count() > 0 or cfg.distributed_init_method is not None or cfg.tpu
                or cfg.pipeline_model_parallel or cfg.distributed_world_size == 1):
            return original(cfg, force_distributed)
        if all(key in os.environ for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")):
            cfg.distributed_init_method = "env://"
            cfg.distributed_world_size = int(os.environ["WORLD_SIZE"])
            cfg.distributed_rank = int(os.environ["RANK"])
            cfg.device_id = int(os.environ.get("LOCAL_RANK", "0"))
            cfg.distributed_no_spawn = True
            return None
        if distributed_utils._infer_slurm_init(cfg, None):
            if cfg.distributed_world_size < 1:
                raise PosencError("under SLURM with one task a node fairseq starts a process per GPU, and torch sees "
                                  "none: on the CPU start a task per process (srun --ntasks-per-node=P)")
            if cfg.distributed_port <= 0:
                raise PosencError("under SLURM the processes meet at --distributed-port on the first node: give "
                                  "the same port to every task")
            return None
        return original(cfg, force_distributed)

    infer_init_method.without_cuda = True
    distributed_utils.infer_init_method = infer_init_method

