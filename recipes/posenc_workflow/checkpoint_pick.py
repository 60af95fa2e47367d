"""The checkpoint a training goes on from: checkpoint_last.pt, or where a kill truncated it the newest
intact checkpoint of its directory. fairseq writes only the first file of a save atomically (the
interval or epoch checkpoint) and copies it to checkpoint_best.pt and checkpoint_last.pt: a job
killed during a copy (its time limit, a preemption) leaves a checkpoint_last.pt that no try could
read, and every retry would fail the same way."""
import glob
import os
import shutil
from typing import Callable, Optional, Tuple

Progress = Tuple[int, int]


def intact_last(save_dir: str, read: Callable[[str], Progress]) -> Optional[Progress]:
    """``read`` of ``save_dir``/checkpoint_last.pt (None: there is none). One that cannot be read
    is kept aside as checkpoint_last.pt.truncated and replaced by a copy of the newest checkpoint
    that can (by updates, then epochs), said in one line; none: training starts from scratch."""
    last = os.path.join(save_dir, "checkpoint_last.pt")
    if not os.path.isfile(last):
        return None
    try:
        return read(last)
    except Exception as error:  # torch raises what the truncation hits: EOFError, RuntimeError, ...
        broken = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    newest = None
    for path in glob.glob(os.path.join(save_dir, "checkpoint*.pt")):
        if path == last:
            continue
        try:
            progress = read(path)
        except Exception:  # truncated too (a copy of the same save): skipped
            continue
        if newest is None or progress > newest[0]:
            newest = (progress, path)
    os.replace(last, last + ".truncated")
    if newest is None:
        print(f"| {last} cannot be read ({broken}), and no other checkpoint can: kept as "
              "checkpoint_last.pt.truncated, training from scratch", flush=True)
        return None
    shutil.copyfile(newest[1], last + ".tmp")
    os.replace(last + ".tmp", last)
    print(f"| {last} cannot be read ({broken}): kept as checkpoint_last.pt.truncated, going on from "
          f"{os.path.basename(newest[1])} (update {newest[0][0]}), the newest intact checkpoint", flush=True)
    return newest[0]
