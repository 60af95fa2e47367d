"""The length report's plot: BLEU and the length ratio hyp/ref against source length, one line per
model."""
import os
from typing import Dict


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
