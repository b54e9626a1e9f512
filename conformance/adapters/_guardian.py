"""What the adapters whose engines leave state behind share (oci, podman, nspawn): a guardian that cleans
up when the launcher is killed outright, and the container run bounded, a stop signal unwinding through
the same clean-up as a normal exit.

The guardian lives in a session of its own (the harness's group kill must not reach it) and holds the
read end of a pipe whose write end only the launcher holds (os.pipe fds are not inherited, PEP 446): the
engine and the container never see it. When the launcher dies, however it dies, the guardian reads EOF
and cleans up what the launcher wrote on the pipe it would clean."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

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

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds through the finally below

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        prepare()
        proc = subprocess.Popen(list(argv), env=dict(env) if env is not None else None)
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
