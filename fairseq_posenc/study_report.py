"""The length-generalisation report: per source-length bin and model, SacreBLEU, chrF, the length
ratio hyp/ref and the number of sentences, as mean and standard deviation over training seeds,
with a paired bootstrap 95% interval of each model's BLEU difference from a baseline.

One implementation for ``make demo``, ``recipes/extrapolation/run.sh`` and
``scripts/bleu_by_length.py``. Input: ``runs[model] = [Generation of seed 1, of seed 2, ...]``
(``fairseq_posenc.pipeline.Generation``: sources, hypotheses, references and sentence ids,
detokenized text on the target side), all decoded from one test set.

How seeds and the bootstrap combine: the resampled unit is the test *sentence*, and each drawn
sentence brings the translations of every seed of a model (its sacrebleu sufficient statistics
summed over seeds, so a resample's score is the corpus BLEU of the seeds' outputs concatenated).
Resampling the rows of the concatenation one by one would count one sentence's k translations as
k independent test items and narrow the interval by about sqrt(k), as if the test set were k
times larger; seeds add no test sentences. The interval therefore says how sure we are given
the test set (with the training noise of one seed averaged over the seeds run); the spread
*between* seeds is reported beside it as the standard deviation, and a difference is only worth
reading when it is large against both.

With one seed, the resampling is exactly sacrebleu's paired bootstrap (``sacrebleu.significance``,
``_paired_bs_test``: the same generator, seed and draw of indices, its p-value function), which
the tests check against ``sacrebleu.significance.PairedTest``; it is done here rather than by
calling ``PairedTest`` because that one neither returns the interval of the *difference* nor
takes per-sentence statistics summed over seeds.
"""
import json
import math
import os
import re
from typing import Dict, List, Optional, Sequence

import numpy as np

from .length_bins import make_bins, write_text_atomically

N_BOOTSTRAP = 1000
BOOTSTRAP_SEED = 12345  # sacrebleu's default (SACREBLEU_SEED), so results match its CLI


def _metrics():
    from sacrebleu.metrics import BLEU, CHRF

    return BLEU(), CHRF()


def _aligned(runs: Dict[str, List]) -> List[int]:
    """The sentence ids every run decoded; a run that decoded other sentences is an error, since
    paired comparisons need the same sentences on both sides."""
    ids = None
    for model, generations in runs.items():
        if not generations:
            raise ValueError(f"{model} has no generation")
        for seed_index, gen in enumerate(generations, 1):
            if ids is None:
                ids, first = list(gen.ids), (model, seed_index)
            elif list(gen.ids) != ids:
                raise ValueError(f"{model} (generation {seed_index}) decoded {len(gen.ids)} sentences, "
                                 f"not the {len(ids)} sentences of {first[0]} (generation {first[1]}): "
                                 f"every generation must come from the same test set")
    return ids


def paired_bootstrap(baseline_stats: np.ndarray, system_stats: np.ndarray, metric,
                     n_samples: int = N_BOOTSTRAP, seed: int = BOOTSTRAP_SEED) -> Dict:
    """``*_stats``: (sentences, statistics) sacrebleu sufficient statistics, one row per test
    sentence (summed over seeds). Returns the difference system - baseline of the corpus
    scores, its 95% interval over ``n_samples`` paired resamples of the sentences, sacrebleu's
    p-value for that difference, and the system's own 95% interval."""
    from sacrebleu.significance import _compute_p_value

    n = len(system_stats)
    # sacrebleu's _paired_bs_test draws exactly these indices (np.random.default_rng(seed).choice)
    idxs = np.random.default_rng(seed).choice(n, size=(n_samples, n), replace=True)
    baseline_stats = np.asarray(baseline_stats, dtype="float32")
    system_stats = np.asarray(system_stats, dtype="float32")
    scores_bl = np.array([metric._compute_score_from_stats(s.sum(0)).score for s in baseline_stats[idxs]])
    scores_sys = np.array([metric._compute_score_from_stats(s.sum(0)).score for s in system_stats[idxs]])
    real_bl = metric._compute_score_from_stats(baseline_stats.sum(0)).score
    real_sys = metric._compute_score_from_stats(system_stats.sum(0)).score
    # sacrebleu's p-value: how often a resample's |difference|, centred, exceeds the real one
    sample_diffs = np.abs(scores_sys - scores_bl)
    p_value = _compute_p_value(sample_diffs - sample_diffs.mean(), abs(real_sys - real_bl))
    low, high = _interval(scores_sys - scores_bl)
    sys_low, sys_high = _interval(scores_sys)
    return {"difference": real_sys - real_bl, "low": low, "high": high, "p_value": p_value,
            "significant": bool(low > 0 or high < 0), "score": real_sys, "score_low": sys_low,
            "score_high": sys_high}


