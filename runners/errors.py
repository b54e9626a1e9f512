"""The one exit path for usage errors and refusals. Only CLI code calls these."""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_DID_NOT_RUN = 75  # EX_TEMPFAIL (sysexits.h): nothing was tested; not a red suite


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


def die(message: str, *, hint: str | None = None) -> NoReturn:
    print(f"sandbox-conformance: {message}", file=sys.stderr)
    if hint:
        print(f"  hint: {hint}", file=sys.stderr)
    sys.exit(EXIT_USAGE)


def refuse(reason: str, *, ways_on: Sequence[str] = ()) -> NoReturn:
    print(f"sandbox-conformance: refused: {reason}", file=sys.stderr)
    for way in ways_on:
        print(f"  way on: {way}", file=sys.stderr)
    sys.exit(EXIT_DID_NOT_RUN)


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
