"""The length-generalisation report: per source-length bin and model, SacreBLEU, chrF, the length
ratio hyp/ref and the number of sentences, as mean and standard deviation over training seeds,
and each model's BLEU difference from a baseline with its interval (significance.py); written as
Markdown tables, JSON and a plot (length_plot.py).

One implementation for ``make demo``, the workflow's reports (report.py) and
``scripts/bleu_by_length.py``. Input: ``runs[model] = [Generation of seed 1, of seed 2, ...]``
(generation.py: sources, hypotheses, references and sentence ids, detokenized text on the target
side), all decoded from one test set."""
import json
import math
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from posenc_workflow.length_bins import make_bins, write_text_atomically
from posenc_workflow.length_plot import plot
from posenc_workflow.significance import (BOOTSTRAP_SEED, N_BOOTSTRAP, ONE_SEED_CAVEAT, paired_bootstrap,
                                          resample_counts, seed_bootstrap_scores, shared_bootstrap_variance,
                                          with_seed_variance)


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


def _mean_std(values: Sequence[float]):
    """Mean and sample standard deviation (0 for one seed)."""
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return mean, std


def build_report(runs: Dict[str, List], edges: Sequence[int], unit: str, baseline: Optional[str] = None,
                 n_samples: int = N_BOOTSTRAP, seeds: Optional[Sequence] = None, footer: str = "",
                 controls: Optional[Dict[str, str]] = None) -> Dict:
    """The report as a JSON-able dict (see the module docstring). ``baseline`` defaults to
    sinusoidal when it is among the models, else to the first model. ``controls`` maps a model
    to its control (FLOATER to the vanilla model trained on with FLOATER's schedule): each row
    of that model gets ``vs_control``, its difference from the control, as ``vs_baseline``."""
    if baseline is None:
        baseline = "sinusoidal" if "sinusoidal" in runs else next(iter(runs))
    if baseline not in runs:
        raise ValueError(f"baseline {baseline!r} is not among the models: {', '.join(runs)}")
    controls = dict(controls or {})
    for model, control in controls.items():
        if model not in runs or control not in runs or model == control:
            raise ValueError(f"control {model}={control}: both must be among the models ({', '.join(runs)}), "
                             "and differ")
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
    seed_stats = {}  # (model, bin) -> each seed's per-sentence BLEU statistics
    for model, generations in runs.items():
        rows = []
        for b, picked in bins:
            per_seed, stats_of_seeds = [], []
            for gen in generations:
                hyps = [gen.hypotheses[i] for i in picked]
                refs = [[gen.references[i] for i in picked]]
                stats = np.array(bleu._extract_corpus_statistics(hyps, refs), dtype="float64")
                score = bleu._compute_score_from_stats(stats.sum(0))
                per_seed.append({"bleu": score.score, "chrf": chrf.corpus_score(hyps, refs).score,
                                 "ratio": score.sys_len / score.ref_len if score.ref_len else 0.0,
                                 "sys_len": score.sys_len, "ref_len": score.ref_len})
                stats_of_seeds.append(stats)
            seed_stats[model, b.name] = stats_of_seeds
            row = {"bin": b.name, "low": b.low, "sentences": len(picked), "seeds": per_seed}
            for key in ("bleu", "chrf", "ratio"):
                row[key], row[key + "_std"] = _mean_std([s[key] for s in per_seed])
            rows.append(row)
        report["models"][model] = rows
    seed_boot = {}  # (model, bin) -> each seed's BLEU on each resample (resamples, seeds), computed once

    def bootstrap_scores(model, name):
        if (model, name) not in seed_boot:
            stats = seed_stats[model, name]
            seed_boot[model, name] = seed_bootstrap_scores(stats, bleu, resample_counts(len(stats[0]), n_samples))
        return seed_boot[model, name]

    def compare(row, other_row, other):
        base, system = seed_stats[other, row["bin"]], seed_stats[row["model"], row["bin"]]
        test = paired_bootstrap(sum(base), sum(system), bleu, n_samples)
        several = min(len(base), len(system)) > 1
        return test, with_seed_variance(
            test, [s["bleu"] for s in row["seeds"]], [s["bleu"] for s in other_row["seeds"]],
            shared_bootstrap_variance(bootstrap_scores(row["model"], row["bin"]), bootstrap_scores(other, row["bin"]))
            if several else None)

    for model, rows in report["models"].items():
        for row, base_row in zip(rows, report["models"][baseline]):
            row["model"] = model
            test, versus = compare(row, base_row, baseline)
            row["pooled_bleu"] = test["score"]
            row["pooled_bleu_interval"] = [test["score_low"], test["score_high"]]
            if model != baseline:
                row["vs_baseline"] = versus
    for model, control in controls.items():
        for row, control_row in zip(report["models"][model], report["models"][control]):
            row["vs_control"] = dict(compare(row, control_row, control)[1], control=control)
    report["controls"] = controls
    for rows in report["models"].values():
        for row in rows:
            del row["model"]
    tests = _comparisons(report)
    report["significance"] = {"intervals": sorted({t["interval"] for t in tests}),
                              "seed_variance_included": all(t["seed_variance_included"] for t in tests)}
    if not report["significance"]["seed_variance_included"]:
        report["significance"]["caveat"] = ONE_SEED_CAVEAT
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
            mark = ("*" + ("" if test["seed_variance_included"] else "†")) if test["significant"] else ""
            text += f" ({test['difference']:+.1f} [{test['low']:+.1f}, {test['high']:+.1f}]{mark})"
        return text

    lines = ["| " + " | ".join(header) + " |", rule]
    for model, rows in report["models"].items():
        lines.append("| " + " | ".join([model] + [cell(rows, b["bin"], bleu_cell) for b in report["bins"]]) + " |")
    spread = f"mean ± std over {n_seeds} seeds" if n_seeds > 1 else "one seed"
    lines += ["", f"SacreBLEU per bin of source length in {unit} ({spread}; n = sentences). In brackets: the "
                  f"difference from {baseline} and " + significance_legend(report) + f" {report['signature']}", ""]
    if report.get("controls"):
        def control_cell(row):
            test = row["vs_control"]
            mark = ("*" + ("" if test["seed_variance_included"] else "†")) if test["significant"] else ""
            return f"{test['difference']:+.1f} [{test['low']:+.1f}, {test['high']:+.1f}]{mark}"

        lines += ["| " + " | ".join(["encoding - its control"] + [b["bin"] for b in report["bins"]]) + " |",
                  "|" + "---|" * (len(report["bins"]) + 1)]
        for model, control in report["controls"].items():
            lines.append("| " + " | ".join([f"{model} - {control}"] + [cell(report["models"][model], b["bin"],
                                                                            control_cell) for b in report["bins"]]) + " |")
        lines += ["", "BLEU difference from the control trained with the same schedule from the same start (the "
                      "extra updates without the encoding): what the encoding itself does; its difference from the "
                      "baseline above also holds what the extra training does. Intervals and * as above.", ""]
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


