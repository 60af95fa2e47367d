"""Several fairseq command lines run one after another in one Python process, through the entry
points the console scripts call (``fairseq-train`` is ``fairseq_cli.train:cli_main``,
``fairseq-generate`` is ``fairseq_cli.generate:cli_main``), each with its command line in
``sys.argv``. A tiny run takes about a second; importing torch and fairseq takes several, and is
paid once per batch of runs instead of once per run. Each run builds its own task and model from
its own command line; a run that fails is recorded with its traceback and the next one goes on,
so that a test per run can report its own failure.

Every run here loads its data in this process (``--num-workers 0`` unless its command gives
``--num-workers``): a DataLoader worker (fairseq-generate's default is one) left by a run is shut
down when the garbage collector meets its iterator, in a later run, and torch's shutdown waits up
to 5 s (``MP_STATUS_CHECK_INTERVAL``) for it to exit: measured 5 s of an idle core per run.
"""
import json
import os
import subprocess
import sys
from typing import Dict, List, Sequence, Tuple

from posenc_workflow import pipeline

_RUNNER = r"""
import contextlib, io, json, sys, traceback

from fairseq_cli import generate, train  # first: fairseq's CLI sets up its logging

spec, out_path = sys.argv[1:3]
jobs, results = json.load(open(spec)), {}
for name, cli, argv in jobs:
    sys.argv = [cli, *argv]
    out, err = io.StringIO(), io.StringIO()
    try:
        # fairseq-generate prints its hypotheses; fairseq's log goes to the stdout it was set up with
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            {"fairseq-train": train.cli_main, "fairseq-generate": generate.cli_main}[cli]()
        results[name] = {"ok": True, "stdout": out.getvalue(), "stderr": err.getvalue()}
    except BaseException as error:  # argparse's SystemExit too
        if not isinstance(error, SystemExit):
            with contextlib.redirect_stderr(err):  # what the console script would print on its way out
                sys.excepthook(*sys.exc_info())
        results[name] = {"ok": False, "stdout": out.getvalue(), "stderr": err.getvalue(),
                         "error": traceback.format_exc()}
    with open(out_path, "w") as f:  # after each run: a crash of the process leaves the runs before it
        json.dump(results, f)
"""


def train_command(data_bin: str, save_dir: str, flags: Sequence[str]) -> List[str]:
    return [data_bin, "--user-dir", pipeline.USER_DIR, "--save-dir", save_dir, *flags]


def generate_command(data_bin: str, checkpoint: str, flags: Sequence[str]) -> List[str]:
    return [data_bin, "--user-dir", pipeline.USER_DIR, "--path", checkpoint, *flags]


def run_all(jobs: Sequence[Tuple[str, str, List[str]]], workdir: str) -> Dict[str, dict]:
    """``jobs``: (name, "fairseq-train" or "fairseq-generate", its arguments after the command
    name). Returns {name: {"ok", "stdout", "stderr" (as the console script prints it: a failure through
    ``sys.excepthook``), and "error" (the traceback) where it failed}}; a run missing from the
    result is one the process did not reach (its log is ``workdir/runs.log``)."""
    jobs = [(name, cli, list(argv) + ([] if any(a.split("=")[0] == "--num-workers" for a in argv) else
                                      ["--num-workers", "0"])) for name, cli, argv in jobs]
    os.makedirs(workdir, exist_ok=True)
    spec, out, log = (os.path.join(workdir, name) for name in ("runs.json", "results.json", "runs.log"))
    with open(spec, "w") as f:
        json.dump([list(job) for job in jobs], f)
    with open(log, "w") as f:
        subprocess.run([sys.executable, "-c", _RUNNER, spec, out], stdout=f, stderr=subprocess.STDOUT,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if not os.path.exists(out):
        with open(log) as f:
            raise RuntimeError("the fairseq runs did not start:\n" + f.read()[-3000:])
    with open(out) as f:
        return json.load(f)


def preprocess_here(prefixes: Dict[str, str], dest: str) -> str:
    """pipeline.preprocess() in this process, where fairseq is imported already: no process to
    start. (test_end_to_end runs fairseq-preprocess itself.)"""
    import logging

    import fairseq_cli.preprocess
    from fairseq import options

    logger = logging.getLogger("fairseq_cli.preprocess")
    handlers = list(logger.handlers)
    try:
        fairseq_cli.preprocess.main(options.get_preprocessing_parser().parse_args(pipeline.preprocess_args(prefixes, dest)))
    finally:  # the log file fairseq-preprocess opens in DEST, closed as its process would
        for handler in [h for h in logger.handlers if h not in handlers]:
            logger.removeHandler(handler)
            handler.close()
    return dest


def outcome(results: Dict[str, dict], name: str) -> dict:
    """The result of run ``name``; fails the test with its traceback where it failed."""
    import pytest

    if name not in results:
        pytest.fail(f"{name}: not run (the process stopped before it)")
    if not results[name]["ok"]:
        pytest.fail(f"{name} failed:\n{results[name]['error'][-3000:]}")
    return results[name]
