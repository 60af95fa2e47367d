"""What a study's plan (plan.py) starts from before anything is measured: the corpus's size before
it is prepared (its published size, or a files corpus's files counted) and each model's training
speed. ``study``: a Configuration (configuration.py)."""
from typing import Optional

from posenc_workflow.plan import GPU_TOKENS_PER_SECOND, CorpusEstimate
from posenc_workflow.rows import Model

#: target subwords of a training pair, for the estimate: WMT's news and parliament text at 40k
#: BPE merges about 28, IWSLT's TED talks at 10k about 23 (assumptions; the prepared corpus is counted)
TARGET_SUBWORDS = {"wmt": 28, "iwslt": 23}


def corpus_estimate(study) -> Optional[CorpusEstimate]:
    """The corpus's published size (plan.CorpusEstimate) for the plan before it is prepared."""
    if study.facts["style"] == "files":
        return _counted_files(study)
    pairs = study.facts["train_pairs"].get("-".join(sorted((study.src, study.tgt))))
    if not pairs or study.config["corpus"].get("sources"):  # another sources file: another corpus
        return None
    bpe = study.config["corpus"].get("bpe_size") or study.facts["bpe_size"]
    joined = study.facts["style"] != "iwslt"
    return CorpusEstimate(pairs, TARGET_SUBWORDS[study.facts["style"]], bpe * (1 if joined else 2),
                          f"{study.corpus_name}'s published size")


def _counted_files(study) -> CorpusEstimate:
    """A files corpus's training pairs and target words, counted in its files (the plan before
    it is prepared): its own split's validation pairs out, a word a subword (BPE only adds)."""
    corpus = study.config["corpus"]
    path = corpus["train"]["tgt"]
    # with a split in words, the pairs it trains on: sources under train_below (before tokenization)
    below = study.split["train_below"] if study.split and study.split["unit"] == "words" else None
    lines = words = 0
    with open(path, "rb") as f, open(corpus["train"]["src"], "rb") as g:
        for line, source in zip(f, g):
            if below is None or len(source.split()) < below:
                lines += 1
                words += len(line.split())
    pairs = lines - (lines // study.facts["valid_every"] if corpus.get("valid") in (None, "split") else 0)
    path += f" (sources under {below} words)" if below else ""
    bpe = corpus.get("bpe_size") or study.facts["bpe_size"]
    return CorpusEstimate(pairs, words / max(lines, 1) + 1, bpe,
                          f"counted in {path}: {lines:,} lines, {words:,} target words", counted=True)


def tokens_per_second(study, model: Model):
    """train.tokens_per_second, auto: on GPUs Vaswani et al.'s P100 speed for base and big models
    and an assumed one for iwslt (plan.GPU_TOKENS_PER_SECOND); on the CPU "auto", which the plan
    works out from the model's parameters (plan.cpu_tokens_per_second)."""
    value = study.train.get("tokens_per_second", "auto")
    if value == "auto":
        return "auto" if study.train["device"] == "cpu" else GPU_TOKENS_PER_SECOND.get(study.model_arch(model))
    return float(value) if value is not None else None
