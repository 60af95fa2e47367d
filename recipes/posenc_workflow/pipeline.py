"""Thin wrappers over fairseq's own CLI, for the demo, the benchmark and the tests.

Every step is the command a user would type (``fairseq-preprocess``, ``fairseq-train``,
``fairseq-generate``), with ``--user-dir`` pointing at the plugin; nothing here reimplements
fairseq. Output of each command goes to a log file; a failing command raises with its tail.
"""
import os
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USER_DIR = os.path.join(ROOT, "fairseq_posenc")
SCRIPTS_DIR = os.path.join(ROOT, "scripts")


from posenc_workflow.generation import Generation, parse_generate_output  # noqa: E402,F401  (fairseq-generate's output, read)


class CommandFailed(RuntimeError):
    pass


def executable(name: str) -> str:
    """A console script of this environment (the venv's ``bin/``), else from ``PATH``."""
    local = os.path.join(os.path.dirname(sys.executable), name)
    found = local if os.path.exists(local) else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found: run `make install` first")
    return found


def run(cmd: Sequence[str], log: str, stdin: Optional[str] = None, capture_stdout: bool = False) -> str:
    """Run ``cmd``, its output going to ``log`` as it runs (``tail -f`` it to follow a long job).

    Returns the log's text, or with ``capture_stdout`` the command's stdout alone (kept apart
    from stderr so that it can be parsed; it is appended to the log at the end)."""
    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.run(list(cmd), input=stdin, stdout=subprocess.PIPE if capture_stdout else f, stderr=f,
                              text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if capture_stdout:
            f.write(proc.stdout)
    if capture_stdout and proc.returncode == 0:
        return proc.stdout  # no need to read the log back
    with open(log) as f:
        text = f.read()
    if proc.returncode != 0:
        tail = "\n".join(text.splitlines()[-25:])
        raise CommandFailed(f"{os.path.basename(cmd[0])} exited with {proc.returncode} (log: {log}):\n{tail}")
    return text


def preprocess(prefixes: Dict[str, str], dest: str, src: str = "src", tgt: str = "tgt", log_dir: str = None) -> str:
    """``prefixes``: "train", "valid", and "test", "test1", ... (fairseq's names for several test
    sets, which it takes as one comma-separated ``--testpref``)."""
    run([executable("fairseq-preprocess"), *preprocess_args(prefixes, dest, src, tgt)],
        os.path.join(log_dir or dest, "preprocess.log"))
    return dest


def preprocess_args(prefixes: Dict[str, str], dest: str, src: str = "src", tgt: str = "tgt") -> List[str]:
    """preprocess()'s fairseq-preprocess arguments."""
    args = ["--source-lang", src, "--target-lang", tgt]
    for split in ("train", "valid"):
        if split in prefixes:
            args += [f"--{split}pref", prefixes[split]]
    tests = sorted((k for k in prefixes if k.startswith("test")), key=lambda k: int(k[4:] or 0))
    if tests:
        args += ["--testpref", ",".join(prefixes[k] for k in tests)]
    return args + ["--destdir", dest, "--joined-dictionary", "--workers", "1"]


def train(data_bin: str, save_dir: str, flags: Sequence[str], log: Optional[str] = None) -> str:
    cmd = [executable("fairseq-train"), data_bin, "--user-dir", USER_DIR, "--save-dir", save_dir, *flags]
    return run(cmd, log or os.path.join(save_dir, "train.log"))


def average_checkpoints(save_dir: str, num_epochs: int, output: str) -> str:
    cmd = [sys.executable, os.path.join(SCRIPTS_DIR, "average_checkpoints.py"), "--inputs", save_dir,
           "--num-epoch-checkpoints", str(num_epochs), "--output", output]
    run(cmd, output + ".log")
    return output


def generate(data_bin: str, checkpoint: str, subset: str = "test", beam: int = 4, lenpen: float = 0.6,
             extra: Sequence[str] = (), log: Optional[str] = None) -> Generation:
    cmd = [executable("fairseq-generate"), data_bin, "--user-dir", USER_DIR, "--path", checkpoint,
           "--gen-subset", subset, "--beam", str(beam), "--lenpen", str(lenpen), "--batch-size", "64", *extra]
    out = run(cmd, log or f"{checkpoint}.{subset}.generate.log", capture_stdout=True)
    return parse_generate_output(out)


def sacrebleu_score(hypotheses: List[str], references: List[str]):
    """SacreBLEU (default 13a tokenisation) with its signature."""
    from sacrebleu.metrics import BLEU

    metric = BLEU()
    return metric.corpus_score(hypotheses, [references]), str(metric.get_signature())


def toy_train_flags(position_encoding: str = "sinusoidal", max_update: int = 300, seed: int = 1,
                    keep_last_epochs: int = 5, size: str = "small", lr: float = 2e-3,
                    max_tokens: int = 2000, device: Sequence[str] = ("--cpu",), dropout: float = 0.1,
                    warmup_updates: int = 100, share: Sequence[str] = ("--share-all-embeddings",)) -> List[str]:
    """A model and schedule that learn the toy task on 2 CPU cores in about a minute ("small").
    ``device``: the device and precision flags (the workflow's train.device gpu gives its own)."""
    from fairseq_posenc.models.from_flags import size_flags

    return [
        "--arch", "transformer_posenc", "--position-encoding", position_encoding, *device,
        *size_flags(size), *share, "--dropout", str(dropout),
        "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", str(lr),
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(warmup_updates),
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", str(max_tokens), "--max-update", str(max_update), "--seed", str(seed),
        "--no-progress-bar", "--log-interval", "50", "--keep-last-epochs", str(keep_last_epochs),
        "--num-workers", "0",
    ]
