#!/usr/bin/env python
"""One training job of recipes/Snakefile: fairseq-train in a checkpoint directory named by a hash,
then a record (the job's declared output) written only when the checkpoint reached its budget.

    python recipes/posenc_workflow/train_job.py --record runs/x/models/alibi/seed1/trained.json \\
        --checkpoints runs/x/checkpoints --config-id ID --code KEY --data DATA_BIN \\
        [--start RECORD] [--teacher CHECKPOINT] [--max-update N] [--max-epoch E] [--launcher "srun ..."] \\
        -- fairseq-train DATA_BIN --arch ... (no --save-dir)

The directory is CHECKPOINTS/HASH, HASH of what the model is: the resolved configuration's hash
(``--config-id``: recipes/posenc_workflow/train_config.py, which names what it leaves out and why),
the training data's content (dictionaries, train and valid of DATA_BIN), the content of the
checkpoint a warm start reads (the start's record names its directory: ``{start}`` in the
command), the teacher's, and the code (``--code``: recipes/posenc_workflow/workflow.py code_key).
Snakemake deletes a job's outputs before it runs; the directory is none of them, so a job that
runs again (preempted, killed, its command changed in a field the hash leaves out, a larger
budget) goes on from fairseq's checkpoint_last.pt there, and one whose checkpoint already
reached the budget trains nothing.

After fairseq-train, whatever its exit code, the checkpoint decides: at the budget the record is
written (a rank aborting at teardown after the last save has finished); below it an exit 0 is an
error naming --stop-time-hours and --patience (fairseq stopped early on its own), and a failure is
the job's failure. A checkpoint past the budget (a smaller budget than this directory was
trained to) is refused: its interval checkpoints are not the ones of this budget. A checkpoint_last.pt
cut by a kill is replaced by the newest intact checkpoint (checkpoint_pick.py). With --launcher
(several nodes) and no --distributed-port in the command, rank 0's port comes from SLURM_JOB_ID.
"""
import argparse
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from typing import List, Optional, Tuple

from posenc_workflow.checkpoint_pick import intact_last

WHOLE_FILE_LIMIT = 64 << 20  # larger files: their size and first and last 4 MB
PART = 4 << 20
TRAINING_DATA = ("dict.*", "train.*", "valid.*")  # what fairseq-train reads of a data-bin
# the seconds fairseq-train ran in a checkpoint directory, kept there: a job run again that trains
# nothing writes the same record as before (Snakemake then runs nothing after it: the record's
# checksum is the same)
SECONDS = "train_seconds.json"


class JobError(Exception):
    """What failed, in one line."""


#: rank 0's port of a multi-node training outside SLURM (fairseq's documented one)
DEFAULT_PORT = 29500


def job_port(job_id: Optional[str]) -> int:
    """Rank 0's port of a multi-node training, from its SLURM job id: two jobs whose first nodes
    coincide listen on different ports (20000-31999, under Linux's ephemeral ports). Here, not in
    cluster.py: this script's imports are its rule's inputs, and cluster.py reads the study's schema."""
    return 20000 + int(job_id) % 12000 if job_id and job_id.isdigit() else DEFAULT_PORT


def _file_digest(path: str, digest) -> None:
    size = os.path.getsize(path)
    digest.update(str(size).encode())
    with open(path, "rb") as f:
        if size <= WHOLE_FILE_LIMIT:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        else:
            digest.update(f.read(PART))
            f.seek(size - PART)
            digest.update(f.read(PART))


def fingerprint(path: str, patterns=None) -> str:
    """12 hex digits of the content of a file, or of a directory's files matching ``patterns``
    (names relative to it): not the path, not modification times."""
    import fnmatch

    digest = hashlib.sha1()
    if os.path.isdir(path):
        files = sorted(os.path.relpath(f, path) for f in glob.glob(os.path.join(path, "**"), recursive=True)
                       if os.path.isfile(f) and not f.endswith(".log"))
        if patterns:
            files = [f for f in files if any(fnmatch.fnmatch(os.path.basename(f), p) for p in patterns)]
        if not files:
            raise JobError(f"{path} holds no file to fingerprint")
        for name in files:
            digest.update(name.encode() + b"\0")
            _file_digest(os.path.join(path, name), digest)
    elif os.path.isfile(path):
        _file_digest(path, digest)
    else:
        raise JobError(f"no file or directory {path}")
    return digest.hexdigest()[:12]


