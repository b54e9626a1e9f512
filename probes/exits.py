"""Exit codes, and the two exceptions CLI code raises for bad input and refusals: commands/cli.py
turns them into exit 2 and 75 with one line (and the ways on), so no subcommand prints a traceback."""

from __future__ import annotations

import os
import pwd
import signal
from collections.abc import Sequence
from pathlib import Path

EXIT_OK = 0
EXIT_FAIL = 1  # the suite (or a tier) ran and went red, or gave no verdict
EXIT_USAGE = 2  # bad input: one line, nothing ran
EXIT_UNAVAILABLE = 75  # EX_TEMPFAIL (sysexits.h): nothing was tested here; not a red suite
# Stopped by a signal (docs/cancellation.md): the shell's 128 + N, which probes/cancel.py exits with.
EXIT_SIGHUP = 128 + signal.SIGHUP  # 129
EXIT_SIGINT = 128 + signal.SIGINT  # 130
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143
# The verdict line's word for each (`sandbox-conformance: PASS mode=native exit=0`), also a stage's
# end word on a terminal (runners/progress.py).
VERDICT_WORDS = {EXIT_OK: "PASS", EXIT_FAIL: "FAIL", EXIT_UNAVAILABLE: "REFUSED", EXIT_USAGE: "ERROR"}


class UsageError(Exception):
    """Bad input: becomes exit 2 with this one line, never a traceback."""


class Refusal(Exception):
    """Running here would be unsafe or meaningless: exit 75 with the reason and the ways on."""

    def __init__(self, reason: str, ways_on: Sequence[str] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.ways_on = tuple(ways_on)


def check_as_user(name: str | None, *, how: str = "tasks are launched through setpriv") -> None:
    """`--as-user NAME` is root only (switching user needs CAP_SETUID) and names a real user."""
    if not name:
        return
    if os.geteuid() != 0:
        raise UsageError(f"--as-user needs root ({how})")
    try:
        pwd.getpwnam(name)
    except KeyError:
        raise UsageError(f"--as-user: no such user {name!r}") from None


def check_writable(flag: str, value: str) -> None:
    """An output file that cannot be written is bad input, said before the suite runs (not a traceback
    after it, with a PASS already printed)."""
    path = Path(value)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UsageError(f"{flag} {value}: is a directory")
    if not parent.is_dir():
        raise UsageError(f"{flag} {value}: no such directory {parent}")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{flag} {value}: not writable")
