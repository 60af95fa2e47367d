#!/usr/bin/env python
"""Speed and memory of every position encoding against fairseq's stock transformer, on the
batches fairseq builds, measured in one run and reported as ratios.

    python scripts/benchmark.py --quick                 # a few minutes on 2 CPU cores
    python scripts/benchmark.py --threads 1             # the default table: medium model, d=256

The batches are fairseq's own: a toy corpus of varied lengths (recipes/posenc_workflow/toy_data.py's
reordering pair, --corpus-lengths words a sentence) is binarized by fairseq-preprocess and batched
by fairseq's translation task (``get_batch_iterator``, which calls the dataset's
``batch_by_size``): sources left-padded, targets right-padded, as ``fairseq-train`` and
``fairseq-generate`` see them. --data uses a binarized corpus of your own instead.

Training update = fairseq's label-smoothed cross-entropy (0.1), backward and an Adam step on each
of --train-batches batches of --max-tokens tokens (one column per value; with --update-freq N,
updates of N passes, announced to the models as fairseq's trainer does, so that FLOATER solves
once per update). Decoding = fairseq's SequenceGenerator with its incremental state, the models
prepared as fairseq-generate prepares them (``prepare_for_inference_``), on --decode-batches
batches of --decode-batch-size sentences of the test split, greedy and beam 4 (--beams), each
batch forced to the length of its longest reference so that every model decodes the same number
of steps.

Timing: --rounds rounds; in each, every model runs the same work once, in an order shuffled
afresh each round (a fixed order lets drift on a shared machine favour the models that run
first), after one untimed round to warm up. A ratio is the median over the rounds of the ratio
of two models' times within one round. Memory is the peak growth of torch's allocations during
one training update on the largest batch (the profiler's record on CPU, the allocator's on a GPU).
On a GPU the timings are repeated in bf16 and fp16.

--profile-step ENC [ENC ...] profiles one greedy decoding step (as fairseq's generator runs it:
the decoder's incremental forward, the normalisation and the search) of stock fairseq and of
each named encoding: torch's operators and Python's function calls in that step, counts that do
not depend on the machine's load.
"""
import argparse
import copy
import cProfile
import glob
import itertools
import json
import logging
import math
import os
import pstats
import random
import shutil
import statistics
import subprocess
import sys
import time
import warnings

import torch

# before fairseq's import configures the root logger at INFO (fairseq/tasks/text_to_speech.py)
logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
from fairseq import options, tasks  # noqa: E402
from fairseq import utils as fairseq_utils  # noqa: E402
from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # noqa: E402
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion  # noqa: E402
from fairseq.sequence_generator import SequenceGenerator  # noqa: E402
from fairseq.tasks.translation import TranslationTask  # noqa: E402

from fairseq_posenc.models.from_flags import MODEL_SIZES, build_from_flags, size_flags  # noqa: E402
from fairseq_posenc.positions import POSITION_ENCODINGS  # noqa: E402
from fairseq_posenc.update_hooks import announce_update, finish_update  # noqa: E402
from posenc_workflow import pipeline, toy_data  # noqa: E402
from posenc_workflow.length_bins import write_text_atomically  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "fairseq_posenc")
STOCK = "stock transformer"
REFERENCE = "sinusoidal"
PARTS = ("train", "decode", "memory")
MAX_POSITIONS = 1024