def read_progress(path: str) -> Tuple[int, int]:
    """(updates, finished epochs) of a fairseq checkpoint."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except Exception:  # an older (non-zip) checkpoint cannot be memory-mapped
        state = torch.load(path, map_location="cpu", weights_only=False)
    updates = state["optimizer_history"][-1]["num_updates"]
    iterator = state.get("extra_state", {}).get("train_iterator", {})
    # fairseq stores the next epoch once an epoch is over, the current one during it
    return updates, iterator.get("epoch", 1) - 1


def reached(progress: Tuple[int, int], max_update: Optional[int], max_epoch: Optional[int]) -> str:
    """'' below the budget, 'at' at it (where fairseq stops), 'past' beyond it."""
    updates, epochs = progress
    if (max_update and updates > max_update) or (max_epoch and epochs > max_epoch):
        return "past"
    if (max_update and updates == max_update) or (max_epoch and epochs == max_epoch):
        return "at"
    return ""


def describe(max_update: Optional[int], max_epoch: Optional[int]) -> str:
    return " or ".join(x for x in (max_update and f"update {max_update}", max_epoch and f"epoch {max_epoch}") if x)


def read_record(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def checkpoint_dir(args, start_dir: str) -> Tuple[str, dict]:
    """(the directory, what its hash covers)."""
    keyed = {"config": args.config_id, "code": args.code,
             "data": fingerprint(args.data, TRAINING_DATA)}
    if start_dir:
        keyed["start"] = fingerprint(os.path.join(start_dir, "checkpoint_best.pt"))
    if args.teacher:
        keyed["teacher"] = fingerprint(args.teacher)
    name = hashlib.sha1(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:12]
    return os.path.join(args.checkpoints, name), keyed


def run(args, command: List[str]) -> dict:
    start_dir = ""
    if args.start:
        start_dir = read_record(args.start)["checkpoints"]
    save_dir, keyed = checkpoint_dir(args, start_dir)
    command = [item.replace("{start}", start_dir).replace("{teacher}", args.teacher or "") for item in command]
    os.makedirs(save_dir, exist_ok=True)
    if args.link:  # from the start: fairseq's log and the checkpoints are found from the study's directory
        _link(args.link, save_dir)
    last = os.path.join(save_dir, "checkpoint_last.pt")
    budget = describe(args.max_update, args.max_epoch)
    if not budget:
        raise JobError("no budget: give --max-update or --max-epoch (fairseq-train would never stop)")
    seconds = 0.0
    done = intact_last(save_dir, read_progress)
    state = reached(done, args.max_update, args.max_epoch) if done else ""
    if state == "past":
        raise JobError(f"{last} is at update {done[0]} (epoch {done[1]}), past this job's budget ({budget}): the "
                       f"directory holds a longer run of this model, whose interval checkpoints are not this "
                       f"budget's; raise the budget to go on from it, or delete {save_dir} to train this one")
    if state == "at":
        print(f"| {save_dir}: trained before to update {done[0]} (epoch {done[1]}), the budget ({budget}): nothing "
              "to train", flush=True)
    else:
        what = f"resuming from update {done[0]}" if done else "from scratch"
        full = [*shlex.split(args.launcher), *command, "--save-dir", save_dir]
        if args.launcher and "--distributed-port" not in command:
            # rank 0's port from this job's id: jobs whose first nodes coincide do not collide
            full += ["--distributed-port", str(job_port(os.environ.get("SLURM_JOB_ID")))]
        log_path = os.path.join(args.link or save_dir, "train.log")
        print(f"| {save_dir}: training {what} to {budget} (fairseq's log: {log_path})", flush=True)
        began = time.time()
        progress = Progress(_model_name(args.record), args.max_update, args.max_epoch, done, began)
        with open(os.path.join(save_dir, "train.log"), "a", encoding="utf-8") as log:
            log.write(f"\n== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(full)}\n")
            log.flush()
            process = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       errors="replace", bufsize=1)
            for line in process.stdout:
                log.write(line)
                log.flush()
                report = progress.read(line)
                if report:
                    print(report, flush=True)
            code = process.wait()
        seconds = time.time() - began
        _add_seconds(save_dir, seconds)
        done = intact_last(save_dir, read_progress)
        state = reached(done, args.max_update, args.max_epoch) if done else ""
        tail = _tail(os.path.join(save_dir, "train.log"))
        if not state:
            where = f"stopped at update {done[0]} (epoch {done[1]})" if done else "saved no checkpoint_last.pt"
            if code == 0:
                raise JobError(f"fairseq-train exited 0 but {where}, before its budget ({budget}): it stopped "
                               "early on its own (--stop-time-hours, --patience); no record is written, so nothing "
                               f"downstream uses it (log: {save_dir}/train.log)\n{tail}")
            raise JobError(f"fairseq-train failed (exit {code}) and {where}, before its budget ({budget}); the next "
                           f"run goes on from there (log: {save_dir}/train.log)\n{tail}")
        if state == "past":
            raise JobError(f"fairseq-train went past the budget ({budget}) to update {done[0]}")
        if code != 0:
            print(f"| fairseq-train exited {code} after its last save at the budget: finished", flush=True)
    record = {"checkpoints": save_dir, "hash": os.path.basename(save_dir), "keyed": keyed,
              "software": json.loads(args.software) if args.software else {},
              "budget": {"max_update": args.max_update, "max_epoch": args.max_epoch},
              "updates": done[0], "epochs": done[1], "train_seconds": round(_seconds(save_dir), 1),
              "command": command}
    tmp = f"{args.record}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, sort_keys=True)
    os.replace(tmp, args.record)
    print(f"| {args.record}: update {done[0]}, epoch {done[1]} ({budget})", flush=True)
    return record


# fairseq-train's progress lines (--log-format simple): "epoch 003:    120 / 385 loss=..., num_updates=890, ..."
# during an epoch, "epoch 003 | loss ... | num_updates 1155 | ..." at its end
_UPDATES = re.compile(r"\bnum_updates[= ](\d+)")
_IN_EPOCH = re.compile(r"\bepoch (\d+):\s+(\d+) / (\d+)\b")
_EPOCH_END = re.compile(r"\bepoch (\d+) \| ")


class Progress:
    """The job's progress lines from fairseq-train's log lines: the update, the budget, the share
    of it done and the time left at this run's pace since its first log line (at that line, since
    the run's start: fairseq's import and data loading included). One line an update (fairseq
    gives an epoch's end twice, train and valid)."""

    def __init__(self, name: str, max_update: Optional[int], max_epoch: Optional[int],
                 done: Optional[Tuple[int, int]], began: float):
        self.name, self.max_update, self.max_epoch = name, max_update, max_epoch
        self.began = began
        self.origin = (began, self._fraction(done[0], done[1], 0, 1) if done else 0.0)
        self.first: Optional[Tuple[float, float]] = None
        self.epoch = (done[1] + 1, 0, 1) if done else (1, 0, 1)
        self.last_update = -1

    def _fraction(self, updates: int, epochs_done: int, step: int, steps: int) -> float:
        """The share of the budget done, by whichever of its limits is nearer."""
        shares = []
        if self.max_update:
            shares.append(updates / self.max_update)
        if self.max_epoch:
            shares.append((epochs_done + step / max(steps, 1)) / self.max_epoch)
        return min(1.0, max(shares)) if shares else 0.0

    def read(self, line: str, now: Optional[float] = None) -> str:
        """A progress line for one of fairseq-train's lines that gives the update, else ''."""
        in_epoch = _IN_EPOCH.search(line)
        if in_epoch:
            self.epoch = tuple(int(g) for g in in_epoch.groups())
        else:
            end = _EPOCH_END.search(line)
            if end:
                self.epoch = (int(end.group(1)), 1, 1)
        updates = _UPDATES.search(line)
        if not updates:
            return ""
        updates = int(updates.group(1))
        if updates == self.last_update:
            return ""
        self.last_update = updates
        epoch, step, steps = self.epoch
        done = self._fraction(updates, epoch - 1, step, steps)
        now = time.time() if now is None else now
        since, then = self.first or self.origin
        if self.first is None:
            self.first = (now, done)
        budget = " or ".join(x for x in (self.max_update and f"{updates}/{self.max_update} updates",
                                         self.max_epoch and f"epoch {epoch}/{self.max_epoch}") if x)
        left = "left: unknown yet"
        if done > then and now > since:
            left = f"about {_duration((1 - done) * (now - since) / (done - then))} left"
        return f"| {self.name}: {budget} ({100 * done:.0f}%), {_duration(now - self.began)} in this run, {left}"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _model_name(record: str) -> str:
    """NAME/seedS of OUT/models/NAME/seedS/trained.json, what the progress lines are prefixed with."""
    seed_dir = os.path.dirname(os.path.abspath(record))
    return f"{os.path.basename(os.path.dirname(seed_dir))}/{os.path.basename(seed_dir)}"


def _seconds(save_dir: str) -> float:
    """The seconds fairseq-train has run in ``save_dir``, over every run that trained there."""
    try:
        with open(os.path.join(save_dir, SECONDS), encoding="utf-8") as f:
            return float(json.load(f)["seconds"])
    except (OSError, ValueError, KeyError):
        return 0.0


def _add_seconds(save_dir: str, seconds: float):
    path = os.path.join(save_dir, SECONDS)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"seconds": _seconds(save_dir) + seconds}, f)
    os.replace(path + ".tmp", path)


