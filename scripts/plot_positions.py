#!/usr/bin/env python
"""What a trained model's position encoding looks like (FLOATER's Figure 3, for every encoding).

    python scripts/plot_positions.py --path checkpoints/averaged.pt --out positions.png [--max-len 64]

Every array is taken from the model's own modules, the code paths its forward runs, not
recomputed: fairseq's input position embedding (sinusoidal, learned) called on a sentence of
--max-len tokens; with --position-blocks all, what ``block_input`` adds to each later block's
input (zero input); the q, k, v biases of each attention block (FLOATER, RNN) as the block's
``transform_qkv`` adds them to zero projections; RoPE's rotation as ``transform_qkv`` turns the
unit pair (1, 0) of each pair of dimensions: cos | sin of its angle; the attention-logit bias of
each layer as ``attention_bias`` returns it (T5, DIET-REL, ALiBi: by offset key - query, one row
per head; DIET-ABS: P_Q P_K^T, query x key per head); Shaw's a^K and a^V tables per layer (its
key term q_i . a^K_(j-i) depends on the query, so the vectors are shown, by offset). A table
shared by several layers (or by the encoder and the decoder) is shown once. ``none`` has nothing
to show and says so in one line.

Heatmaps of position vectors (position down, dimension across) have their dimensions sorted by
how often each crosses its own mean over the positions trained on (all shown when unknown),
slowest first: sinusoidal's fall in order of frequency, and learned ones line up by how fast
they vary where they were trained. The colour scale is symmetric and fitted to the positions
trained on, so values beyond them saturate rather than wash the trained range out. A dashed
line marks the longest input each stack was trained on, which the stacks record in the
checkpoint (``longest_trained``; not in checkpoints older than it).
"""
import argparse
import logging
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

# before fairseq's import configures the root logger at INFO (fairseq/tasks/text_to_speech.py)
logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
import fairseq_posenc  # noqa: E402,F401  (registers the plugin)
from fairseq_posenc.positions import PositionEncoding  # noqa: E402

NOTHING = ("the model has no position encoding (its encoder sees a bag of words, its decoder only its "
           "causal mask): nothing to plot")


@dataclass
class PositionArray:
    """One plotted array. ``kind``: "vectors" (position x dimension), "rotation" (position x
    dimension: cos | sin), "offsets" (head x offset), "offset vectors" (offset x dimension) or
    "square" (head x query x key). ``first``: the label of row/column 0 (the first offset)."""

    array: np.ndarray
    kind: str
    first: int = 0
    longest: int = 0  # the stack's longest training input, 0 if unknown
    causal: bool = False  # a square whose keys after the query are masked (the decoder's)
    where: List[Tuple[str, Optional[int]]] = field(default_factory=list)  # (side, layer) it serves


def _layers(layers: List[int], total: int) -> str:
    if len(layers) == total > 1:
        return f"layers 0-{total - 1}"
    return ("layer " if len(layers) == 1 else "layers ") + ",".join(map(str, layers))


def _name(what: str, entry: PositionArray, layers_of: Dict[str, int]) -> str:
    sides = list(dict.fromkeys(side for side, _ in entry.where))
    layers = sorted({layer for _, layer in entry.where if layer is not None})
    where = "+".join(sides)
    if layers:
        where += " " + _layers(layers, min(layers_of[s] for s in sides))
    return f"{where} {what}"


def _rows(x: torch.Tensor) -> np.ndarray:
    """(1, H, T, D) -> (T, H * D): each position's vector as the projection it is added to."""
    return x[0].transpose(0, 1).reshape(x.size(2), -1).float().numpy()


def _by_offset(square: torch.Tensor, causal: bool) -> Optional[Tuple[np.ndarray, int]]:
    """(H, n, n) bias -> (H, offsets) and the first offset, where it depends on key - query only."""
    n = square.size(-1)
    if n > 1 and not torch.equal(square[:, 1:, 1:], square[:, :-1, :-1]):
        return None
    # the last query sees offsets -(n-1)..0, the first one 0..n-1
    rows = square[:, n - 1] if causal else torch.cat([square[:, n - 1], square[:, 0, 1:]], dim=1)
    return rows.float().numpy(), -(n - 1)