def toy_data_bin(out_dir: str, vocab: int, lengths, sentences: int, seed: int = 1) -> str:
    """A binarized toy corpus (reordering pair, ``sentences`` training pairs and a tenth as many
    test pairs of ``lengths`` = (min, max) words), written once per setting under ``out_dir``."""
    lo, hi = lengths
    name = f"toy-reorder-v{vocab}-len{lo}-{hi}-n{sentences}-seed{seed}"
    dest = os.path.join(out_dir, name, "bin")
    if os.path.exists(os.path.join(dest, "test.src-tgt.src.bin")):
        return dest
    splits = {"train": (sentences, lo, hi), "valid": (max(sentences // 20, 8), lo, hi),
              "test": (max(sentences // 10, 8), lo, hi)}
    prefixes = toy_data.write_toy_corpus(os.path.join(out_dir, name, "raw"), splits, vocab_size=vocab, seed=seed,
                                         pair="reorder")
    print(f"| binarizing the toy corpus into {dest}", flush=True)
    return pipeline.preprocess(prefixes, dest)


def translation_task(data_bin: str) -> TranslationTask:
    """fairseq's translation task on ``data_bin`` as fairseq-train sets it up (its defaults:
    left-padded sources), with the train and test splits loaded."""
    src, tgt = _languages(data_bin)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        data_bin, "--task", "translation", "--arch", "transformer", "--source-lang", src, "--target-lang", tgt,
        "--max-source-positions", str(MAX_POSITIONS), "--max-target-positions", str(MAX_POSITIONS)])
    task = tasks.setup_task(args)
    for split in ("train", "test"):
        task.load_dataset(split)
    return task


def _languages(data_bin: str):
    for name in sorted(os.listdir(data_bin)):
        parts = name.split(".")  # test.SRC-TGT.SRC.bin
        if name.startswith("test.") and name.endswith(".bin") and "-" in parts[1]:
            return tuple(parts[1].split("-"))
    raise FileNotFoundError(f"no test split (test.SRC-TGT.SRC.bin) in {data_bin}")


def fairseq_batches(task, split: str, count: int, max_tokens=None, max_sentences=None, shuffle=True, seed=1,
                    only_padded=False):
    """``count`` batches of ``split`` as fairseq's trainer (``shuffle``: the batches of an epoch in
    a random order, the first ``count``) or fairseq-generate (in order of length: ``count`` spread
    evenly over it) draws them: the task's batch iterator, which builds them with the dataset's
    ``batch_by_size`` (required batch size multiple 8, fairseq's default). ``only_padded``: of
    those, only batches with a left-padded source."""
    dataset = task.dataset(split)
    iterator = task.get_batch_iterator(
        dataset=dataset, max_tokens=max_tokens, max_sentences=max_sentences,
        max_positions=fairseq_utils.resolve_max_positions(task.max_positions(), (MAX_POSITIONS, MAX_POSITIONS)),
        ignore_invalid_inputs=True, required_batch_size_multiple=8, seed=seed, disable_iterator_cache=True,
    )
    with warnings.catch_warnings():  # pin_memory without an accelerator
        warnings.simplefilter("ignore")
        iterator = iterator.next_epoch_itr(shuffle=shuffle)
    if only_padded:
        pad = task.source_dictionary.pad()
        iterator = (b for b in iterator if b["net_input"]["src_tokens"][:, 0].eq(pad).any())
    batches = list(iterator) if not shuffle else list(itertools.islice(iterator, count))
    if not shuffle:  # evenly over the lengths
        step = len(batches) / count
        batches = [batches[int(i * step + step / 2)] for i in range(min(count, len(batches)))]
    if len(batches) < count:
        raise SystemExit(f"{split} has only {len(batches)} such batches; {count} are needed")
    return batches


def describe(batches, pad: int = 1) -> str:
    sizes = [b["net_input"]["src_tokens"].shape for b in batches]
    padded = sum(int(b["net_input"]["src_tokens"][:, 0].eq(pad).any()) for b in batches)
    return (f"{len(batches)} batches of {min(s[0] for s in sizes)}-{max(s[0] for s in sizes)} sentences, sources of "
            f"{min(s[1] for s in sizes)}-{max(s[1] for s in sizes)} tokens, {padded} with left-padded sources")


def to_device(sample, device):
    return fairseq_utils.move_to_cuda(sample, device) if device.type == "cuda" else sample


def build(name, size, task, extra=()):
    flags = size_flags(size) + ["--share-all-embeddings", "--dropout", "0.1"]
    if name == STOCK:
        return build_from_flags("transformer", flags, task, MAX_POSITIONS)
    encoding, *spec = name.split(":")
    flags += ["--position-encoding", encoding] + [f for s in spec for f in s.split("=", 1)]
    return build_from_flags("transformer_posenc", flags + list(extra), task, MAX_POSITIONS)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_update(model, criterion, optimizer, samples, dtype, device):
    """One optimizer update of ``len(samples)`` forward/backward passes (fairseq's --update-freq),
    announced to the model as fairseq's trainer does."""
    optimizer.zero_grad(set_to_none=True)
    announce_update(model, len(samples))
    for sample in samples:
        with torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss, _, _ = criterion(model, sample)
        loss.backward()
    finish_update(model)
    optimizer.step()


def for_inference(model, task):
    """A copy of ``model`` prepared as fairseq-generate prepares it, from fairseq-generate's default
    configuration (``prepare_for_inference_``: no attention weights without --print-alignment, the
    beamable encoder-decoder attention); fairseq refuses to train a model after that."""
    with warnings.catch_warnings():  # hydra's deprecation notices, on every call
        warnings.simplefilter("ignore")
        cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_generation_parser(),
                                                                         [task.cfg.data]))
    model = copy.deepcopy(model)
    model.prepare_for_inference_(cfg)
    return model


def decode(model, task, samples, beam, device, dtype):
    """fairseq's beam search (``beam`` 1: greedy) over ``samples``, each forced to the length of its
    longest reference; returns the hypotheses. ``model``: see :func:`for_inference`."""
    hypotheses = []
    with torch.no_grad(), torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype != torch.float32):
        for sample in samples:
            steps = sample["target"].size(1) - 1  # words of the longest reference, </s> follows
            generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=0,
                                          max_len_b=steps, min_len=steps)
            hypotheses.append(generator.forward(sample))
    return hypotheses