def _comparisons(report: Dict) -> List[Dict]:
    return [row[key] for rows in report["models"].values() for row in rows
            for key in ("vs_baseline", "vs_control") if key in row]


def significance_legend(report: Dict) -> str:
    """What the interval in brackets covers and what a * says, for the table's caption: with
    one seed, that a * is the test set's noise only (a dagger beside each such *)."""
    tests = _comparisons(report)
    samples = report["bootstrap"]["samples"]
    with_seeds = any(t["seed_variance_included"] for t in tests)
    one_seed = any(not t["seed_variance_included"] for t in tests)
    parts = []
    if with_seeds:
        parts.append(f"{'with several seeds, ' if one_seed else ''}its 95% interval: the difference of the means "
                     f"over seeds, with the spread between training seeds (the per-seed BLEU of both models, "
                     f"Student's t with Welch's degrees of freedom) added to the test set's noise that the seeds "
                     f"share (covariance between different seeds' BLEU over {samples} paired resamples of the "
                     f"test sentences), each counted once; * where it excludes 0 (p < 0.05), a difference "
                     f"larger than retraining and another test set would be expected to make.")
    if one_seed:
        parts.append(f"{'With one seed, the difference and ' if with_seeds else ''}its 95% interval, ± 1.96 "
                     f"standard deviations of the paired bootstrap ({samples} resamples of the test sentences), "
                     f"*† where it excludes 0 (p < 0.05). † One seed per model: the "
                     f"interval is the test set's noise only, SEED VARIANCE IS NOT INCLUDED; a *† says the "
                     f"difference exceeds what another test set would make, not what retraining would "
                     f"(two seeds of one model can differ this much): run several seeds.")
    return " ".join(parts) if parts else "no comparison."


def write_report(report: Dict, out_prefix: str, title: str = "") -> Dict[str, str]:
    """PREFIX.md, PREFIX.json and PREFIX.png (the two-panel plot). Returns the paths."""
    paths = {"markdown": out_prefix + ".md", "json": out_prefix + ".json", "plot": out_prefix + ".png"}
    os.makedirs(os.path.dirname(os.path.abspath(out_prefix)), exist_ok=True)
    write_text_atomically(paths["markdown"], markdown(report))
    write_text_atomically(paths["json"], json.dumps(report, indent=2) + "\n")
    plot(report, paths["plot"], title)
    return paths