def _interval(samples: np.ndarray):
    """95% percentile interval, with sacrebleu's convention (estimate_ci: 1/40 cut from each side)."""
    samples = np.sort(samples)
    cut = len(samples) // 40
    return float(samples[cut]), float(samples[len(samples) - cut - 1])


def _mean_std(values: Sequence[float]):
    """Mean and sample standard deviation (0 for one seed)."""
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return mean, std


def build_report(runs: Dict[str, List], edges: Sequence[int], unit: str, baseline: Optional[str] = None,
                 n_samples: int = N_BOOTSTRAP, seeds: Optional[Sequence] = None, footer: str = "") -> Dict:
    """The report as a JSON-able dict (see the module docstring). ``baseline`` defaults to
    sinusoidal when it is among the models, else to the first model."""
    if baseline is None:
        baseline = "sinusoidal" if "sinusoidal" in runs else next(iter(runs))
    if baseline not in runs:
        raise ValueError(f"baseline {baseline!r} is not among the models: {', '.join(runs)}")
    ids = _aligned(runs)
    first = runs[baseline][0]
    lengths = [len(s.split()) for s in first.sources]
    bleu, chrf = _metrics()
    report = {"unit": unit, "baseline": baseline, "bootstrap": {"samples": n_samples, "seed": BOOTSTRAP_SEED,
                                                                   "unit": "sentence, all seeds' translations"},
              "seeds": list(seeds) if seeds is not None else None, "footer": footer, "bins": [], "models": {}}
    bins = []
    for b in make_bins(edges):
        picked = [i for i, n in enumerate(lengths) if n in b]
        if picked:
            bins.append((b, picked))
            report["bins"].append({"bin": b.name, "low": b.low, "sentences": len(picked)})
    if not bins:
        raise ValueError(f"no test sentence falls in the bins {[b.name for b in make_bins(edges)]}")
    pooled = {}  # (model, bin) -> per-sentence BLEU statistics summed over seeds
    for model, generations in runs.items():
        rows = []
        for b, picked in bins:
            per_seed, summed = [], None
            for gen in generations:
                hyps = [gen.hypotheses[i] for i in picked]
                refs = [[gen.references[i] for i in picked]]
                stats = np.array(bleu._extract_corpus_statistics(hyps, refs), dtype="float64")
                score = bleu._compute_score_from_stats(stats.sum(0))
                per_seed.append({"bleu": score.score, "chrf": chrf.corpus_score(hyps, refs).score,
                                 "ratio": score.sys_len / score.ref_len if score.ref_len else 0.0,
                                 "sys_len": score.sys_len, "ref_len": score.ref_len})
                summed = stats if summed is None else summed + stats
            pooled[model, b.name] = summed
            row = {"bin": b.name, "low": b.low, "sentences": len(picked), "seeds": per_seed}
            for key in ("bleu", "chrf", "ratio"):
                row[key], row[key + "_std"] = _mean_std([s[key] for s in per_seed])
            rows.append(row)
        report["models"][model] = rows
    for model, rows in report["models"].items():
        for row in rows:
            test = paired_bootstrap(pooled[baseline, row["bin"]], pooled[model, row["bin"]], bleu, n_samples)
            row["pooled_bleu"] = test["score"]
            row["pooled_bleu_interval"] = [test["score_low"], test["score_high"]]
            if model != baseline:
                row["vs_baseline"] = {k: test[k] for k in ("difference", "low", "high", "p_value", "significant")}
    report["signature"] = str(bleu.get_signature())
    report["chrf_signature"] = str(chrf.get_signature())
    return report