def interleaved_rounds(fns, rounds, device, seed=0, on_round=None, clock=time.perf_counter):
    """{name: [seconds of each round]}: one untimed round to warm up, then ``rounds`` rounds in
    each of which every callable runs once, in an order shuffled afresh (seeded) each round,
    timed by ``clock``."""
    names = list(fns)
    for name in names:
        fns[name]()
    rng = random.Random(seed)
    times = {name: [] for name in names}
    for r in range(rounds):
        order = names[:]
        rng.shuffle(order)
        for name in order:
            sync(device)
            start = clock()
            fns[name]()
            sync(device)
            times[name].append(clock() - start)
        if on_round:
            on_round(r, times)
    return times


def clock_of(name: str, device):
    """``wall``: time.perf_counter; ``cpu``: the process's CPU time (time.process_time), which on a
    shared machine leaves out the time the process waits for a core (with several torch threads
    it sums theirs; on a GPU it misses the device's time, so wall is used there)."""
    return time.process_time if name == "cpu" and device.type == "cpu" else time.perf_counter


def median_ratio(times, name, reference):
    """The median over the rounds of ``name``'s time over ``reference``'s in the same round."""
    if reference not in times:
        return None
    return statistics.median(a / b for a, b in zip(times[name], times[reference]))


def fmt_ratio(value):
    return "-" if value is None else f"{value:.3f}x"


