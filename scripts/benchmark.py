#!/usr/bin/env python
"""Speed and memory of every position encoding against fairseq's stock transformer, measured in
one run on the same data shapes, reported as ratios.

    python scripts/benchmark.py --quick                 # < 2 minutes on 2 CPU cores
    python scripts/benchmark.py --size base --lengths 32 128 512 --batch-sizes 8 32

Training step = forward + backward + Adam step on random token batches (source and target of the
same length); with --update-freq N, one update of N forward/backward passes, announced to the
models as fairseq's trainer does (FLOATER then solves its ODE once per update). Decoding = fairseq's beam search (beam 4) forced to a fixed output length, so that
every model does the same work. Timings are the fastest of --repeats runs, taken round-robin
across the models so that machine noise hits them alike. Memory is the peak growth of torch's allocations
during one training step at the largest shape (the profiler's record on CPU, the allocator's on
a GPU).
On a GPU the timings are repeated in bf16 and fp16.
"""
import argparse
import itertools
import json
import logging
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

# before fairseq's import configures the root logger at INFO (fairseq/tasks/text_to_speech.py)
logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fairseq.data import Dictionary  # noqa: E402
from fairseq.sequence_generator import SequenceGenerator  # noqa: E402

from fairseq_posenc.length_bins import write_text_atomically  # noqa: E402
from fairseq_posenc.models.from_flags import MODEL_SIZES, build_from_flags, size_flags  # noqa: E402
from fairseq_posenc.positions import POSITION_ENCODINGS  # noqa: E402
from fairseq_posenc.update_hooks import announce_update, finish_update  # noqa: E402

STOCK = "stock transformer"


class _Task:
    def __init__(self, vocab):
        d = Dictionary()
        for i in range(vocab):
            d.add_symbol(f"w{i}")
        self.source_dictionary = self.target_dictionary = d


def build(name, size, task, max_positions, extra=()):
    flags = size_flags(size) + ["--share-all-embeddings", "--dropout", "0.1"]
    if name == STOCK:
        return build_from_flags("transformer", flags, task, max_positions)
    return build_from_flags("transformer_posenc", flags + ["--position-encoding", name, *extra], task, max_positions)


def batch(task, bsz, length, device, seed=0):
    d = task.source_dictionary
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(d.nspecial, len(d), (bsz, length), generator=g)
    src[:, -1] = d.eos()
    tgt = torch.randint(d.nspecial, len(d), (bsz, length), generator=g)
    prev = torch.cat([torch.full((bsz, 1), d.eos()), tgt[:, :-1]], dim=1)
    return src.to(device), torch.full((bsz,), length, device=device), prev.to(device), tgt.to(device)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_step(model, optimizer, data, dtype, passes=1):
    """One optimizer update of ``passes`` forward/backward passes (fairseq's --update-freq),
    announced to the model as fairseq's trainer does."""
    src, lengths, prev, tgt = data
    optimizer.zero_grad(set_to_none=True)
    announce_update(model, passes)
    for _ in range(passes):
        with torch.autocast(device_type=src.device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits, _ = model(src, lengths, prev)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1))
        loss.backward()
    finish_update(model)
    optimizer.step()