def markdown(report: Dict) -> str:
    """Two tables: BLEU (mean ± std over seeds, difference from the baseline with its interval and
    a * where it excludes 0), then the length ratio hyp/ref and chrF (means over seeds)."""
    unit, baseline = report["unit"], report["baseline"]
    n_seeds = max(len(r["seeds"]) for rows in report["models"].values() for r in rows)
    header = ["encoding"] + [f"{b['bin']} n={b['sentences']}" for b in report["bins"]]
    rule = "|" + "---|" * len(header)

    def cell(rows, name, fmt):
        row = next((r for r in rows if r["bin"] == name), None)
        return fmt(row) if row else "-"

    def bleu_cell(row):
        text = f"{row['bleu']:.1f} ± {row['bleu_std']:.1f}" if n_seeds > 1 else f"{row['bleu']:.1f}"
        test = row.get("vs_baseline")
        if test:
            text += (f" ({test['difference']:+.1f} [{test['low']:+.1f}, {test['high']:+.1f}]"
                     f"{'*' if test['significant'] else ''})")
        return text

    lines = ["| " + " | ".join(header) + " |", rule]
    for model, rows in report["models"].items():
        lines.append("| " + " | ".join([model] + [cell(rows, b["bin"], bleu_cell) for b in report["bins"]]) + " |")
    spread = f"mean ± std over {n_seeds} seeds" if n_seeds > 1 else "one seed"
    lines += ["", f"SacreBLEU per bin of source length in {unit} ({spread}; n = sentences). In brackets: the "
                  f"difference from {baseline} (BLEU of all seeds' outputs pooled) and its paired bootstrap 95% "
                  f"interval ({report['bootstrap']['samples']} resamples of the test sentences); "
                  f"* where the interval excludes 0. {report['signature']}", ""]
    lines += ["| " + " | ".join(["encoding"] + [b["bin"] for b in report["bins"]]) + " |",
              "|" + "---|" * (len(report["bins"]) + 1)]
    for model, rows in report["models"].items():
        lines.append("| " + " | ".join([model] + [cell(rows, b["bin"], lambda r: f"{r['ratio']:.2f} / {r['chrf']:.1f}")
                                                  for b in report["bins"]]) + " |")
    lines += ["", f"Length ratio hyp/ref (sacrebleu's sys_len/ref_len; below 1: the model stops early) / chrF, "
                  f"means over seeds. {report['chrf_signature']}"]
    if report.get("footer"):
        lines += ["", report["footer"]]
    return "\n".join(lines) + "\n"


def write_report(report: Dict, out_prefix: str, title: str = "") -> Dict[str, str]:
    """PREFIX.md, PREFIX.json and PREFIX.png (the two-panel plot). Returns the paths."""
    paths = {"markdown": out_prefix + ".md", "json": out_prefix + ".json", "plot": out_prefix + ".png"}
    os.makedirs(os.path.dirname(os.path.abspath(out_prefix)), exist_ok=True)
    write_text_atomically(paths["markdown"], markdown(report))
    write_text_atomically(paths["json"], json.dumps(report, indent=2) + "\n")
    plot(report, paths["plot"], title)
    return paths