def main_table(args, device):
    dtypes = [torch.float32] + ([torch.bfloat16, torch.float16] if device.type == "cuda" else [])
    task = translation_task(args.data or toy_data_bin(args.output_dir, args.vocab, args.corpus_lengths,
                                                      args.corpus_sentences))
    names = [STOCK] + list(args.encodings)
    models = {name: build(name, args.size, task).to(device) for name in names}
    criterion = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-5) for name, m in models.items()}
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    print(f"| {device.type}, {torch.get_num_threads()} threads, size {args.size} {MODEL_SIZES[args.size]}, "
          f"{args.rounds} rounds, models: {', '.join(names)}", flush=True)

    results = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "threads": torch.get_num_threads(), "size": args.size, "rounds": args.rounds,
               "config": dict(zip(("layers", "dim", "ffn", "heads"), MODEL_SIZES[args.size])),
               "parameters": params, "train": [], "decode": [], "memory_mib": {}}
    train_sets = {}
    for max_tokens in args.max_tokens:
        batches = fairseq_batches(task, "train", args.train_batches * max(args.update_freq), max_tokens=max_tokens,
                                  seed=args.seed, only_padded=args.only_padded)
        train_sets[max_tokens] = [to_device(b, device) for b in batches]
        print(f"| train, --max-tokens {max_tokens}: {describe(batches)}", flush=True)
    decode_set = [to_device(b, device) for b in fairseq_batches(
        task, "test", args.decode_batches, max_sentences=args.decode_batch_size, shuffle=False,
        only_padded=args.only_padded)]
    print(f"| decode, --batch-size {args.decode_batch_size}: {describe(decode_set)}", flush=True)

    for dtype in dtypes:
        dname = str(dtype).replace("torch.", "")
        for passes, max_tokens in itertools.product(args.update_freq, args.max_tokens if "train" in args.parts else []):
            batches = train_sets[max_tokens]
            updates = [batches[i:i + passes] for i in range(0, passes * args.train_batches, passes)]
            for m in models.values():
                m.train()

            def train(name):
                for samples in updates:
                    train_update(models[name], criterion, optimizers[name], samples, dtype, device)

            times = interleaved_rounds({n: (lambda n=n: train(n)) for n in names}, args.rounds, device, args.seed,
                                       clock=clock_of(args.clock, device))
            results["train"].append({"dtype": dname, "max_tokens": max_tokens, "update_freq": passes,
                                     "updates": len(updates), "seconds": times})
            print(f"| train {dname} --max-tokens {max_tokens} --update-freq {passes}: " + ", ".join(
                f"{n} {1000 * statistics.median(t) / len(updates):.1f} ms/update" for n, t in times.items()),
                flush=True)
        inference = {name: for_inference(m, task) for name, m in models.items()}
        for beam in args.beams if "decode" in args.parts else []:
            times = interleaved_rounds(
                {n: (lambda n=n: decode(inference[n], task, decode_set, beam, device, dtype)) for n in names},
                args.rounds, device, args.seed, clock=clock_of(args.clock, device))
            sentences = sum(b["nsentences"] for b in decode_set)
            results["decode"].append({"dtype": dname, "beam": beam, "sentences": sentences, "seconds": times})
            print(f"| decode {dname} beam {beam}: " + ", ".join(
                f"{n} {sentences / statistics.median(t):.1f} sent/s" for n, t in times.items()), flush=True)
    if "memory" in args.parts:
        largest = max(train_sets[max(args.max_tokens)], key=lambda b: b["net_input"]["src_tokens"].numel())
        for name in names:
            models[name].train()
            results["memory_mib"][name] = round(
                peak_memory_mb(models[name], criterion, optimizers[name], largest, device), 1)
        print(f"| peak memory growth of a training update on the largest batch: " + ", ".join(
            f"{n} {v:.0f} MiB" for n, v in results["memory_mib"].items()), flush=True)
    print_table(results, names)
    return results