def time_round_robin(fns, repeats, device):
    """{name: fastest seconds} for each callable, run once to warm up, then in turns. The
    fastest run, as timeit reports: on a shared machine noise only ever adds time."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: min(t) for name, t in times.items()}


def decode_fn(model, task, sentences, src_len, out_len, beam, device, dtype):
    d = task.target_dictionary
    generator = SequenceGenerator([model], d, beam_size=beam, max_len_a=0, max_len_b=out_len, min_len=out_len)
    src, lengths, _, _ = batch(task, sentences, src_len, device, seed=1)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}

    def run():
        with torch.no_grad(), torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype != torch.float32):
            generator.forward(sample)

    return run


def peak_memory_mb(model, optimizer, data, device):
    """Peak growth of memory allocated by torch during one (warm) training step, in MiB."""
    train_step(model, optimizer, data, torch.float32)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        train_step(model, optimizer, data, torch.float32)
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    # On CPU torch keeps no allocator statistics: replay the profiler's allocation events.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        train_step(model, optimizer, data, torch.float32)
    current = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        current += event.self_cpu_memory_usage
        peak = max(peak, current)
    return peak / 2**20


def floater_solve_times(sizes, lengths, repeats):
    """Seconds of one FLOATER solve + backward (rk4, step dt / 5) for each named model size (its
    width, and 3 states per self-attention block) and length: torchdiffeq's odeint through
    autograd (what FLOATER ran before its own solver) against FLOATER's rk4 with the hand-written
    backward, its step loops in Python and (where `make install` built them) in C++, round-robin
    in one run."""
    from torchdiffeq import odeint

    from fairseq_posenc.positions import floater_solver
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
                floater_solver.USE_COMPILED = compiled
                try:
                    ode._solve(ode.initial, 0, length).pow(2).sum().backward()
                finally:
                    floater_solver.USE_COMPILED = True
            return run

        fns = {"torchdiffeq": torchdiffeq, "python loops": fast(False)}
        if floater_solver.compiled_loops(ode.initial) is not None:
            fns["C++ loops"] = fast(True)
        secs = time_round_robin(fns, repeats, torch.device("cpu"))
        rows.append({"size": size, "dim": dim, "states": 6 * layers, "positions": length, "seconds": secs})
        print(f"| FLOATER solve + backward, d={dim}, {6 * layers} states, {length} positions: " + ", ".join(
            f"{name} {s:.3f} s ({ratio(s, secs['torchdiffeq'])}x)" for name, s in secs.items()), flush=True)
    return rows


def schedule_times(args, device):
    """Seconds per training update of sinusoidal and of FLOATER with each --floater-solve-every
    N: the mean over a block of consecutive updates, a multiple of every N long (each block holds
    the same share of solving updates as a long run), blocks round-robin over the models, the
    fastest block counting (as the fastest repeat elsewhere: on a shared machine noise only adds)."""
    task = _Task(args.vocab)
    everies = args.floater_solve_every
    block = args.schedule_block or math.lcm(*everies)
    if any(block % n for n in everies):
        raise SystemExit(f"--schedule-block {block} is not a multiple of every --floater-solve-every")
    models = {"sinusoidal": build("sinusoidal", args.size, task, args.max_positions).to(device)}
    for n in everies:
        models[f"floater N={n}"] = build("floater", args.size, task, args.max_positions,
                                         ["--floater-solve-every", str(n)]).to(device)
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-5) for name, m in models.items()}
    bsz, length = args.batch_sizes[0], args.lengths[0]
    data = batch(task, bsz, length, device)
    print(f"| {device.type}, {torch.get_num_threads()} threads, size {args.size} {MODEL_SIZES[args.size]}, batch "
          f"{bsz} x {length}, update-freq {args.update_freq[0]}, {args.repeats} blocks of {block} updates per model",
          flush=True)

    def run(name, updates):
        models[name].train()
        for _ in range(updates):
            train_step(models[name], optimizers[name], data, torch.float32, args.update_freq[0])

    for name in models:  # warm-up, then blocks in turns
        run(name, 2)
    seconds = {name: [] for name in models}
    for r in range(args.repeats):
        for name in models:
            sync(device)
            start = time.perf_counter()
            run(name, block)
            sync(device)
            seconds[name].append((time.perf_counter() - start) / block)
            print(f"| block {r + 1}: {name} {1000 * seconds[name][-1]:.1f} ms / update", flush=True)
    fastest = {name: min(s) for name, s in seconds.items()}
    print(f"\n| model | ms / update, fastest block of {block} | / sinusoidal | every block |\n|---|---|---|---|")
    for name, best in fastest.items():
        blocks = ", ".join(f"{1000 * s:.1f}" for s in seconds[name])
        print(f"| {name} | {1000 * best:.1f} | {ratio(best, fastest['sinusoidal'])}x | {blocks} |")
    return {"size": args.size, "batch": bsz, "length": length, "update_freq": args.update_freq[0], "block": block,
            "threads": torch.get_num_threads(), "seconds_per_update": seconds}


def ratio(value, reference):
    return round(value / reference, 3) if reference else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small model, short shapes: under 2 minutes on 2 cores")
    parser.add_argument("--size", choices=list(MODEL_SIZES), default="medium",
                        help="model size, all models the same (layers, d, ffn, heads: see MODEL_SIZES)")
    parser.add_argument("--encodings", nargs="+", default=list(POSITION_ENCODINGS), choices=list(POSITION_ENCODINGS))
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512], help="source = target lengths")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32], help="sentences per batch")
    parser.add_argument("--update-freq", type=int, nargs="+", default=[1],
                        help="passes per optimizer update (fairseq's --update-freq); each is timed as one update")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (the fastest counts)")
    parser.add_argument("--decode-sentences", type=int, default=16)
    parser.add_argument("--decode-length", type=int, default=32, help="source length and forced output length")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--max-positions", type=int, default=1024)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak memory measurement")
    parser.add_argument("--threads", type=int, default=None, help="torch threads on CPU (default: torch's)")
    parser.add_argument("--floater-solve", nargs="*", choices=list(MODEL_SIZES), metavar="SIZE",
                        help="only time one FLOATER ODE solve + backward at these model sizes (default: medium "
                             "base) for each of --lengths: torchdiffeq against FLOATER's rk4, its loops in "
                             "Python and in C++")
    parser.add_argument("--floater-solve-every", type=int, nargs="+", metavar="N",
                        help="only time training updates of sinusoidal and of FLOATER with each of these "
                             "--floater-solve-every, at the first of --lengths and --batch-sizes: the mean over a "
                             "block of consecutive updates, the fastest of --repeats blocks")
    parser.add_argument("--schedule-block", type=int, default=None,
                        help="updates per timed block with --floater-solve-every (default: their least common "
                             "multiple)")
    parser.add_argument("--output", default="benchmark_output/benchmark.json", help="where to write the JSON")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.floater_solve is not None:
        print(f"| cpu, {torch.get_num_threads()} threads, {args.repeats} repeats", flush=True)
        rows = floater_solve_times(args.floater_solve or ["medium", "base"], args.lengths, args.repeats)
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        write_text_atomically(args.output, json.dumps({"floater_solve": rows}, indent=2) + "\n")
        print(f"| wrote {args.output}")
        return
    if args.floater_solve_every:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        result = schedule_times(args, device)
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        write_text_atomically(args.output, json.dumps({"floater_solve_every": result}, indent=2) + "\n")
        print(f"| wrote {args.output}")
        return
    if args.quick:
        args.size, args.lengths, args.batch_sizes, args.repeats = "small", [32, 128], [8], 3
        args.decode_sentences, args.decode_length = 8, 16

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtypes = [torch.float32] + ([torch.bfloat16, torch.float16] if device.type == "cuda" else [])
    task = _Task(args.vocab)
    names = [STOCK] + [e for e in args.encodings]
    models = {name: build(name, args.size, task, args.max_positions).to(device) for name in names}
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-5) for name, m in models.items()}
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    print(f"| {device.type}, {torch.get_num_threads()} threads, size {args.size} {MODEL_SIZES[args.size]}, "
          f"models: {', '.join(names)}", flush=True)

    results = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "threads": torch.get_num_threads(), "size": args.size,
               "config": dict(zip(("layers", "dim", "ffn", "heads"), MODEL_SIZES[args.size])),
               "parameters": params, "train": [], "decode": [], "memory_mib": {}}
    for dtype in dtypes:
        dname = str(dtype).replace("torch.", "")
        for passes, bsz, length in itertools.product(args.update_freq, args.batch_sizes, args.lengths):
            for m in models.values():
                m.train()
            data = batch(task, bsz, length, device)
            fns = {n: (lambda n=n: train_step(models[n], optimizers[n], data, dtype, passes)) for n in names}
            secs = time_round_robin(fns, args.repeats, device)
            results["train"].append({"dtype": dname, "batch": bsz, "length": length, "update_freq": passes,
                                     "seconds": secs})
            print(f"| train {dname} batch {bsz} x {length}, update-freq {passes}: " + ", ".join(
                f"{n} {1000 * s:.1f} ms" for n, s in secs.items()), flush=True)
        for m in models.values():
            m.eval()
        fns = {n: decode_fn(models[n], task, args.decode_sentences, args.decode_length, args.decode_length,
                            args.beam, device, dtype) for n in names}
        secs = time_round_robin(fns, args.repeats, device)
        results["decode"].append({"dtype": dname, "sentences": args.decode_sentences,
                                  "tokens": args.decode_sentences * args.decode_length, "seconds": secs})
        print(f"| decode {dname} beam {args.beam}: " + ", ".join(
            f"{n} {args.decode_sentences / s:.1f} sent/s" for n, s in secs.items()), flush=True)
    if not args.no_memory:
        length, bsz = max(args.lengths), max(args.batch_sizes)
        data = batch(task, bsz, length, device)
        for name in names:
            models[name].train()
            results["memory_mib"][name] = round(peak_memory_mb(models[name], optimizers[name], data, device), 1)
        print(f"| peak memory growth of a training step, batch {bsz} x {length}: " + ", ".join(
            f"{n} {v:.0f} MiB" for n, v in results["memory_mib"].items()), flush=True)

    print_table(results, names)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    write_text_atomically(args.output, json.dumps(results, indent=2) + "\n")
    print(f"| wrote {args.output}")


def print_table(results, names):
    """One row per model: ratios to the stock transformer and to the plugin's sinusoidal."""
    fp32 = [r for r in results["train"] if r["dtype"] == "float32"]
    header = ["model", "params"] + [f"train {r['batch']}x{r['length']}" + (f" x{r['update_freq']}" if r["update_freq"] > 1 else "")
                                    for r in fp32] + ["decode"]
    if results["memory_mib"]:
        header.append("memory")
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    decode = next(r for r in results["decode"] if r["dtype"] == "float32")["seconds"]
    for name in names:
        cells = [name, f"{results['parameters'][name] / 1e6:.2f}M"]
        for r in fp32 + [{"seconds": decode}]:
            s = r["seconds"]
            cells.append(f"{ratio(s[name], s[STOCK])}x / {ratio(s[name], s.get('sinusoidal'))}x")
        if results["memory_mib"]:
            mem = results["memory_mib"]
            cells.append(f"{mem[name]:.0f} MiB ({ratio(mem[name], mem[STOCK])}x)")
        print("| " + " | ".join(cells) + " |")
    print("\nratios: time / stock transformer's / the plugin's sinusoidal's (lower is faster)")


if __name__ == "__main__":
    main()
