"""Every signal this process sends to end another one, with why: so that how a launcher ended can be
told as ours or not (issue 28: a launcher under load ended `exited 137; stderr: (empty)`, and nothing
said whether our timeout, our stop, the observer's leftover kill or something else sent that SIGKILL).

    kills.killpg(pgid, signal.SIGKILL, "timeout")      # sends it, and records it
    kills.ended(done)                                  # "killed by SIGKILL (sent by ...)" or "... not by us"

What is not here was not sent by this process: the guardian (which acts only once we are dead), another
run's sweep (processes/owner.py kill_naming, in its own process; this run's own sweep is recorded
here), the kernel (the OOM killer logs in the kernel's log, `dmesg`), a parent-death signal, or a
process of the sandbox's own. A write to cgroup.kill is recorded with target 0: the kernel signals
every process in the cgroup."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import threading
import time
from typing import NamedTuple


class Sent(NamedTuple):
    target: int  # a pid, -pgid for a process group, 0 for every process of a cgroup (cgroup.kill)
    signum: int
    reason: str
    at: float  # time.monotonic()

    def line(self) -> str:
        who = (f"process group {-self.target}" if self.target < 0 else f"pid {self.target}" if self.target
               else "a cgroup")
        return f"{signal.Signals(self.signum).name} to {who} ({self.reason})"


# A stopped child group gets this long between SIGTERM and SIGKILL (run.stop, cancel's stop of every
# group): enough for a witness run of ours to remove its layout and leaves, or an OCI launcher to
# delete its container.
STOP_GRACE = 10.0

_lock = threading.Lock()
_sent: collections.deque[Sent] = collections.deque(maxlen=4096)


def record(target: int, signum: int, reason: str) -> None:
    with _lock:
        _sent.append(Sent(target, int(signum), reason, time.monotonic()))


def kill(pid: int, signum: int, reason: str) -> None:
    """os.kill, recorded; a process already gone is no error."""
    record(pid, signum, reason)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def killpg(pgid: int, signum: int, reason: str) -> None:
    """os.killpg, recorded; a group already gone is no error."""
    record(-pgid, signum, reason)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def between(start: float, end: float) -> list[Sent]:
    with _lock:
        return [s for s in _sent if start <= s.at <= end]


def ended(returncode: int, pid: int | None, start: float, end: float) -> str:
    """How a launcher that did not exit 0 ended, for a harness error: its exit, the signal behind it
    (-N: that signal ended the launcher; 128+N: the launcher, a shell or bwrap, reports that signal
    ended the process it waited for, the task), and whether this process sent such a signal to it,
    its group, or anything else while it ran."""
    signum = -returncode if returncode < 0 else returncode - 128 if 128 < returncode < 128 + 65 else None
    if signum is None:
        return f"exited {returncode}"
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"exited {returncode}"
    if returncode < 0:
        what = f"killed by {name}"
    else:
        what = f"exited {returncode} (128 + {name}: the process it waited for, the task, was killed by it)"
    ours = [s for s in between(start, end) if s.signum == signum]
    if pid is not None:
        mine = [s for s in ours if s.target in (pid, -pid)]
        ours = mine or ours
    if ours:
        return f"{what}; the harness sent {'; '.join(s.line() for s in ours[-3:])}"
    return (f"{what}; not sent by the harness (no {name} from this run while it ran: not our timeout, "
            "stop or leftover kill): another process, a parent-death signal, or the kernel (the OOM "
            "killer logs in dmesg)")