def peak_memory_mb(model, criterion, optimizer, sample, device):
    """Peak growth of memory allocated by torch during one (warm) training update, in MiB."""
    train_update(model, criterion, optimizer, [sample], torch.float32, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        train_update(model, criterion, optimizer, [sample], torch.float32, device)
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    # On CPU torch keeps no allocator statistics: replay the profiler's allocation events.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        train_update(model, criterion, optimizer, [sample], torch.float32, device)
    current = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        current += event.self_cpu_memory_usage
        peak = max(peak, current)
    return peak / 2**20


def print_table(results, names):
    """One row per model: median per-round ratios to the stock transformer and to the plugin's
    sinusoidal."""
    columns = [(f"train {r['max_tokens']} tok" + (f" x{r['update_freq']}" if r["update_freq"] > 1 else ""), r)
               for r in results["train"] if r["dtype"] == "float32"]
    columns += [("decode " + ("greedy" if r["beam"] == 1 else f"beam {r['beam']}"), r)
                for r in results["decode"] if r["dtype"] == "float32"]
    header = ["model", "params"] + [c for c, _ in columns] + (["memory"] if results["memory_mib"] else [])
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for name in names:
        cells = [name, f"{results['parameters'][name] / 1e6:.2f}M"]
        for _, r in columns:
            cells.append(f"{fmt_ratio(median_ratio(r['seconds'], name, STOCK))} / "
                         f"{fmt_ratio(median_ratio(r['seconds'], name, REFERENCE))}")
        if results["memory_mib"]:
            mem = results["memory_mib"]
            cells.append(f"{mem[name]:.0f} MiB ({mem[name] / mem[STOCK]:.3f}x)")
        print("| " + " | ".join(cells) + " |")
    print("\nratios: the median over the rounds of time / stock transformer's / the plugin's sinusoidal's in the "
          "same round (lower is faster)")


def floater_solve_times(sizes, lengths, repeats):
    """Seconds of one FLOATER solve + backward (rk4, step dt / 5) for each named model size (its
    width, and 3 states per self-attention block) and length: torchdiffeq's odeint through
    autograd (what FLOATER ran before its own solver) against FLOATER's rk4 with the hand-written
    backward, its step loops in Python and (where `make install` built them) in C++, in
    interleaved rounds in one run; the fastest round of each."""
    from torchdiffeq import odeint

    from fairseq_posenc.positions.floater import loops as floater_loops
    from fairseq_posenc.positions.floater import FloaterODE

    rows = []
    for size, length in itertools.product(sizes, lengths):
        layers, dim = MODEL_SIZES[size][:2]
        torch.manual_seed(0)
        ode = FloaterODE(6 * layers, dim, dim, dt=0.1, solver="rk4", step=None, adjoint=False)
        times = torch.arange(length, dtype=torch.float32) * ode.dt

        def torchdiffeq():
            odeint(ode.dynamics.float32(), ode.initial, times, method="rk4",
                   options={"step_size": ode.step}).pow(2).sum().backward()

        def fast(compiled):
            def run():
                floater_loops.USE_COMPILED = compiled
                try:
                    ode._solve(ode.initial, 0, length).pow(2).sum().backward()
                finally:
                    floater_loops.USE_COMPILED = True
            return run

        fns = {"torchdiffeq": torchdiffeq, "python loops": fast(False)}
        if floater_loops.compiled_loops(ode.initial) is not None:
            fns["C++ loops"] = fast(True)
        secs = {name: min(t) for name, t in interleaved_rounds(fns, repeats, torch.device("cpu")).items()}
        rows.append({"size": size, "dim": dim, "states": 6 * layers, "positions": length, "seconds": secs})
        print(f"| FLOATER solve + backward, d={dim}, {6 * layers} states, {length} positions: " + ", ".join(
            f"{name} {s:.3f} s ({s / secs['torchdiffeq']:.3f}x)" for name, s in secs.items()), flush=True)
    return rows


def schedule_times(args, device):
    """Seconds per training update of sinusoidal and of FLOATER with each --floater-solve-every
    N, on fairseq's batches of each --max-tokens: per round, every model runs a block of
    consecutive updates, a multiple of every N long (each block holds the same share of solving
    updates as a long run), on the same batches, in a shuffled order; the ratio is the median over
    the rounds of the ratio of the blocks' times."""
    everies = args.floater_solve_every
    block = args.schedule_block or math.lcm(*everies)
    if any(block % n for n in everies):
        raise SystemExit(f"--schedule-block {block} is not a multiple of every --floater-solve-every")
    task = translation_task(args.data or toy_data_bin(args.output_dir, args.vocab, args.corpus_lengths,
                                                      args.corpus_sentences))
    criterion = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    names = [REFERENCE] + [f"floater N={n}" for n in everies]
    extra = {REFERENCE: ()} | {f"floater N={n}": ("--floater-solve-every", str(n)) for n in everies}
    results = []
    passes = args.update_freq[0]
    for max_tokens in args.max_tokens:
        models = {name: build("floater" if name != REFERENCE else REFERENCE, args.size, task, extra[name]).to(device)
                  for name in names}
        optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-5) for name, m in models.items()}
        batches = [to_device(b, device) for b in
                   fairseq_batches(task, "train", block * passes, max_tokens=max_tokens, seed=args.seed,
                                   only_padded=args.only_padded)]
        print(f"| {device.type}, {torch.get_num_threads()} threads, size {args.size} {MODEL_SIZES[args.size]}, "
              f"--max-tokens {max_tokens} ({describe(batches)}), update-freq {passes}, {args.rounds} rounds of a "
              f"block of {block} updates per model", flush=True)
        updates = [batches[i:i + passes] for i in range(0, len(batches), passes)]

        def run(name):
            models[name].train()
            for samples in updates:
                train_update(models[name], criterion, optimizers[name], samples, torch.float32, device)

        def progress(r, times):
            print(f"| round {r + 1}: " + ", ".join(f"{n} {1000 * t[-1] / block:.1f}" for n, t in times.items())
                  + " ms / update", flush=True)

        times = interleaved_rounds({n: (lambda n=n: run(n)) for n in names}, args.rounds, device, args.seed, progress,
                                   clock_of(args.clock, device))
        print(f"\n| model | ms / update, median block of {block} | / {REFERENCE}, median of rounds | per round |"
              "\n|---|---|---|---|")
        for name in names:
            per_round = ", ".join(f"{a / b:.3f}" for a, b in zip(times[name], times[REFERENCE]))
            print(f"| {name} | {1000 * statistics.median(times[name]) / block:.1f} | "
                  f"{fmt_ratio(median_ratio(times, name, REFERENCE))} | {per_round} |")
        print()
        results.append({"size": args.size, "max_tokens": max_tokens, "update_freq": passes, "block": block,
                        "threads": torch.get_num_threads(), "seconds_per_block": times})
    return results


