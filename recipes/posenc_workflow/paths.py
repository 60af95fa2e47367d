"""Where a study's files go: its corpus's folder, the binarized data its models train on and its
test sets are decoded from, the references scored against, each model's folder and the
checkpoints' root. ``study``: a Configuration (configuration.py)."""
import os

from posenc_workflow.corpus import files_data_dir


def corpus_data(corpus: dict, out: str, corpus_name: str, src: str, tgt: str) -> str:
    """corpus.data's default: the toy pair under the study, a files corpus by its preparation
    settings (corpus.files_data_dir), a shipped corpus under data/."""
    if corpus["name"] == "toy":
        return os.path.join(out, "corpus")
    if corpus["name"] == "files":
        return files_data_dir(corpus, src, tgt)
    return os.path.join("data", corpus_name)


def data_bin(study) -> str:
    if study.split:
        return os.path.join(study.out, "split", "data-bin")
    return os.path.join(study.data, "data-bin")


def test_data_bin(study, test) -> str:
    """The binarized set ``test`` (a TestSet) is decoded from: the split's or the corpus's, or
    a named test set's own (prepared apart: recipes/rules/prepare.smk, prepare_test)."""
    return data_bin(study) if test.where == "models" else os.path.join(test_data(study, test), "data-bin")


def test_reference(study, test) -> str:
    """The raw references SacreBLEU scores ``test`` against (the target side as given)."""
    where = study.data if test.where == "models" else test_data(study, test)
    return os.path.join(where, f"{test.prefix}.raw.{study.tgt}")


def test_data(study, test) -> str:
    """Where a named test set is prepared (recipes/rules/prepare.smk, prepare_test)."""
    return os.path.join(study.out, test.where, "data")


def model_dir(study, model) -> str:
    return os.path.join(study.out, "models", model.name, f"seed{model.seed}")


def checkpoints_root(study) -> str:
    return os.path.join(study.out, "checkpoints")
