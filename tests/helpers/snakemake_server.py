"""Snakemake runs in a warm process. A Snakemake process pays its imports (Snakemake's, then the
plugin's torch and fairseq: 3-5 s of a dry run's 8), so tests hand their calls here, each as
snakemake_runs.snakemake_call() or run_sh_call() builds it. Each command runs with the stand-in
snakemake of stubs/record first on PATH (run.sh runs as a user runs it, up to its `exec
snakemake`), which records the call; a Python process kept for the test worker (one per
PYTHONPATH: one checkout's packages) then runs Snakemake's own command line as a fresh process
would: in its working directory, with its environment and arguments (its log prints them), the
workflow's package imported anew. Its jobs are processes of their own, as ever. A job that kills
its process group (STUB_KILL_GROUP) kills that process, as it kills a snakemake of its own: the
call returns its signal and the next call starts another. The plugin stays imported: a test that
edits the plugin of the checkout it runs (test_workflow_code) runs Snakemake of its own."""
import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile

RECORD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stubs", "record")
_SERVERS = {}  # PYTHONPATH: the process, the last used last
KEPT = 2


def run(command, kwargs, timeout=900):
    """subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs), its
    Snakemake run in the warm process."""
    call = _recorded(command, kwargs, timeout)
    if not isinstance(call, dict):
        return call
    key = call["env"].get("PYTHONPATH", "")
    server = _SERVERS.pop(key, None)
    while len(_SERVERS) >= KEPT:  # the longest unused goes: each holds torch and fairseq
        _close(_SERVERS.pop(next(iter(_SERVERS))))
    if server is None or server.poll() is not None:
        server = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**call["env"], "OMP_NUM_THREADS": "1"}, cwd=call["cwd"], start_new_session=True)
    _SERVERS[key] = server
    with tempfile.TemporaryDirectory() as tmp:
        call["out"] = tmp
        server.stdin.write(json.dumps(call) + "\n")
        server.stdin.flush()
        if not select.select([server.stdout], [], [], timeout)[0]:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
            raise subprocess.TimeoutExpired(["snakemake", *call["argv"]], timeout)
        line = server.stdout.readline()
        # EOF: the process was killed (its group, by a job); its code is the signal's
        code = json.loads(line) if line else server.wait()
        out, err = (open(os.path.join(tmp, name), encoding="utf-8", errors="replace").read() if os.path.exists(
            os.path.join(tmp, name)) else "" for name in ("out", "err"))
    return subprocess.CompletedProcess(["snakemake", *call["argv"]], code, out, err)


def runs(calls, timeout=900):
    """run() for each (command, kwargs) of ``calls``, in order."""
    return [run(command, kwargs, timeout) for command, kwargs in calls]


def snakemake(workdir, study, *args, env=None, timeout=300, stub=True, **options):
    """snakemake_runs.snakemake(), in the warm process."""
    from helpers.snakemake_runs import snakemake_call

    return run(*snakemake_call(workdir, study, *args, env=env, stub=stub, **options), timeout=timeout)


def run_sh(root, workdir, corpus, *args, timeout=900, env=None, stub=False):
    """snakemake_runs.run_sh(), its Snakemake in the warm process."""
    from helpers.snakemake_runs import run_sh_call

    return run(*run_sh_call(root, workdir, corpus, *args, env=env, stub=stub), timeout=timeout)


def _close(server):
    if server.poll() is None:
        server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@atexit.register
def _close_all():
    while _SERVERS:
        _close(_SERVERS.popitem()[1])


def _recorded(command, kwargs, timeout):
    """The call to snakemake that ``command`` makes (run with the recorder first on PATH, unless
    it is snakemake), or where it makes none (run.sh refused first) its own result."""
    env = kwargs.get("env") or dict(os.environ)
    if os.path.basename(command[0]) == "snakemake":  # snakemake_call()'s: the call itself
        return {"cwd": str(kwargs.get("cwd") or os.getcwd()), "argv": [str(a) for a in command[1:]], "env": dict(env)}
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as record:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              **{**kwargs, "env": {**env, "PATH": f"{RECORD}:{env['PATH']}",
                                                   "SNAKEMAKE_RECORD": record.name}})
        calls = [json.loads(line) for line in record.read().splitlines()]
    if not calls:
        return proc
    (call,) = calls
    assert proc.returncode == 0, proc.stdout + proc.stderr
    call["env"]["PATH"] = call["env"]["PATH"].replace(f"{RECORD}:", "", 1)
    del call["env"]["SNAKEMAKE_RECORD"]
    return call


def _serve():
    """The warm process: for each call read (a JSON line), ``snakemake ARGV`` as a process of its
    own would run it, its output in the call's directory; then its exit code (a JSON line)."""
    import snakemake.cli

    # the path Snakemake's log prints as its command, as the shell found it
    program = os.path.join(os.path.dirname(sys.executable), "snakemake")
    path = [os.path.dirname(program)] + sys.path[1:]  # a script's directory first, as there
    for line in sys.stdin:
        call = json.loads(line)
        for name in [m for m in sys.modules if m == "posenc_workflow" or m.startswith("posenc_workflow.")]:
            del sys.modules[name]  # each run parses its study anew, the package's caches with it
        os.chdir(call["cwd"])
        os.environ.clear()
        os.environ.update(call["env"])
        sys.path[:], sys.argv = list(path), [program, *call["argv"]]
        saved = []
        sys.stdout.flush(), sys.stderr.flush()
        for fd, name in ((1, "out"), (2, "err")):
            saved.append(os.dup(fd))
            out = os.open(os.path.join(call["out"], name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out, fd)
            os.close(out)
        try:
            snakemake.cli.main(call["argv"])
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            for fd, old in zip((1, 2), saved):
                os.dup2(old, fd)
                os.close(old)
        print(json.dumps(code), flush=True)


if __name__ == "__main__":
    _serve()
