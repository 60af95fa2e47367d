"""The statistics of the length report: a model's BLEU difference from another's, with a 95%
interval over test sentences and training seeds.

The resampled unit is the test sentence, with every seed's translation of it: resampling the
translations one by one would count a sentence's k translations as k test items and narrow the
interval as if the test set were k times larger. With several seeds a side the difference is that
of the mean BLEU over seeds, its standard error the spread between seeds plus the test set's noise
that the seeds share, with Student's t (``with_seed_variance``); with one seed the interval is the
test set's noise only, and the result says so. docs/study.md derives the interval and says how its
level was checked.

The resampling is sacrebleu's paired bootstrap (``sacrebleu.significance``: the same generator,
seed and draws, its p-value function; the tests compare with ``PairedTest``), done here because
``PairedTest`` neither returns the interval of the difference nor takes statistics summed over
seeds."""
import math
import statistics
from typing import Dict, Optional, Sequence

import numpy as np

N_BOOTSTRAP = 1000
BOOTSTRAP_SEED = 12345  # sacrebleu's default (SACREBLEU_SEED), so results match its CLI


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
    shows), d +- t * se with se^2 = shared + s_sys^2 / k_sys + s_base^2 / k_base and t from
    Student's t at the Welch-Satterthwaite degrees of freedom of the seed terms, so that 2 or 3
    seeds, whose spread is itself uncertain, give a wide interval; the p-value is that t test's,
    so a * is p < 0.05 exactly. Each source of noise is counted once: the seeds' spread s^2
    already holds each seed's luck on particular sentences, so the test-set term is the
    bootstrap covariance between *different* seeds (a negative estimate counts as 0).
    docs/study.md derives it and says why neither the sentences alone nor a bootstrap over
    seeds; ``bootstrap_sd`` and ``seed_se`` report the two terms apart.

    With one seed on either side the spread between seeds cannot be estimated: the difference
    is that of the pooled statistics, its interval d +- 1.96 * the paired bootstrap's sd and
    its p-value the same normal test's, with ``seed_variance_included`` false and a caveat.
    Where nothing varies (se = 0) no difference is significant and a nonzero one has no
    p-value. ``sentences_only`` keeps the pooled difference with its percentile interval, its *
    and sacrebleu's own p-value."""
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