def _scheme_arrays(stack, side: str, n: int, add):
    scheme = stack.position_encoding
    tokens = torch.full((1, n), stack.dictionary.eos(), dtype=torch.long)
    scheme.begin_forward(tokens)
    device = tokens.device
    pos = scheme.positions("self", n, n, None, device)
    heads, dim = scheme.num_heads, scheme.head_dim
    if hasattr(scheme, "block_input"):  # p^(n) added to block n's input (--position-blocks all)
        x = torch.zeros(n, 1, stack.layers[0].embed_dim)
        for layer in range(scheme.num_layers):
            out = scheme.block_input(layer, x)
            if out is not x:
                add("term added to the layer's input", PositionArray(out[:, 0].float().numpy(), "vectors"), side, layer)
    if hasattr(scheme, "rel_k"):  # Shaw: the bias needs the query; its tables by offset
        for layer in range(scheme.num_layers):
            for name, table in (("a^K (key term)", scheme.rel_k), ("a^V (value term)", scheme.rel_v)):
                add(f"Shaw {name}", PositionArray(table[layer].float().numpy(), "offset vectors",
                                                  first=-scheme.max_distance), side, layer)
        return
    for layer in range(scheme.num_layers):
        bias = scheme.attention_bias(layer, None, pos)
        if bias is not None:
            square = bias[0].expand(heads, n, n)
            offsets = _by_offset(square, scheme.causal)
            if offsets is not None:
                add("attention bias by offset", PositionArray(offsets[0], "offsets", first=offsets[1]), side, layer)
            else:
                square = PositionArray(square.float().numpy(), "square", causal=scheme.causal)
                add("attention bias", square, side, layer)
    if type(scheme).transform_qkv is PositionEncoding.transform_qkv:
        return
    zeros = torch.zeros(1, heads, n, dim)
    unit = torch.zeros(1, heads, n, dim)
    unit[..., : dim // 2] = 1  # (1, 0) in every pair (i, i + D/2) that rotary rotates
    for layer in range(scheme.num_layers):
        for role, projections in (("self", "qkv"), ("cross", "qkv")):
            role_pos = pos if role == "self" else scheme.positions("cross", n, n, None, device)
            out0 = scheme.transform_qkv(layer, role, zeros, zeros, zeros, role_pos)
            out1 = scheme.transform_qkv(layer, role, unit, unit, unit, role_pos)
            for p, x0, x1 in zip(projections, out0, out1):
                if x0 is zeros and x1 is unit:
                    continue  # this block leaves the projection alone
                # a rotation leaves 0 at 0 and turns the unit pair; FLOATER's biases are 0 at a warm start
                if x0.any() or torch.equal(x1, unit):
                    add(f"{role}-attention {p} bias", PositionArray(_rows(x0), "vectors"), side, layer)
                else:  # a rotation, shown once where q's and k's are the same (xPos scales them apart)
                    what = "q and k" if torch.equal(out1[0], out1[1]) else p
                    add(f"rotation of {what} (cos | sin)", PositionArray(x1[0, 0].float().numpy(), "rotation"),
                        side, layer)


@torch.no_grad()
def position_arrays(model, max_len: int) -> Dict[str, PositionArray]:
    """name -> what the model adds for position, over positions 0 .. max_len - 1 (fewer where a
    table ends sooner), from its own modules. Arrays equal for several layers or for both stacks
    are kept once, named for all of them."""
    model.eval()
    entries: List[Tuple[str, PositionArray]] = []
    layers_of = {}

    for side, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
        scheme = stack.position_encoding
        layers_of[side] = scheme.num_layers
        longest = int(getattr(stack, "longest_trained", 0))
        n = max_len if scheme.extrapolates else min(max_len, scheme.max_positions)

        def add(what, entry, side=side, layer=None):
            entry.longest = longest
            for seen, old in entries:
                if seen == what and old.kind == entry.kind and old.array.shape == entry.array.shape \
                        and old.longest == longest and np.array_equal(old.array, entry.array, equal_nan=True):
                    old.where.append((side, layer))
                    return
            entry.where.append((side, layer))
            entries.append((what, entry))

        embed = stack.embed_positions
        if embed is not None:
            rows = min(n, getattr(embed, "max_positions", n) or n)
            tokens = torch.full((1, rows), stack.dictionary.eos(), dtype=torch.long)
            add("input position embedding", PositionArray(embed(tokens)[0].float().numpy(), "vectors"))
        _scheme_arrays(stack, side, n, add)
    return {_name(what, entry, layers_of): entry for what, entry in entries}


def dimension_order(vectors: np.ndarray) -> np.ndarray:
    """Columns sorted by how often each crosses its own mean over the rows, fewest first."""
    centred = vectors - vectors.mean(0, keepdims=True)
    crossings = (np.signbit(centred[1:]) != np.signbit(centred[:-1])).sum(0)
    return np.argsort(crossings, kind="stable")


def _limit(values: np.ndarray) -> float:
    finite = np.abs(values[np.isfinite(values)])
    return float(finite.max()) if finite.size and finite.max() > 0 else 1.0


def _panels(name: str, entry: PositionArray):
    """(title, image, extent, colour limit, marks) for each panel of one array."""
    a, longest = entry.array, entry.longest
    if entry.kind in ("vectors", "rotation", "offset vectors"):
        first = entry.first
        if entry.kind == "offset vectors":
            trained = slice(max(0, -(longest - 1) - first), (longest - 1) - first + 1) if longest else slice(None)
            # just past the largest offset seen in training, on each side
            marks = [("h", o + 0.5 if o > 0 else o - 0.5) for o in (-(longest - 1), longest - 1)
                     if longest and first <= o <= first + a.shape[0] - 1 and o != 0]
        else:
            trained = slice(0, longest) if 0 < longest <= a.shape[0] else slice(None)
            marks = [("h", longest - 0.5)] if 0 < longest < a.shape[0] else []
        if entry.kind != "rotation":  # sorted by what was learned: untrained rows are their initial noise
            a = a[:, dimension_order(a[trained])]
        trained = a[trained]
        extent = (-0.5, a.shape[1] - 0.5, first + a.shape[0] - 0.5, first - 0.5)
        sort = "" if entry.kind == "rotation" else ", dims sorted"
        rows = "offset key - query" if entry.kind == "offset vectors" else "position"
        yield f"{name}{sort}", a, extent, _limit(trained), marks, (rows, "dimension")
    elif entry.kind == "offsets":
        last = entry.first + a.shape[1] - 1
        inside = [o for o in (-(longest - 1), longest - 1) if longest and entry.first <= o <= last]
        lo, hi = (min(inside) - entry.first, max(inside) - entry.first + 1) if inside else (0, a.shape[1])
        extent = (entry.first - 0.5, last + 0.5, a.shape[0] - 0.5, -0.5)
        marks = [("v", o + 0.5 if o > 0 else o - 0.5) for o in inside if o != 0]
        yield name, a, extent, _limit(a[:, lo:hi]), marks, ("head", "offset key - query")
    else:  # square: one panel per distinct head
        heads = [h for h in range(a.shape[0]) if not any(np.array_equal(a[h], a[g]) for g in range(h))]
        n = a.shape[1]
        if entry.causal:  # the causal mask hides keys after the query: shown grey
            a = np.where(np.tril(np.ones((n, n), dtype=bool)), a, np.nan)
        for h in heads:
            trained = a[h, :longest, :longest] if 0 < longest <= n else a[h]
            marks = [("h", longest - 0.5), ("v", longest - 0.5)] if 0 < longest < n else []
            label = f"head {h}" if len(heads) > 1 else "all heads"
            yield f"{name}, {label}", a[h], (-0.5, n - 0.5, n - 0.5, -0.5), _limit(trained), marks, ("query", "key")


def norm_curve(image: np.ndarray, extent, axis_label: str) -> Tuple[np.ndarray, np.ndarray]:
    """The norm of a panel's values at each position (or offset) of its position axis: (positions,
    norms). The position axis is the rows, except in a by-offset bias (head x offset), whose columns
    are the offsets; masked entries (NaN, -inf) count as 0."""
    values = np.where(np.isfinite(image), image, 0.0).astype(np.float64)
    if axis_label == "head":  # head x offset
        return extent[0] + 0.5 + np.arange(values.shape[1]), np.sqrt((values ** 2).sum(0))
    top = min(extent[2], extent[3]) + 0.5
    return top + np.arange(values.shape[0]), np.sqrt((values.reshape(values.shape[0], -1) ** 2).sum(1))


def _plot_curve(ax, image, extent, marks, axis_label, xlabel):
    """Beside a heatmap: its norm against position on a log scale, the longest trained length
    dashed. The heatmap's colour scale is fitted to the trained rows, so past them 1.5x and 100x
    look the same; this axis does not saturate."""
    x, norms = norm_curve(image, extent, axis_label)
    positive = norms > 0
    if positive.any():
        ax.plot(x[positive], norms[positive], color="C0", linewidth=1.2)
        ax.set_yscale("log")
        low, high = norms[positive].min(), norms[positive].max()
        if high < 4 * low:  # nearly flat (a sinusoid's constant norm): not its rounding noise magnified
            ax.set_ylim(low / 2, high * 2)
    else:
        ax.text(0.5, 0.5, "all 0", ha="center", va="center", transform=ax.transAxes, fontsize=8)
    # the heatmap's marks across its position axis: "h" lines on rows, "v" lines on columns
    across = "v" if axis_label == "head" else "h"
    for direction, at in marks:
        if direction == across:
            ax.axvline(at, color="k", linestyle="--", linewidth=1)
    ax.set_xlabel(xlabel if axis_label == "head" else axis_label, fontsize=8)
    ax.set_ylabel("norm (log)", fontsize=8)
    ax.tick_params(labelsize=7)


def plot(arrays: Dict[str, PositionArray], out: str, title: str) -> int:
    """Write the heatmaps to ``out`` (PNG), each with its norm curve beside it (:func:`norm_curve`,
    log scale); returns the number of heatmap panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = [p for name, entry in arrays.items() for p in _panels(name, entry)]
    if not panels:
        fig = plt.figure(figsize=(8, 1.2))
        fig.text(0.5, 0.5, f"{title}\n{NOTHING}", ha="center", va="center", fontsize=10)
    else:
        cols = min(3, len(panels))
        rows = math.ceil(len(panels) / cols)
        # each panel a pair: the heatmap and, beside it, its norm against position (log scale)
        fig, grid = plt.subplots(rows, 2 * cols, figsize=(max(8.0 * cols, 10), 4.2 * rows), squeeze=False,
                                 gridspec_kw={"width_ratios": [3, 1.7] * cols})
        axes, curves = grid[:, 0::2], grid[:, 1::2]
        for ax in list(axes.flat[len(panels):]) + list(curves.flat[len(panels):]):
            ax.axis("off")
        longest = sorted({e.longest for e in arrays.values() if e.longest})
        cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="0.6")
        for ax, curve, (name, image, extent, limit, marks, (ylabel, xlabel)) in zip(axes.flat, curves.flat, panels):
            _plot_curve(curve, image, extent, marks, ylabel, xlabel)
            shown = ax.imshow(np.ma.masked_invalid(image), aspect="auto", cmap=cmap, vmin=-limit, vmax=limit,
                              extent=extent, interpolation="nearest")
            for direction, at in marks:
                (ax.axhline if direction == "h" else ax.axvline)(at, color="k", linestyle="--", linewidth=1)
            ax.set_title(name, fontsize=9)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.02)
        sides = {side: e.longest for e in arrays.values() for side, _ in e.where}
        note = ("right of each heatmap: its norm by position, log scale; "
                "dashed: the longest training input (" + ", ".join(f"{s} {n} tokens" for s, n in sides.items()) + ")"
                if longest else "longest training input not recorded in this checkpoint")
        if any(np.isneginf(e.array).any() or e.causal for e in arrays.values()):
            note += "; grey: masked (-inf, or after the query in the decoder)"
        fig.suptitle(f"{title}\n{note}", fontsize=10)
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 / (4.2 * rows)))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return len(panels)


def growth_diagnostic(model, max_len: Optional[int] = None) -> Optional[dict]:
    """For FLOATER and the RNN encoders: how the position biases grow past the longest trained
    length L (the larger of the two stacks' ``longest_trained``; max_len // 2 if not recorded), and
    the top eigenvalue of the dynamics' Jacobian at the end of the trained range. None for the
    other encodings.

    - ``slope``: the least-squares slope of log ||p_i|| against i over L - 1 <= i < max_len (default
      4 L), per position, for each block state; reported: the fastest-growing state's, and
      ``factor_per_position`` = exp(slope). ``ratio``: ||p_(max_len - 1)|| / ||p_(L - 1)|| of that state.
    - FLOATER (``kind`` "flow"): the eigenvalues of dh/dp at t = (L - 1) dt, p = p_(L - 1), the whole
      right-hand side (with --floater-dissipation, -LAMBDA I + diag(tanh') dh/dp), for each state;
      ``top_eigenvalue``: the largest real part over the states. A positive one makes small
      differences grow like exp(Re t), exp(Re dt) per position.
    - RNN (``kind`` "map"): the eigenvalues of the step's Jacobian dp_L / dp_(L - 1);
      ``top_eigenvalue``: the largest modulus (above 1: differences grow per position).
    """
    from fairseq_posenc.positions.floater import FloaterODE

    scheme = model.encoder.position_encoding
    ode = getattr(scheme, "ode", None)
    if not isinstance(ode, FloaterODE):
        return None
    longest = max(int(getattr(s, "longest_trained", 0)) for s in (model.encoder, model.decoder))
    recorded = longest > 0
    if max_len is None:
        max_len = 4 * longest if recorded else 64
    if not recorded:
        longest = max_len // 2
    longest = max(2, min(longest, max_len - 1))
    with torch.no_grad():
        solution = ode.positions(max_len)[:max_len].double()  # (max_len, states, dim)
    norms = solution.norm(dim=-1)  # (positions, states)
    past = torch.arange(longest - 1, max_len, dtype=torch.float64)
    logs = norms[longest - 1:].clamp_min(torch.finfo(torch.float64).tiny).log()
    centred = past - past.mean()
    slopes = (centred[:, None] * (logs - logs.mean(0))).sum(0) / (centred ** 2).sum()
    slopes = torch.where(torch.isfinite(slopes), slopes, torch.full_like(slopes, math.inf))
    worst = int(slopes.argmax())
    start = solution[longest - 1].float()
    eigenvalues = []
    dynamics = getattr(ode, "dynamics", None)
    for state in range(start.size(0)):
        if dynamics is not None:
            field = dynamics.float32()
            t = torch.tensor((longest - 1) * ode.dt)
            jacobian = torch.autograd.functional.jacobian(lambda p: field(t, p[None])[0], start[state])
        else:  # one step of the recurrence, from p_(L - 1) to p_L
            jacobian = torch.autograd.functional.jacobian(
                lambda p: ode._solve(p[None], longest - 1, longest + 1)[1, 0], start[state])
        eigenvalues.append(torch.linalg.eigvals(jacobian.double()))
    eigenvalues = torch.stack(eigenvalues)  # (states, dim)
    if dynamics is not None:
        per_state = eigenvalues.real.max(1).values
    else:
        per_state = eigenvalues.abs().max(1).values
    top_state = int(per_state.argmax())
    return {
        "kind": "flow" if dynamics is not None else "map",
        "longest": longest, "recorded": recorded, "max_len": max_len, "dt": ode.dt,
        "slope": float(slopes[worst]), "factor_per_position": math.exp(min(float(slopes[worst]), 700.0)),
        "ratio": float(norms[-1, worst] / norms[longest - 1, worst]), "state": worst,
        "norm_at_longest": float(norms[longest - 1, worst]), "norm_at_end": float(norms[-1, worst]),
        "top_eigenvalue": float(per_state[top_state]), "eigenvalue_state": top_state,
    }


def describe_growth(d: dict) -> str:
    """One line of :func:`growth_diagnostic`'s result."""
    trained = f"L = {d['longest']}" + ("" if d["recorded"] else " (not recorded: max_len / 2)")
    growth = (f"||p|| past {trained}: x{d['factor_per_position']:.3g} per position (log-slope {d['slope']:.3g}), "
              f"{d['norm_at_longest']:.3g} at {d['longest'] - 1} -> {d['norm_at_end']:.3g} at {d['max_len'] - 1} "
              f"(x{d['ratio']:.3g}, state {d['state']})")
    if d["kind"] == "flow":
        eig = (f"top Re eigenvalue of dh/dp at t = {(d['longest'] - 1) * d['dt']:g}: {d['top_eigenvalue']:.3g} "
               f"(x{math.exp(min(d['top_eigenvalue'] * d['dt'], 700.0)):.3g} per position, state {d['eigenvalue_state']})")
    else:
        eig = (f"top |eigenvalue| of the step's Jacobian at position {d['longest'] - 1}: {d['top_eigenvalue']:.3g} "
               f"(state {d['eigenvalue_state']})")
    return f"{growth}; {eig}"


def load_model(path: str, data: Optional[str] = None):
    """The model of a fairseq checkpoint (an averaged one too), through fairseq's own loader."""
    from fairseq import checkpoint_utils

    overrides = {"data": data} if data else {}
    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides)
    return models[0], cfg


def default_length(model) -> int:
    """Twice the longest input trained on, or 64 when the checkpoint does not say."""
    longest = max(int(getattr(s, "longest_trained", 0)) for s in (model.encoder, model.decoder))
    return 2 * longest if longest else 64


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", required=True, help="a fairseq checkpoint of transformer_posenc (averaged ones too)")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--max-len", type=int, help="positions to show (default: twice the longest training input "
                        "the checkpoint records, else 64); tables that end sooner (learned, DIET-ABS) end there")
    parser.add_argument("--data", help="the data directory to read the dictionaries from, where the checkpoint's "
                        "own (its cfg.task.data) has moved")
    args = parser.parse_args(argv)
    if args.max_len is not None and args.max_len < 2:
        parser.error(f"--max-len must be at least 2, got {args.max_len}")
    if not os.path.isfile(args.path):
        parser.error(f"no checkpoint at {args.path}")

    def fail(message):
        parser.exit(2, f"plot_positions.py: error: {message}\n")

    print(f"| loading {args.path}", file=sys.stderr)
    try:
        model, cfg = load_model(args.path, args.data)
    except FileNotFoundError as e:
        fail(f"{e} (the checkpoint's data directory, for its dictionaries: pass --data DIR if it moved)")
    except (KeyError, RuntimeError, ValueError) as e:
        fail(f"cannot load {args.path} as a fairseq checkpoint: {e}")
    if not hasattr(model.encoder, "position_encoding"):
        fail(f"{args.path} is not a transformer_posenc model (arch {cfg.model.arch})")
    max_len = args.max_len or default_length(model)
    from fairseq_posenc.labels import model_label

    encoding = model_label(model)  # the trained model's form (alibi (split)), not only its encoding's name
    arrays = position_arrays(model, max_len)
    panels = plot(arrays, args.out, f"{encoding}: {os.path.basename(args.path)}, positions 0-{max_len - 1}")
    if not arrays:
        print(f"| {encoding}: {NOTHING}", file=sys.stderr)
    print(f"| wrote {args.out}: {panels} panels ({', '.join(arrays) or 'none'})", file=sys.stderr)
    growth = growth_diagnostic(model, max_len)
    if growth is not None:
        print(f"| {encoding}: {describe_growth(growth)}")


if __name__ == "__main__":
    main()
