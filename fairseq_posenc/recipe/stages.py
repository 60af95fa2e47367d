"""Whether a training stage (one fairseq-train into one --save-dir) starts, resumes, is skipped,
restarts or is refused, decided from the record it left, SAVE_DIR/stage.json:

- ``config``: the resolved fairseq configuration it was started with (:mod:`.train_config`),
  compared field by field with the one asked now; only the fields of
  ``train_config.MAY_DIFFER`` may differ, the batch layout as its tokens per update;
- ``settings``: what fairseq's configuration does not hold (the training data by content, the
  stage's name in its protocol);
- ``after``: the stamp of the stage it starts from, whose retraining restarts it;
- ``budget`` and, once finished, ``finished`` and a new ``stamp``.

A stage is finished when its checkpoints say so (``checkpoint_last.pt`` at the budget and a
``checkpoint_best.pt``, which a later stage reads), not when fairseq-train exited 0: a run killed
just after its last save, or a rank that aborts at teardown, leaves a finished stage behind.
"""
import glob
import json
import os
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

try:
    from . import train_config
except ImportError:  # steps.py run as a file loads it on its own: deciding needs fairseq, ending a stage not
    import train_config

RECORD = "stage.json"


class Refusal(ValueError):
    """A stage that must not run as asked: the message is the one line the user sees (a ValueError,
    as every other one-line error of steps.py)."""


