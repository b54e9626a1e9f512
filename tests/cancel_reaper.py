"""Runs a command as the child of a subreaper and reports what of it outlived it (tests/test_cancel.py).

    python tests/cancel_reaper.py --linger 30 --stdout FILE --stderr FILE -- ARGV...

Prints `{"top": PID}` once the command has started; the test signals that pid. Once the command has
exited, waits until every process it left has gone (at most --linger seconds), then prints
`{"status": RETURNCODE, "left": [[pid, cmdline], ...], "seconds": S, "reaped": [[pid, RETURNCODE], ...]}`
(`reaped`: each orphan this reaper collected, with how it ended: a negative code is the signal that
killed it; `ended`: time.monotonic() when the command exited) and kills whatever was left, so
a red test leaks nothing. As a child subreaper (PR_SET_CHILD_SUBREAPER, prctl(2)) it inherits every
orphan of the command, a double-forked daemon or a SIGKILLed harness's children alike: `left` is
everything of the run still alive, observed from outside the run (an oracle independent of the
harness's own account). A container's processes are the engine's children, not the run's: the
tests ask the engine about those."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import prctl


def descendants(me: int) -> list[tuple[int, str]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2:].split()
        if rest[0] in ("Z", "X"):
            continue
        children.setdefault(int(rest[1]), []).append(int(entry.name))
    out, todo = [], list(children.get(me, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            cmd = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        out.append((pid, cmd.decode(errors="replace").strip()))
    return sorted(out)


def reap(reaped: list[list[int]]) -> None:
    with contextlib.suppress(ChildProcessError):
        while True:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid <= 0:
                return
            reaped.append([pid, os.waitstatus_to_exitcode(status)])


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--linger", type=float, default=30.0)
    p.add_argument("--stdout", required=True)
    p.add_argument("--stderr", required=True)
    p.add_argument("argv", nargs=argparse.REMAINDER)
    a = p.parse_args()
    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    prctl.set_child_subreaper(True)
    with open(a.stdout, "wb") as out, open(a.stderr, "wb") as err:
        top = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
    print(json.dumps({"top": top.pid}), flush=True)
    status = top.wait()
    ended = time.monotonic()  # CLOCK_MONOTONIC is the machine's: a caller compares it with its own
    reaped: list[list[int]] = []
    reap(reaped)
    left = descendants(os.getpid())
    while left and time.monotonic() < ended + a.linger:
        time.sleep(0.1)
        reap(reaped)
        left = descendants(os.getpid())
    reap(reaped)
    print(json.dumps({"status": status, "left": left, "seconds": round(time.monotonic() - ended, 2),
                      "reaped": reaped, "ended": ended}), flush=True)
    for pid, _ in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    reap([])
    return 0


if __name__ == "__main__":
    sys.exit(main())
