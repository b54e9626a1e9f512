"""What the adapters whose engines leave state behind share (oci, podman, nspawn): a guardian that cleans
up when the launcher is killed outright, and the container run bounded, a stop signal unwinding through
the same clean-up as a normal exit.

The guardian lives in a session of its own (the harness's group kill must not reach it) and holds the
read end of a pipe whose write end only the launcher holds (os.pipe fds are not inherited, PEP 446): the
engine and the container never see it. When the launcher dies, however it dies, the guardian reads EOF
and cleans up what the launcher wrote on the pipe it would clean."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sandbox_conformance.processes import children

# The witness's own launch timeout is 30 s by default: the container is stopped, and cleaned up, first.
RUN_TIMEOUT = 25.0


def start_guardian(module: str, *guardian_args: str) -> tuple[subprocess.Popen[bytes], int]:
    """`python -m MODULE --guard ARGS` in a session of its own, reading a pipe: (it, the write end)."""
    r, w = os.pipe()
    try:
        guardian = subprocess.Popen(
            [sys.executable, "-m", module, "--guardian", *guardian_args],
            stdin=r, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
    finally:
        os.close(r)
    return guardian, w


# A clean-up command (`runc delete --force`, `podman rm --force`) may hang on a frozen container.
CLEANUP_TIMEOUT = 20.0


def tell(pipe: int, workspace: Path, cid: str) -> None:
    """Name the workspace and the container to the guardian: one JSON line (a path may hold spaces)."""
    os.write(pipe, (json.dumps([str(workspace), cid]) + "\n").encode())


def told(prefix: str) -> tuple[Path, str] | None:
    """In the guardian: the workspace and container the launcher named on stdin (see `tell`), or None
    when the line is not ours (a workspace not named `prefix`...)."""
    try:
        named = json.loads(sys.stdin.buffer.readline())
    except ValueError:
        return None
    if not (isinstance(named, list) and len(named) == 2 and all(isinstance(x, str) for x in named)):
        return None
    workspace, cid = Path(named[0]), named[1]
    return (workspace, cid) if workspace.name.startswith(prefix) else None


def run_cleanup(argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    """A clean-up command, bounded (processes/children.py run: a session of its own, its whole group
    killed at CLEANUP_TIMEOUT): the clean-up after it (the workspace's removal) runs whatever it did."""
    done = children.run(argv, timeout=CLEANUP_TIMEOUT, env=env)
    if done.timed_out:
        name = os.path.basename(argv[0])
        print(f"clean-up {name}: no end after {CLEANUP_TIMEOUT:g}s: killed", file=sys.stderr)


def run_with_guardian(
    argv: Sequence[str],
    *,
    what: str,
    guardian: subprocess.Popen[bytes],
    pipe: int,
    cleanup: Callable[[], None],
    prepare: Callable[[], None] = lambda: None,
    env: Mapping[str, str] | None = None,
) -> int:
    """`prepare()`, then run `argv` to its end (at most RUN_TIMEOUT: 124), then `cleanup()` and release
    the guardian, whatever happened: SIGTERM, SIGINT and SIGHUP unwind through it (128 + the signal)."""
    proc: subprocess.Popen[bytes] | None = None
    # From the fork to `proc` known, a stop signal waits: raised inside Popen, it left the engine's
    # client running while cleanup() removed its bundle and state from under it.
    starting: list[int] = []
    held: list[int] = []

    def stop(signum: int, _frame: Any) -> None:
        if starting:
            held.append(signum)
            return
        raise SystemExit(128 + signum)  # unwinds through the finally below

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        prepare()
        starting.append(1)
        try:
            proc = subprocess.Popen(list(argv), env=dict(env) if env is not None else None)
        finally:
            starting.clear()
        if held:
            raise SystemExit(128 + held[0])
        return proc.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        print(f"{what}: the container did not finish within {RUN_TIMEOUT:.0f}s", file=sys.stderr)
        return 124
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        cleanup()
        os.close(pipe)  # the guardian wakes, finds nothing left to do, and exits
        guardian.wait(timeout=30)
        for sig, handler in old.items():
            signal.signal(sig, handler)
