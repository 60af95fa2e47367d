"""`snakemake` for run.sh with its imports already done: a process that has imported Snakemake,
the plugin and the workflow of one checkout forks for each call, and the child runs Snakemake's
own command line (``snakemake.cli.main``) with the caller's arguments, directory, environment and
standard streams. run.sh runs unchanged, as a user runs it; only the 3-5 s of imports each
``snakemake`` process pays are paid once. For dry runs of a checkout whose code does not change
while the process lives (a call refuses to run if a file it imported changed).

    with WarmSnakemake(root) as bin_dir:
        run_sh(root, work, "files", "study.yaml", "-n", env={"PATH": f"{bin_dir}:..."})
"""
import glob
import importlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

SHIM = """#!{python}
# recorded by tests/helpers/warm_snakemake.py: this call runs in a fork of its warm process
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect({socket_path!r})
request = {{"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ)}}
socket.send_fds(s, [json.dumps(request).encode()], [0, 1, 2])
status = s.recv(16)
sys.exit(int(status) if status else "warm snakemake: its process ended without a status")
"""


class WarmSnakemake:
    """A warm Snakemake for the checkout ``root``: entering starts it and returns a directory holding
    a ``snakemake`` command to put first on PATH; leaving stops it."""

    def __init__(self, root):
        self.root = os.path.abspath(str(root))

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="warm_snakemake_")
        socket_path = os.path.join(self.dir, "socket")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([self.root, os.path.join(self.root, "recipes")]),
               "OMP_NUM_THREADS": "1"}
        self.server = subprocess.Popen([sys.executable, __file__, socket_path, self.root], env=env,
                                       start_new_session=True)
        deadline = time.time() + 120
        while not os.path.exists(socket_path + ".ready"):
            if self.server.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"warm snakemake did not start (status {self.server.poll()})")
            time.sleep(0.1)
        shim = os.path.join(self.dir, "snakemake")
        with open(shim, "w") as f:
            f.write(SHIM.format(python=sys.executable, socket_path=socket_path))
        os.chmod(shim, 0o755)
        return self.dir

    def __exit__(self, *exc):
        os.killpg(self.server.pid, signal.SIGKILL)
        self.server.wait()


def _prewarm(root):
    """Import what a dry run of the Snakefile imports, and read the checkout's sources once: the
    files read, with their times, for the staleness check."""
    import snakemake.api  # noqa: F401
    import snakemake.cli  # noqa: F401
    import fairseq_posenc  # noqa: F401
    from posenc_workflow import sources

    for path in glob.glob(os.path.join(root, "recipes", "posenc_workflow", "*.py")):
        name = os.path.basename(path)[:-3]
        if name != "__init__":
            importlib.import_module(f"posenc_workflow.{name}")
    every = [p for d in ("fairseq_posenc", "recipes", "scripts")
             for p in glob.glob(os.path.join(root, d, "**", "*.py"), recursive=True)]
    sources.sources(*every, root=root)
    loaded = {os.path.abspath(m.__file__) for m in list(sys.modules.values()) if getattr(m, "__file__", None)}
    read = {p for p in loaded | set(every) if p.startswith(root + os.sep) and os.path.isfile(p)}
    return {p: os.stat(p).st_mtime_ns for p in read}


def _child(conn, read, root_logging):
    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    request = json.loads(message)
    for fd, target in zip(fds, (0, 1, 2)):
        os.dup2(fd, target)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # the root logger as a fresh process has it: an import's logging.basicConfig (fairseq's) would
    # print Snakemake's messages a second time
    logging.root.handlers[:], level = root_logging
    logging.root.setLevel(level)
    changed = [p for p, t in read.items() if not os.path.exists(p) or os.stat(p).st_mtime_ns != t]
    if changed:
        print(f"warm snakemake: {changed[0]} changed since its process imported it", file=sys.stderr)
        return 1
    sys.argv = request["argv"]
    import snakemake.workflow
    from snakemake.cli import main

    # what Snakemake reads from the process at import: its run directory
    snakemake.workflow.Workflow._rundir = os.getcwd()
    try:
        main(sys.argv[1:])
    except SystemExit as end:
        if isinstance(end.code, str):
            print(end.code, file=sys.stderr)
            return 1
        return end.code or 0
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def serve(socket_path, root):
    root_logging = (list(logging.root.handlers), logging.root.level)
    read = _prewarm(root)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(socket_path)
    server.listen(8)
    open(socket_path + ".ready", "w").close()
    while True:
        conn, _ = server.accept()
        if os.fork() == 0:
            server.close()
            status = 1
            try:
                status = _child(conn, read, root_logging)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                conn.send(str(status).encode())
                os._exit(0)
        conn.close()
        while True:  # the children that ended
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break


if __name__ == "__main__":
    serve(*sys.argv[1:])
