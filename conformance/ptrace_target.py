"""The process outside the sandbox that the task must not ptrace (the `ptrace_outside` door).

The harness itself was the target, and that made the door vacuous in two common shapes: under
`--as-user` the harness is root and the task is not, so the kernel's credential check refuses the
attach whatever the sandbox does (kernel/ptrace.c __ptrace_may_access); and under Yama's
ptrace_scope 1 (Ubuntu's default, CI runners) only a process's descendants may attach to it, and the
harness is the task's ancestor. A sandbox that let its task trace host processes was kept.

So the target is a process of its own, outside every sandbox, running as the task's user, that lets
any process attach (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY): Yama's exception,
Documentation/admin-guide/LSM/Yama.rst). Only the sandbox stands between the task and it. It reads
its stdin until EOF: the harness's end closes when the session does, or when the harness dies
however it dies. (No PR_SET_PDEATHSIG: it fires when the THREAD that forked the target exits, and a
target gone early would make the door vacuous again, ESRCH read as a refusal.)

Where Yama refuses every attach (`kernel.yama.ptrace_scope` 2 or 3: CAP_SYS_PTRACE only, or none),
no sandbox has anything to refuse: the task's door says so (absent), never a refusal."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple

READY_SECONDS = 30.0  # a python3 start, on a loaded 2-core host
STOP_SECONDS = 2.0
# Runs under `python3 -I -S`: stdlib only. PR_SET_PTRACER fails with EINVAL where Yama is not built in,
# where no exception is needed: ignored.
PROGRAM = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(0x59616d61, ctypes.c_ulong(2 ** 64 - 1), 0, 0, 0)  # PR_SET_PTRACER, PR_SET_PTRACER_ANY
sys.stdout.write("ready\n")
sys.stdout.flush()
sys.stdin.buffer.read()
"""


class Target(NamedTuple):
    pid: int
    cmdline: tuple[str, ...]
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        """EOF on its stdin ends it; a target that does not go is killed with its group."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start(prefix: Sequence[str] = ()) -> Target | None:
    """The target, run under `prefix` (conformance/launch.py as_user_prefix: the task's user), or None
    when it could not be started or did not say it was ready (the door then targets the harness)."""
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    argv = [*prefix, python, "-I", "-S", "-c", PROGRAM]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None
    assert proc.stdout is not None
    deadline = time.monotonic() + READY_SECONDS
    line = b""
    while not line.endswith(b"\n") and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(proc.stdout.fileno(), 64)
        if not chunk:
            break
        line += chunk
    target = Target(proc.pid, (python, "-I", "-S", "-c", PROGRAM), proc)
    if line != b"ready\n":
        target.stop()
        return None
    return target