def plot(report: Dict, path: str, title: str = ""):
    """Left: BLEU against source length with error bars (the std over seeds, or with one seed the
    bootstrap 95% interval of the model's BLEU); right: the length ratio hyp/ref."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [b["bin"] for b in report["bins"]]
    position = {name: i for i, name in enumerate(names)}
    n_seeds = max(len(r["seeds"]) for rows in report["models"].values() for r in rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for k, (model, rows) in enumerate(report["models"].items()):
        # a small sideways shift per model keeps overlapping error bars apart
        xs = [position[r["bin"]] + (k - (len(report["models"]) - 1) / 2) * 0.025 for r in rows]
        if n_seeds > 1:
            bleu_err = [r["bleu_std"] for r in rows]
        else:
            bleu_err = [[r["bleu"] - r["pooled_bleu_interval"][0] for r in rows],
                        [r["pooled_bleu_interval"][1] - r["bleu"] for r in rows]]
            bleu_err = [[max(0.0, e) for e in side] for side in bleu_err]
        left.errorbar(xs, [r["bleu"] for r in rows], yerr=bleu_err, marker="o", capsize=3, label=model)
        right.errorbar(xs, [r["ratio"] for r in rows], yerr=[r["ratio_std"] for r in rows], marker="o",
                       capsize=3, label=model)
    spread = f"mean ± std over {n_seeds} seeds" if n_seeds > 1 else "bootstrap 95% interval"
    for ax in (left, right):
        ax.set_xticks(range(len(names)), names)
        ax.set_xlabel(f"source length ({report['unit']})")
        ax.grid(alpha=0.3)
    left.set_ylabel(f"SacreBLEU ({spread})")
    right.axhline(1.0, color="black", linewidth=0.8)
    right.set_ylabel("length ratio hyp/ref")
    right.legend(fontsize=8)
    fig.suptitle(title or "Translation quality and output length against source length")
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


_LIMIT = re.compile(r"'max_len_a': ([0-9.eE+-]+), 'max_len_b': ([0-9]+)")


def read_decoding_limit(log_text: str):
    """(max_len_a, max_len_b) from the config line fairseq-generate logs at start, or None."""
    m = _LIMIT.search(log_text)
    return (float(m.group(1)), int(m.group(2))) if m else None


def _limits(max_len_a: float, max_len_b: int, length: int, max_positions: int = None):
    """(allowed, needed) target tokens for a source of ``length`` tokens, rounded down as fairseq's
    SequenceGenerator rounds ``int(a * length + b)`` (so a = 1.5, b = 10 meets its own rule)."""
    allowed = int(max_len_a * length + max_len_b)
    if max_positions is not None:
        allowed = min(allowed, max_positions - 1)
    return allowed, int(1.5 * length + 10)


def decoding_limit_ok(max_len_a: float, max_len_b: int, longest_source: int, max_positions: int = None) -> bool:
    """a*L + b >= 1.5*L + 10 for every source length L up to the longest: both sides are lines in
    L, so checking the two ends suffices (the positions cap only matters at the longest)."""
    return all(allowed >= needed for allowed, needed in (
        _limits(max_len_a, max_len_b, 0, max_positions), _limits(max_len_a, max_len_b, longest_source, max_positions)))


def decoding_limit_note(max_len_a: float, max_len_b: int, longest_source: int, max_positions: int = None,
                        what: str = "fairseq-generate") -> str:
    """One line for the report's footer: whether the decoding limit (fairseq: at most
    ``a * source length + b`` target tokens, and fewer than the model's positions) allows
    1.5x the longest source plus 10, so that it is not what shortens a long output."""
    allowed, needed = _limits(max_len_a, max_len_b, longest_source, max_positions)
    ok = decoding_limit_ok(max_len_a, max_len_b, longest_source, max_positions)
    verdict = "outputs that long are not cut" if ok else "LONG OUTPUTS MAY HAVE BEEN CUT BY IT"
    return (f"Decoding limit: {what} --max-len-a {max_len_a:g} --max-len-b {max_len_b}"
            + (f", {max_positions} positions" if max_positions is not None else "")
            + f" allow {allowed} target tokens for the longest source ({longest_source} tokens), "
            f"1.5x + 10 = {needed} needed: {verdict}.")