def profile_step(args, device):
    """torch's operators and Python's calls in one greedy decoding step (--profile-at) of fairseq's
    generator, for stock fairseq and each encoding: the step from one call of the decoder to the
    next (the incremental forward, the normalisation, the search and the reordering of the
    incremental state). Prints the operators whose counts differ from stock fairseq's and the
    plugin's own Python functions in the step."""
    task = translation_task(args.data or toy_data_bin(args.output_dir, args.vocab, args.corpus_lengths,
                                                      args.corpus_sentences))
    sample = to_device(fairseq_batches(task, "test", 1, max_sentences=args.decode_batch_size, shuffle=False,
                                       only_padded=args.only_padded)[0], device)
    print(f"| profile of decoding step {args.profile_at} (greedy), {describe([sample])}, size {args.size}, "
          f"{torch.get_num_threads()} threads", flush=True)
    results, counts = {}, {}
    for name in [STOCK] + list(args.profile_step):
        model = for_inference(build(name, args.size, task).to(device), task)
        ops, calls = _profile_one_step(model, task, sample, args.profile_at)
        counts[name] = {e.key: e.count for e in ops.key_averages()}
        own = sorted(((f"{os.path.relpath(f, REPO)}:{line}({fn})", nc, ct) for (f, line, fn), (_, nc, _, ct, _)
                      in calls.stats.items() if f.startswith(PACKAGE)), key=lambda r: -r[2])
        results[name] = {"operators": sum(counts[name].values()), "python_calls": calls.total_calls,
                         "operator_counts": counts[name],
                         "plugin_functions": [{"function": f, "calls": nc, "cumulative_s": ct} for f, nc, ct in own]}
        print(f"\n## {name}: {results[name]['operators']} operator calls, {calls.total_calls} Python function calls "
              "in one step", flush=True)
        if args.profile_rows:
            print(ops.key_averages().table(sort_by="count", row_limit=args.profile_rows, max_name_column_width=40))
        if name == STOCK:
            continue
        diff = sorted((k for k in set(counts[name]) | set(counts[STOCK])
                       if counts[name].get(k, 0) != counts[STOCK].get(k, 0)),
                      key=lambda k: (-abs(counts[name].get(k, 0) - counts[STOCK].get(k, 0)), k))
        print(f"\n| operator | {STOCK} | {name} |\n|---|---|---|")
        for key in diff:
            print(f"| {key} | {counts[STOCK].get(key, 0)} | {counts[name].get(key, 0)} |")
        if own:
            print(f"\n| the plugin's function | calls | cumulative ms |\n|---|---|---|")
            for function, nc, ct in own[:args.profile_functions]:
                print(f"| {function} | {nc} | {1000 * ct:.3f} |")
    return results


def _step_window(model, task, sample, at, steps, start, stop, beam=1):
    """Decode ``sample`` (beam search, ``beam`` 1: greedy) twice, the first to warm up (it builds the
    kept tables), and call ``start()`` as the second reaches decoding step ``at`` and ``stop()`` as
    it reaches step ``at + steps``: the window holds ``steps`` whole steps of fairseq's generator,
    from one call of the decoder to the next."""
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=0,
                                  max_len_b=at + steps + 1, min_len=at + steps + 1)
    forward_decoder = generator.model.forward_decoder
    calls = [None]

    def wrapped(*a, **kw):
        if calls[0] == at + steps:
            stop()
        if calls[0] == at:
            start()
        if calls[0] is not None:
            calls[0] += 1
        return forward_decoder(*a, **kw)

    generator.model.forward_decoder = wrapped
    with torch.no_grad():
        generator.forward(sample)
        calls[0] = 0
        generator.forward(sample)