def read_json(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path: str, value: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def checkpoints(save_dir: str) -> List[str]:
    return sorted(glob.glob(os.path.join(save_dir, "checkpoint*.pt")))


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


def progress(save_dir: str) -> Optional[Tuple[int, int]]:
    """(updates, finished epochs) of SAVE_DIR/checkpoint_last.pt, or None without one."""
    path = os.path.join(save_dir, "checkpoint_last.pt")
    return read_progress(path) if os.path.isfile(path) else None


def reached(done, max_update: Optional[int], max_epoch: Optional[int]) -> str:
    """'' when training stopped short of the budget, 'at' when exactly at it (where fairseq stops),
    'past' when beyond it."""
    updates, epochs = done
    if (max_update and updates > max_update) or (max_epoch and epochs > max_epoch):
        return "past"
    if (max_update and updates == max_update) or (max_epoch and epochs == max_epoch):
        return "at"
    return ""


def describe(max_update, max_epoch) -> str:
    return " / ".join(x for x in (max_update and f"update {max_update}", max_epoch and f"epoch {max_epoch}") if x)


def _budget(config: Dict[str, Any]) -> Dict[str, Optional[int]]:
    max_update, max_epoch = train_config.budget(config)
    return {"max_update": max_update, "max_epoch": max_epoch}


def _changes(record: dict, settings: Dict[str, str], config: Dict[str, Any], inputs: bool) -> List[str]:
    old = record.get("settings", {})
    changed = [f"{k}: {old.get(k, '(unset)')} -> {settings.get(k, '(unset)')}"
               for k in sorted(set(old) | set(settings)) if old.get(k) != settings.get(k)]
    if "config" not in record:
        return changed + ["the record holds no fairseq configuration (written by an older recipe)"]
    return changed + train_config.differences(record["config"], config, inputs)


def decide(save_dir: str, settings: Dict[str, str], config: Dict[str, Any], after_dir: str = "",
           on_change: str = "refuse", adopt: bool = False, preflight: bool = False) -> Tuple[str, str]:
    """(decision, reason): what a re-run of the stage must do so that what SAVE_DIR holds is the
    stage asked for (``config``, ``settings``), and nothing is trained twice:

    - start: nothing trained yet;
    - resume: the same stage, stopped short of its budget (interrupted, or the budget grew);
    - skip: the same stage, finished at its budget (fairseq-train would train one more update);
    - restart: the stage it starts from ran again since, or (``on_change=restart``) the asked
      configuration differs: its checkpoints are of another model.
    Refused: checkpoints without a record (unless ``adopt``), another configuration under
    ``on_change=refuse`` (the message names each field with its two values), a budget below what
    was trained. ``preflight``: asked before the stage it starts from has (re)trained, so that a
    refusal comes before hours of training: only its own configuration is compared."""
    max_update, max_epoch = train_config.budget(config)
    upstream = None
    if after_dir and not preflight:
        upstream = read_json(os.path.join(after_dir, RECORD))
        if not upstream or not upstream.get("finished"):
            raise Refusal(f"{save_dir} starts from {after_dir}, which has not finished")
    if not checkpoints(save_dir):
        return "start", "nothing trained yet"
    record = read_json(os.path.join(save_dir, RECORD))
    if record is None or (adopt and "config" not in record):
        if not adopt:
            raise Refusal(f"{save_dir} holds checkpoints but no record of the configuration they were trained with "
                          f"({RECORD}; trained by an older recipe or by hand): fairseq-train would resume them "
                          "under the configuration asked now. Use another OUT, delete them to start over, or set "
                          "ADOPT_RUN=1 to declare that they were trained with it")
        record = {**(record or {}), "settings": settings, "config": config,
                  "after": (upstream or {}).get("stamp", (record or {}).get("after"))}
    # another configuration first: a stage whose upstream retrained is restarted only when nothing
    # else changed (a restart under on_change=refuse must not replace another run's checkpoints)
    changed = _changes(record, settings, config, inputs=not (after_dir or preflight))
    if changed:
        why = "; ".join(changed)
        if on_change == "restart":
            return "restart", f"another configuration ({why})"
        adopt_hint = ", or ADOPT_RUN=1 to declare that they were trained with it" if "config" not in record else ""
        raise Refusal(f"{save_dir} holds checkpoints of another configuration: {why}. fairseq-train would resume "
                      f"them: use another OUT, delete its checkpoints to start over, or set STAGE_ON_CHANGE=restart"
                      f"{adopt_hint}")
    if upstream and record.get("after") != upstream.get("stamp"):
        return "restart", f"{after_dir} was trained again since this stage started from it"
    if preflight:
        return "checked", "its checkpoints are of this configuration"
    done = progress(save_dir)
    if done is None:  # interval checkpoints but no checkpoint_last.pt: interrupted while saving
        return "restart", "no checkpoint_last.pt to resume from"
    where = reached(done, max_update, max_epoch)
    if where == "past":
        raise Refusal(f"{save_dir} was trained to update {done[0]} (epoch {done[1]} finished), past the budget "
                      f"asked now ({describe(max_update, max_epoch)}): its averaged checkpoints would not be the "
                      "stage's last; use another OUT, or delete its checkpoints to start over")
    if where == "at":
        return "skip", f"finished at update {done[0]} ({describe(max_update, max_epoch)})"
    return "resume", f"stopped at update {done[0]} of {describe(max_update, max_epoch)}"


def act(save_dir: str, decision: str, settings: Dict[str, str], config: Dict[str, Any], after_dir: str = "",
        launch: str = ""):
    """Make SAVE_DIR ready for the decision (the first node only): a restart removes the old
    checkpoints and averages; a start or restart records what the stage starts with; a resume
    keeps the record of the run that wrote the checkpoints and takes the new budget. With several
    nodes the record also carries the launch and the decision, which the others wait for
    (:func:`wait_for_decision`) instead of deciding on files the first node is changing."""
    os.makedirs(save_dir, exist_ok=True)
    path = os.path.join(save_dir, RECORD)
    record = read_json(path) or {}
    if launch and launch in record.get("launches", []):
        message = (f"LAUNCH_ID={launch} was used before for {save_dir}: the other nodes could follow that launch's "
                   "decision. Give every launch a new LAUNCH_ID (SLURM's is derived from the job, its step and "
                   "its restart count)")
        record.update(launch=launch, decision=f"refused: {message}", decided_at=time.time())
        write_json(path, record)
        raise Refusal(message)
    if decision == "restart":
        for old in checkpoints(save_dir) + glob.glob(os.path.join(save_dir, "averaged*.pt")):
            os.remove(old)
    if decision in ("start", "restart") or "config" not in record:
        upstream = read_json(os.path.join(after_dir, RECORD)) if after_dir else None
        record = {"settings": settings, "config": config, "after": (upstream or {}).get("stamp"),
                  "budget": _budget(config), "finished": False, "launches": record.get("launches", [])}
        write_json(path, record)
        if decision == "skip":  # adopted, and finished: a new stamp, so stages started from it restart
            stage_done(save_dir)
            record = read_json(path)
    elif decision == "resume":
        record.update(budget=_budget(config), finished=False)
        write_json(path, record)
    if launch:
        record = read_json(path)
        record.update(launch=launch, decision=decision, decided_at=time.time(),
                      launches=record.get("launches", []) + [launch])
        write_json(path, record)


#: how much earlier than a waiting node's start a decision may have been taken and still be this
#: launch's: torchrun's nodes are started by hand, one after the other, and their clocks differ; a
#: LAUNCH_ID reused sooner than this after a preemption is caught by the first node's refusal only
CLOCK_SLACK = 900.0


def wait_for_decision(save_dir: str, launch: str, timeout: float, poll: float = 2.0,
                      since: Optional[float] = None) -> str:
    """The decision the first node recorded for this launch (see :func:`act`); a refusal it
    recorded ends the wait at once. A decision recorded under the same LAUNCH_ID long before this
    node started is a stale one of an earlier launch, not this one's."""
    since = time.time() if since is None else since
    deadline = time.monotonic() + timeout
    while True:
        record = read_json(os.path.join(save_dir, RECORD)) or {}
        if (record.get("launch") == launch and record.get("decision")
                and record.get("decided_at", 0) >= since - CLOCK_SLACK):
            if record["decision"].startswith("refused: "):
                raise Refusal(f"the first node refused: {record['decision'][len('refused: '):]}")
            return record["decision"]
        if time.monotonic() > deadline:
            raise Refusal(f"waited {timeout:.0f} s for the first node to decide on {save_dir} (launch {launch})")
        time.sleep(poll)


def stage_done(save_dir: str):
    """The stage reached its budget: a new stamp, so that every stage started from an older one
    restarts."""
    path = os.path.join(save_dir, RECORD)
    record = read_json(path) or {}
    record.update(finished=True, stamp=uuid.uuid4().hex)
    write_json(path, record)


def finished_by_checkpoints(save_dir: str) -> Optional[str]:
    """Why SAVE_DIR's checkpoints make its stage finished (``checkpoint_last.pt`` at or past the
    recorded budget, and a ``checkpoint_best.pt``), or None."""
    record = read_json(os.path.join(save_dir, RECORD)) or {}
    budget = record.get("budget") or {}
    done = progress(save_dir)
    if done is None or not os.path.isfile(os.path.join(save_dir, "checkpoint_best.pt")):
        return None
    if not reached(done, budget.get("max_update"), budget.get("max_epoch")):
        return None
    return f"checkpoint_last.pt is at update {done[0]} ({describe(budget.get('max_update'), budget.get('max_epoch'))})"


def stage_end(save_dir: str, exit_code: int, first: bool = True, wait: float = 0, poll: float = 2.0) -> str:
    """After fairseq-train: mark the stage finished (the first node) and say how it ended, or
    refuse when it did not finish. A non-zero exit whose checkpoints finished the stage counts as
    finished, with a warning naming the exit code (every node prints it). Another node than the
    first may end before the first node's last save is written (only it writes checkpoints): it
    waits up to ``wait`` seconds for the checkpoints to finish the stage before it refuses, so that
    srun --kill-on-bad-exit does not kill the first node in the middle of that save."""
    if exit_code == 0:
        if first:
            stage_done(save_dir)
        return "finished"
    deadline = time.monotonic() + (0 if first else wait)
    why = finished_by_checkpoints(save_dir)
    while why is None and time.monotonic() < deadline:
        time.sleep(poll)
        why = finished_by_checkpoints(save_dir)
    if why is None:
        raise Refusal(f"fairseq-train failed with exit code {exit_code} before the stage finished "
                      f"(log: {save_dir}/train.log); a re-run resumes it")
    if first:
        stage_done(save_dir)
    return (f"WARNING: fairseq-train exited with code {exit_code} after the stage finished ({why}, "
            "checkpoint_best.pt written): counted as finished")
