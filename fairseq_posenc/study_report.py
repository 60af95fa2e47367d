"""The length-generalisation report: per source-length bin and model, SacreBLEU, chrF, the length
ratio hyp/ref and the number of sentences, as mean and standard deviation over training seeds,
with a paired bootstrap 95% interval of each model's BLEU difference from a baseline.

One implementation for ``make demo``, the workflow's reports (recipes/posenc_workflow/report.py) and
``scripts/bleu_by_length.py``. Input: ``runs[model] = [Generation of seed 1, of seed 2, ...]``
(``fairseq_posenc.generation.Generation``: sources, hypotheses, references and sentence ids,
detokenized text on the target side), all decoded from one test set.

How seeds and the bootstrap combine: the resampled unit is the test *sentence*, and each drawn
sentence brings the translations of every seed of a model. Resampling the seeds' translations
one by one would count one sentence's k translations as k independent test items and narrow the
interval by about sqrt(k), as if the test set were k times larger; seeds add no test sentences.
That interval says how sure we are given the test set, not given training: two seeds of one
model differ by more than it often enough that a * from it is no finding (an A/A test on a real
En-De corpus starred 2 of 5 bins). So with several seeds per model the reported difference is
that of the mean BLEU over seeds, and its standard error counts each source of noise once: the
spread between seeds (which holds each seed's luck on particular sentences) and the test set's
noise that the seeds share (the bootstrap covariance between different seeds' BLEU), with
Student's t (``with_seed_variance``, which gives the derivation and says why not a bootstrap
over seeds). The earlier sentence-only statistic (BLEU of all seeds' outputs concatenated,
percentile interval) stays in the JSON as ``sentences_only``. With one seed nothing estimates
the spread between seeds: the interval is the sentence bootstrap's alone (d +- 1.96 sd, its *
and p-value from that one normal test), and the table marks each of its stars with a dagger
and the JSON each comparison with ``seed_variance_included: false`` and a caveat.

The sentence resampling is exactly sacrebleu's paired bootstrap (``sacrebleu.significance``,
``_paired_bs_test``: the same generator, seed and draw of indices, its p-value function), which
the tests check against ``sacrebleu.significance.PairedTest``; it is done here rather than by
calling ``PairedTest`` because that one neither returns the interval of the *difference* nor
takes per-sentence statistics summed over seeds. Sacrebleu's p-value (a centred test of its own,
which can disagree with the percentile interval's *) is kept in ``sentences_only`` as
``sacrebleu_p_value``; every comparison's *, interval and p-value come from one test.
"""
import json
import math
import os
import re
import statistics
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
    p-value for that difference, the standard deviation of the resampled differences (``sd``)
    and the system's own 95% interval. The percentile interval's ``significant`` and
    sacrebleu's centred p-value are two different tests and can disagree (+3.23 [-0.16, +6.75]
    with p = 0.037); the report's comparisons take their *, interval and p-value from one test
    each (``with_seed_variance``)."""
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
            "score_high": sys_high, "sd": float(np.std(scores_sys - scores_bl, ddof=1))}


SENTENCES_ONLY = "sentences only (paired bootstrap sd, normal)"
SENTENCES_AND_SEEDS = "sentences and seeds (Welch t)"
ONE_SEED_CAVEAT = ("one seed per model: the interval is the test set's noise only, seed variance is not included; "
                   "two seeds of one model can differ by this much")
Z_975 = 1.959963984540054  # the normal distribution's 97.5% quantile


def compare_seeds(baseline_seeds: Sequence[np.ndarray], system_seeds: Sequence[np.ndarray], metric,
                  n_samples: int = N_BOOTSTRAP, seed: int = BOOTSTRAP_SEED) -> Dict:
    """The system's difference from the baseline when each was trained with one or more seeds:
    ``*_seeds`` hold one (sentences, statistics) array of sacrebleu statistics per seed. Returns
    ``with_seed_variance``'s result, as the report's ``vs_baseline``."""
    base = [np.asarray(s, dtype="float64") for s in baseline_seeds]
    system = [np.asarray(s, dtype="float64") for s in system_seeds]
    test = paired_bootstrap(sum(base), sum(system), metric, n_samples, seed)
    shared = None
    if min(len(base), len(system)) > 1:
        counts = resample_counts(len(system[0]), n_samples, seed)
        shared = shared_bootstrap_variance(seed_bootstrap_scores(system, metric, counts),
                                           seed_bootstrap_scores(base, metric, counts))
    return with_seed_variance(test, [metric._compute_score_from_stats(s.sum(0)).score for s in system],
                              [metric._compute_score_from_stats(s.sum(0)).score for s in base], shared)


def resample_counts(n: int, n_samples: int = N_BOOTSTRAP, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """(n_samples, n): how often each of the n test sentences is drawn in each resample, for the
    draws of ``paired_bootstrap`` (sacrebleu's). A matrix product with per-sentence statistics
    then sums a resample's statistics, exactly (integer counts), without materialising
    (n_samples, sentences, statistics) per seed."""
    idxs = np.random.default_rng(seed).choice(n, size=(n_samples, n), replace=True)
    return np.stack([np.bincount(row, minlength=n) for row in idxs]).astype("float64")


def seed_bootstrap_scores(seeds: Sequence[np.ndarray], metric, counts: np.ndarray) -> np.ndarray:
    """(resamples, seeds): each seed's corpus score on each resample of the test sentences
    (``counts``: ``resample_counts``). Every seed is scored on the same resampled sentences, so a
    sentence's translations by the k seeds stay one test item."""
    return np.array([[metric._compute_score_from_stats(sums).score for sums in counts @ np.asarray(stats, "float64")]
                     for stats in seeds]).T


def shared_bootstrap_variance(system_scores: np.ndarray, baseline_scores: np.ndarray) -> float:
    """The test set's variance of the difference of seed means that the seeds share, from
    ``seed_bootstrap_scores`` of each model ((resamples, k) each, same resamples; k >= 2 a
    side): C_ss + C_bb - 2 C_sb, where C_ss is the mean bootstrap covariance between the scores
    of two *different* seeds of the system, C_bb the same for the baseline and C_sb the mean
    covariance between a system seed and a baseline seed (all different seeds). Each seed's own
    bootstrap variance, which also holds its seed-by-sentence interaction, is left out: that
    part is in the spread between seeds already (``with_seed_variance``). It can come out
    below 0 by noise where the shared part is about 0 (an A/A comparison); it is returned as
    it is, and ``with_seed_variance`` counts it as 0."""
    k_sys, k_base = system_scores.shape[1], baseline_scores.shape[1]
    if min(k_sys, k_base) < 2:
        raise ValueError("shared_bootstrap_variance needs two or more seeds a side")
    cov = np.cov(np.hstack([system_scores, baseline_scores]), rowvar=False, ddof=1)

    def between_seeds(block):
        k = block.shape[0]
        return (block.sum() - np.trace(block)) / (k * (k - 1))

    return float(between_seeds(cov[:k_sys, :k_sys]) + between_seeds(cov[k_sys:, k_sys:])
                 - 2 * cov[:k_sys, k_sys:].mean())


def with_seed_variance(test: Dict, system_scores: Sequence[float], baseline_scores: Sequence[float],
                       shared_variance: Optional[float] = None) -> Dict:
    """``test``: ``paired_bootstrap`` of the two models' statistics pooled over seeds;
    ``*_scores``: each seed's own corpus score; ``shared_variance``:
    ``shared_bootstrap_variance`` (needed with two or more seeds a side). Returns the keys of
    ``vs_baseline`` in the report.

    With several seeds the difference is that of the mean per-seed scores (the means the table
    shows; BLEU of the seeds' outputs pooled can differ from it by several points where seeds
    differ in output length, the brevity penalty being convex): D = mean_j S_sys,j -
    mean_j S_base,j. Each source of noise is counted once. Write seed j's score on the test set
    T as S_mj = f_m(T) + e_mj(T): f_m(T) is what model m scores on T in expectation over
    training seeds, e_mj(T) the seed's deviation from it on T, of mean 0 and independent
    between seeds. e holds the seed's systematic effect and its seed-by-sentence interaction
    (its luck on particular sentences of T). Over training runs and test sets,

        Var(D) = Var_T(f_sys(T) - f_base(T)) + E_T[v_sys(T) / k_sys + v_base(T) / k_base],

    v_m(T) the variance of e_mj(T) given T. The seed term: the sample variance s_m^2 of the k_m
    per-seed scores estimates v_m(T) without bias, interaction included, so s_m^2 / k_m. The
    test-set term: resampling the sentences moves f_m and every e_mj; two different seeds'
    deviations move independently, so the bootstrap covariance between the scores of two
    different seeds holds the shared part f only, while a seed's own bootstrap variance also
    holds its interaction's, which s_m^2 has counted. The term is therefore
    ``shared_bootstrap_variance`` (C_ss + C_bb - 2 C_sb over pairs of different seeds), not the
    bootstrap variance of D itself: that one exceeds it by sum_m (V_m - C_mm) / k_m (V_m: the
    mean of the seeds' own bootstrap variances), the interaction a second time. The earlier
    interval added it; in a simulated A/A test with no systematic seed spread, its standard
    error was about sqrt(2) too large and it starred about 1% at a nominal 5%, with power lost
    (tests/unit/test_seed_interval.py). A negative estimate (noise, where the shared part is about
    0) counts as 0.

    The interval is d +- t * se, se^2 = shared + s_sys^2 / k_sys + s_base^2 / k_base, t from
    Student's t with the Welch-Satterthwaite degrees of freedom of the seed terms (the test-set
    term, from hundreds of sentences rather than a few seeds, counts as known), so that 2 or 3
    seeds, whose spread is itself uncertain, give the wide interval they should; the p-value is
    that t test's, so a * is p < 0.05 exactly.

    Why not sentences only: seeds of one model then come out "significant" against each other
    whenever the spread between training runs exceeds the test set's noise (simulated A/A
    tests, tests/unit/test_study_report.py). Why not resample the seeds as well as the sentences (a
    two-level bootstrap): a resample of k seeds out of k underestimates their variance by
    (k - 1) / k and has no small-sample correction; with 2 or 3 seeds a side it starred about
    twice the nominal rate of A/A trials in an earlier simulation. The two terms are reported
    apart (``bootstrap_sd``: the test-set term's square root, ``seed_se``), so a reader sees
    which noise dominates.

    With one seed on either side the spread between seeds cannot be estimated: the difference
    is that of the seeds' statistics pooled, its interval d +- 1.96 * the sd of the paired
    bootstrap's resampled differences and its p-value the same normal test's, so the * and p
    agree (sacrebleu's own p-value, a different centred test, is kept in ``sentences_only`` as
    ``sacrebleu_p_value``), with ``seed_variance_included`` false and a caveat (bleu_by_length.py
    refuses unequal seed counts, so one seed against several only reaches here from code). Where
    nothing varies at all (se = 0) no difference is significant and a nonzero one has no
    p-value. ``sentences_only`` is the pooled difference with its percentile interval and its *,
    what the report gave before seeds were accounted for."""
    sentences_only = {"difference": test["difference"], "low": test["low"], "high": test["high"],
                      "significant": test["significant"], "sacrebleu_p_value": test["p_value"]}
    if min(len(system_scores), len(baseline_scores)) < 2:
        d, se = test["difference"], test["sd"]
        result = _normal_or_t_test(d, se, math.inf)
        return {**result, "sentences_only": sentences_only, "bootstrap_sd": se, "interval": SENTENCES_ONLY,
                "seed_variance_included": False, "caveat": ONE_SEED_CAVEAT}
    if shared_variance is None:
        raise ValueError("with two or more seeds a side, with_seed_variance needs shared_variance "
                         "(shared_bootstrap_variance)")
    # statistics.variance is exact (rational arithmetic): seeds that score alike have no spread
    terms = [statistics.variance(scores) / len(scores) for scores in (system_scores, baseline_scores)]
    shared = max(float(shared_variance), 0.0)
    se = math.sqrt(shared + sum(terms))
    weight = sum(t ** 2 / (len(scores) - 1) for t, scores in zip(terms, (system_scores, baseline_scores)))
    dof = se ** 4 / weight if weight > 0 else math.inf
    d = statistics.fmean(system_scores) - statistics.fmean(baseline_scores)
    return {**_normal_or_t_test(d, se, dof), "sentences_only": sentences_only, "bootstrap_sd": math.sqrt(shared),
            "bootstrap_covariance": float(shared_variance), "seed_se": math.sqrt(sum(terms)),
            "degrees_of_freedom": dof if math.isfinite(dof) else None, "interval": SENTENCES_AND_SEEDS,
            "seed_variance_included": True}


def _normal_or_t_test(d: float, se: float, dof: float) -> Dict:
    """d +- q * se, q Student's t 97.5% quantile with ``dof`` degrees of freedom (the normal's
    when infinite), and the two-sided p-value of the same test: * (``significant``) exactly
    where the interval excludes 0, where p < 0.05. se = 0 (a bin of one sentence, seeds that
    translate alike): no noise to test a difference against, so none is significant."""
    from scipy import stats as scipy_stats

    if se == 0:
        return {"difference": d, "low": d, "high": d, "p_value": 1.0 if d == 0 else None, "significant": False}
    if math.isinf(dof):
        q, p_value = Z_975, float(2 * scipy_stats.norm.sf(abs(d) / se))
    else:
        q, p_value = float(scipy_stats.t.ppf(0.975, dof)), float(2 * scipy_stats.t.sf(abs(d) / se, dof))
    return {"difference": d, "low": d - q * se, "high": d + q * se, "p_value": p_value,
            "significant": bool(abs(d) > q * se)}


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
        # matplotlib's cycle has 10 colours: the 11th model onwards is told apart by line and marker
        style = {"marker": "os^D"[k // 10 % 4], "linestyle": ("-", "--", ":", "-.")[k // 10 % 4]}
        left.errorbar(xs, [r["bleu"] for r in rows], yerr=bleu_err, capsize=3, label=model, **style)
        right.errorbar(xs, [r["ratio"] for r in rows], yerr=[r["ratio_std"] for r in rows], capsize=3,
                       label=model, **style)
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


def first_cut_length(max_len_a: float, max_len_b: int, longest_source: int, max_positions: int = None):
    """The shortest source length L <= ``longest_source`` whose limit allows fewer than 1.5*L + 10
    target tokens, or None. Every length is checked: the two sides are lines in L only before
    ``int()`` rounds them, and the rounded ones can cross between the ends (a = 1.2, b = 11 allows
    11 >= 10 at L = 0 and 17 >= 17 at L = 5, but 15 < 16 at L = 4)."""
    for length in range(longest_source + 1):
        allowed, needed = _limits(max_len_a, max_len_b, length, max_positions)
        if allowed < needed:
            return length
    return None


def decoding_limit_ok(max_len_a: float, max_len_b: int, longest_source: int, max_positions: int = None) -> bool:
    """int(a*L + b) >= int(1.5*L + 10) (and the positions cap) for every source length L from 0
    to the longest."""
    return first_cut_length(max_len_a, max_len_b, longest_source, max_positions) is None


def decoding_limit_note(max_len_a: float, max_len_b: int, longest_source: int, max_positions: int = None,
                        what: str = "fairseq-generate") -> str:
    """One line for the report's footer: whether the decoding limit (fairseq: at most
    ``a * source length + b`` target tokens, and fewer than the model's positions) allows
    1.5x + 10 at every source length up to the longest, so that it is not what shortens a long
    output; where it fails first at a shorter length, the line names that length."""
    allowed, needed = _limits(max_len_a, max_len_b, longest_source, max_positions)
    cut = first_cut_length(max_len_a, max_len_b, longest_source, max_positions)
    verdict = "outputs that long are not cut" if cut is None else "LONG OUTPUTS MAY HAVE BEEN CUT BY IT"
    if cut is not None and cut != longest_source:
        cut_allowed, cut_needed = _limits(max_len_a, max_len_b, cut, max_positions)
        verdict += f" (first at a source of {cut} tokens: {cut_allowed} allowed, {cut_needed} needed)"
    return (f"Decoding limit: {what} --max-len-a {max_len_a:g} --max-len-b {max_len_b}"
            + (f", {max_positions} positions" if max_positions is not None else "")
            + f" allow {allowed} target tokens for the longest source ({longest_source} tokens), "
            f"1.5x + 10 = {needed} needed: {verdict}.")