def _profile_one_step(model, task, sample, at):
    ops = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    python = cProfile.Profile()

    def start():
        ops.start()
        python.enable()

    def stop():
        python.disable()
        ops.stop()

    _step_window(model, task, sample, at, 1, start, stop)
    return ops, pstats.Stats(python, stream=sys.stdout)


def callgrind_steps(args, device):
    """Instructions of --callgrind-steps decoding steps (greedy, or --beams' first) from step
    --profile-at of stock fairseq and each --profile-step encoding, counted by callgrind: the script
    runs under ``valgrind --tool=callgrind --instr-atstart=no`` and switches the instrumentation on
    and off around the steps (callgrind_control), then dumps each model's count. A count of
    instructions does not depend on the machine's load."""
    if not shutil.which("callgrind_control"):
        raise SystemExit("--callgrind-steps needs valgrind's callgrind_control on the PATH")
    task = translation_task(args.data or toy_data_bin(args.output_dir, args.vocab, args.corpus_lengths,
                                                      args.corpus_sentences))
    sample = to_device(fairseq_batches(task, "test", 1, max_sentences=args.decode_batch_size, shuffle=False,
                                       only_padded=args.only_padded)[0], device)
    beam = args.beams[0]
    print(f"| callgrind: {args.callgrind_steps} decoding steps from step {args.profile_at}, beam {beam}, "
          f"{describe([sample])}, size {args.size}, {torch.get_num_threads()} threads", flush=True)

    def control(*flags):
        subprocess.run(["callgrind_control", *flags, str(os.getpid())], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    counts = {}
    for name in [STOCK] + list(args.profile_step):
        model = for_inference(build(name, args.size, task).to(device), task)
        control("--zero")
        _step_window(model, task, sample, args.profile_at, args.callgrind_steps,
                     lambda: control("--instr=on"), lambda: control("--instr=off"), beam)
        before = set(glob.glob(f"callgrind.out.{os.getpid()}*"))
        control(f"--dump={name}")
        dumped = set(glob.glob(f"callgrind.out.{os.getpid()}*")) - before
        if len(dumped) != 1:
            raise SystemExit("run the script under valgrind --tool=callgrind --instr-atstart=no, from the directory "
                             "callgrind writes its dumps to (the default callgrind.out.<pid>)")
        with open(dumped.pop()) as f:
            counts[name] = next(int(line.split()[1]) for line in f if line.startswith("totals:"))
        print(f"| {name}: {counts[name]:,} instructions ({counts[name] / counts[STOCK]:.4f}x stock fairseq)", flush=True)
    return {"beam": beam, "steps": args.callgrind_steps, "at": args.profile_at, "instructions": counts}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small model, --max-tokens 512, 3 rounds: a few minutes on 2 cores")
    parser.add_argument("--size", choices=list(MODEL_SIZES), default="medium",
                        help="model size, all models the same (layers, d, ffn, heads: see MODEL_SIZES)")
    parser.add_argument("--encodings", nargs="+", default=list(POSITION_ENCODINGS), metavar="ENC",
                        help="encodings to time, ENC or ENC:--flag=value (default: every registered one)")
    parser.add_argument("--data", help="a fairseq-preprocess directory of your own (train and test splits) "
                        "instead of the toy corpus")
    parser.add_argument("--corpus-lengths", type=int, nargs=2, default=[2, 60], metavar=("MIN", "MAX"),
                        help="words a sentence of the toy corpus, uniformly")
    parser.add_argument("--corpus-sentences", type=int, default=20000,
                        help="training pairs of the toy corpus (its test split: a tenth as many)")
    parser.add_argument("--vocab", type=int, default=1000, help="words of each language of the toy corpus")
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[1024, 4096],
                        help="tokens a training batch (fairseq's --max-tokens): one column each")
    parser.add_argument("--train-batches", type=int, default=4, help="training updates timed per model and round")
    parser.add_argument("--update-freq", type=int, nargs="+", default=[1],
                        help="passes per optimizer update (fairseq's --update-freq); each is timed as one update")
    parser.add_argument("--only-padded", action="store_true",
                        help="time only batches with a left-padded source (fairseq pads a batch whose sentences "
                        "differ in length; a scheme may take a per-sentence path for them)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (the median ratio counts)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="wall",
                        help="wall: elapsed time; cpu: the process's CPU time, which on a shared machine leaves out "
                        "the time it waits for a core (with several torch threads, their sum; wall on a GPU)")
    parser.add_argument("--seed", type=int, default=1, help="the batches' shuffle and the order of each round")
    parser.add_argument("--decode-batch-size", type=int, default=16,
                        help="sentences a decoding batch (fairseq-generate's --batch-size)")
    parser.add_argument("--decode-batches", type=int, default=4,
                        help="decoding batches timed per model and round, spread over the test split's lengths")
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4], help="beam sizes to decode with (1: greedy)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="what the default table measures: training updates, decoding, peak memory")
    parser.add_argument("--threads", type=int, default=None, help="torch threads on CPU (default: torch's)")
    parser.add_argument("--floater-solve", nargs="*", choices=list(MODEL_SIZES), metavar="SIZE",
                        help="only time one FLOATER ODE solve + backward at these model sizes (default: medium "
                             "base) for each of --lengths: torchdiffeq against FLOATER's rk4, its loops in "
                             "Python and in C++")
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512],
                        help="positions of each solve with --floater-solve")
    parser.add_argument("--floater-solve-every", type=int, nargs="+", metavar="N",
                        help="only time training updates of sinusoidal and of FLOATER with each of these "
                             "--floater-solve-every, at each --max-tokens and the first --update-freq: blocks of "
                             "consecutive updates, the median ratio over --rounds")
    parser.add_argument("--schedule-block", type=int, default=None,
                        help="updates per timed block with --floater-solve-every (default: their least common "
                             "multiple)")
    parser.add_argument("--profile-step", nargs="+", metavar="ENC",
                        help="only profile one greedy decoding step of stock fairseq and of these encodings: "
                             "torch's operators and Python's function calls")
    parser.add_argument("--profile-at", type=int, default=16, help="the decoding step --profile-step profiles")
    parser.add_argument("--callgrind-steps", type=int, default=None, metavar="K",
                        help="with --profile-step, under valgrind --tool=callgrind --instr-atstart=no: count the "
                             "instructions of K decoding steps (beam: the first of --beams) of each model instead")
    parser.add_argument("--profile-rows", type=int, default=0,
                        help="also print torch's table of each model's operators, this many rows (by count)")
    parser.add_argument("--profile-functions", type=int, default=15,
                        help="rows of the plugin's Python functions in the step (by cumulative time)")
    parser.add_argument("--output-dir", default="benchmark_output",
                        help="where the toy corpus is kept and the JSON written")
    parser.add_argument("--output", default=None, help="the JSON (default: OUTPUT_DIR/benchmark.json)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    unknown = [e for e in args.encodings + (args.profile_step or []) if e.split(":")[0] not in POSITION_ENCODINGS]
    if unknown:
        parser.error(f"unknown encodings {', '.join(unknown)}; choose from {', '.join(POSITION_ENCODINGS)}")
    if args.callgrind_steps and not args.profile_step:
        parser.error("--callgrind-steps counts the steps of the --profile-step models: name them")
    if args.quick:
        args.size, args.max_tokens, args.rounds, args.train_batches, args.decode_batches = "small", [512], 3, 2, 2
        args.decode_batch_size = 8
    output = args.output or os.path.join(args.output_dir, "benchmark.json")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.floater_solve is not None:
        print(f"| cpu, {torch.get_num_threads()} threads, {args.rounds} rounds", flush=True)
        result = {"floater_solve": floater_solve_times(args.floater_solve or ["medium", "base"], args.lengths,
                                                       args.rounds)}
    elif args.floater_solve_every:
        result = {"floater_solve_every": schedule_times(args, device)}
    elif args.profile_step and args.callgrind_steps:
        result = {"callgrind_steps": callgrind_steps(args, device)}
    elif args.profile_step:
        result = {"profile_step": profile_step(args, device)}
    else:
        result = main_table(args, device)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    write_text_atomically(output, json.dumps(result, indent=2) + "\n")
    print(f"| wrote {output}")


if __name__ == "__main__":
    main()