def _link(link: str, target: str):
    """LINK -> the checkpoint directory, for people (and the average rule) to find it."""
    tmp = f"{link}.tmp"
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(os.path.relpath(target, os.path.dirname(os.path.abspath(link)) or "."), tmp)
    os.replace(tmp, link)


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        sys.exit("train_job.py: error: give fairseq-train's command after --")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", required=True, help="the record to write once the budget is reached")
    parser.add_argument("--checkpoints", required=True, help="where the checkpoint directories go")
    parser.add_argument("--config-id", required=True, help="hash of the resolved configuration (train_config.identity)")
    parser.add_argument("--code", required=True, help="hash of the code the model trains with (workflow.code_key)")
    parser.add_argument("--software", default="", help="JSON of the versions recorded with the model")
    parser.add_argument("--data", required=True, help="the data-bin fairseq-train reads")
    parser.add_argument("--start", default="", help="the record of the model a warm start reads")
    parser.add_argument("--teacher", default="", help="the checkpoint a distilled student learns from")
    parser.add_argument("--max-update", type=int, default=None)
    parser.add_argument("--max-epoch", type=int, default=None)
    parser.add_argument("--launcher", default="", help="what starts fairseq-train (srun on several nodes)")
    parser.add_argument("--link", default="", help="a symlink to the checkpoint directory")
    args = parser.parse_args(argv[:split])
    launcher = shlex.split(args.launcher)[:1]
    if launcher and not shutil.which(launcher[0]):
        # several nodes run here, not on SLURM: said before any checkpoint directory is made
        parser.error(f"train.nodes > 1 starts fairseq-train with {launcher[0]}, which is not on this machine: run "
                     "the study on SLURM (--profile recipes/profiles/slurm) or inside a SLURM allocation")
    try:
        run(args, argv[split + 1:])
    except (JobError, OSError, KeyError, ValueError) as e:
        print(f"train_job.py: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
