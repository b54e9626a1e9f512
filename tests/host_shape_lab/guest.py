"""What every lab guest program beside this one needs: a command run in its own session with a
timeout (its whole process group killed on it), and a file read. The programs run alone under
`python3 -I -S` in a guest, stdlib only; -I leaves their own directory off sys.path, so each puts it
back before importing this."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time


def hide_engines() -> None:
    """This guest sees the host's root, where podman is installed for its adapter (scripts/test-tier-deps):
    every `run` here would probe it with `podman info`, seconds of CPU under TCG that starved the shapes'
    own trials into timeouts. /dev/null bound over it, in the guest's mount table only (the host's file is
    untouched), is no executable on PATH. The lab's container shape starts its own dockerd instead."""
    for path in ("/usr/bin/podman",):
        if os.path.exists(path):
            subprocess.run(["mount", "--bind", "/dev/null", path], check=False, timeout=30,
                           stdin=subprocess.DEVNULL, capture_output=True)


def run(argv: list[str], *, timeout: float, env: dict[str, str] | None = None, cwd: str | None = None,
        stdin: str | None = None, log: bool = False) -> dict[str, object]:
    """argv's exit code (None: killed at `timeout`), its output and its seconds; `log`: one line on
    stderr per command, which the host shows live (a long boot must not look hung)."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            text=True, start_new_session=True, env=env, cwd=cwd)
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    seconds = round(time.monotonic() - started, 1)
    if log:
        print(f"lab: {shlex.join(argv)[:160]}: rc {rc}, {seconds}s", file=sys.stderr, flush=True)
    return {"argv": argv, "rc": rc, "stdout": out, "stderr": err, "seconds": seconds}


def sh(script: str, *, timeout: float, env: dict[str, str] | None = None,
       stdin: str | None = None) -> dict[str, object]:
    """A shell script, as run() runs argv; the record names the script."""
    done = run(["/bin/sh", "-c", script], timeout=timeout, env=env, stdin=stdin)
    del done["argv"]
    return {"script": script, **done}


def read(path: str, *, error_as_text: bool = False) -> str | None:
    """The file's text, stripped; when it cannot be read, None, or with error_as_text the error's
    class as `!FileNotFoundError` (a report then says why a value is missing)."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as e:
        return f"!{e.__class__.__name__}" if error_as_text else None
