"""What a study's decodes and its length report count in, read from its configuration (or its
record, study.json): subwords or words, and the length report's bins."""


def segmentation(study) -> str:
    """How the decoded H- and T- lines are segmented (scoring.py detok-generation --bpe)."""
    return decoded_segmentation(study.config)


def decoded_segmentation(config: dict) -> str:
    """:func:`segmentation` of a study's configuration (its record, study.json): the subwords of a
    split in subwords (decoded without --remove-bpe, S- lines too), else none (words)."""
    corpus, split = config.get("corpus") or {}, config.get("split")
    if corpus.get("name") == "toy" or not split or split.get("unit", "subwords") == "words":
        return "none"
    return "sentencepiece" if corpus.get("bpe") == "sentencepiece" else "subword_nmt"


def length_bins(config: dict):
    """The length report's (bins, unit), a pair: report.bins and report.unit where report.bins is
    set, else a split's split.bins and split.unit; None: no length report. A pair, since a unit is
    what its bins count; and report.bins, null unless given, says the report was asked for, where
    report.unit's default (words) is filled in whether given or not."""
    report, split = config.get("report") or {}, config.get("split")
    if report.get("bins"):
        return list(report["bins"]), report.get("unit", "words")
    if split:
        return list(split.get("bins") or []), split.get("unit", "subwords")
    return None
