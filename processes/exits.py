"""Exit codes, and the two exceptions CLI code raises for bad input and refusals: commands/cli.py
turns them into exit 2 and 75 with one line (and the ways on), so no subcommand prints a traceback.

`Refusal` is the one shape of "did not run, with the reason" (issue 30): a mode that cannot be used
(runners/container.py ContainerUnusable, runners/vm/qemu.py VmUnusable are kinds of it), a refused
decision at its boundary (runners/decide.py Decision.chosen), a launcher that says its sandbox cannot
run here. `run` catches its own to write them into its verdict document (runners/orchestrate.py)."""

from __future__ import annotations

import grp
import math
import os
import pwd
import signal
from collections.abc import Sequence

EXIT_OK = 0
EXIT_FAIL = 1  # the suite (or a tier) ran and went red, or gave no verdict
EXIT_USAGE = 2  # bad input: one line, nothing ran
EXIT_UNAVAILABLE = 75  # EX_TEMPFAIL (sysexits.h): nothing was tested here; not a red suite
# Stopped by a signal (docs/cancellation.md): the shell's 128 + N, which processes/cancel.py exits with.
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

    def __init__(self, reason: str, ways_on: Sequence[str] = (), *, because: Sequence[str] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.ways_on = tuple(ways_on)
        self.because = tuple(because)  # further reasons (a refused decision's), said after the first


def check_as_user(name: str | None, *, how: str = "tasks are launched through setpriv",
                  group_by_name: bool = True) -> None:
    """`--as-user NAME` is root only (switching user needs CAP_SETUID) and names a real user.
    `group_by_name`: the tasks' launch names the primary group by the user's name (conformance/launch.py
    as_user_prefix: `setpriv --regid=NAME`), so a group of that name must exist and be that group."""
    if name is None:
        return
    if name == "":
        raise UsageError("--as-user: expected a user name, got an empty string")
    if os.geteuid() != 0:
        raise UsageError(f"--as-user needs root ({how})")
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        raise UsageError(f"--as-user: no such user {name!r}") from None
    if group_by_name:
        problem = group_problem(user)
        if problem:
            raise UsageError(f"--as-user {name}: {problem}")


def group_problem(user: pwd.struct_passwd) -> str | None:
    """Why `setpriv --regid=NAME` cannot give `user` its primary group, or None. Said up front: every
    launch would otherwise fail with `setpriv: failed to parse regid` (issue 28; `nobody`, whose
    primary group is `nogroup`)."""
    try:
        group = grp.getgrnam(user.pw_name)
    except KeyError:
        try:
            named = grp.getgrgid(user.pw_gid).gr_name
        except KeyError:
            named = str(user.pw_gid)
        return (f"its primary group ({named}) has another name and no group is named {user.pw_name}: "
                "tasks are launched with setpriv --regid=USER; pick a user with a group of its own name")
    if group.gr_gid != user.pw_gid:
        return (f"the group named {user.pw_name} (gid {group.gr_gid}) is not its primary group "
                f"(gid {user.pw_gid}): tasks would run with the wrong group")
    return None


# The longest wait a timeout may ask for: a day. Past it a number is a typo or an overflow (`1e308`
# seconds makes deadline arithmetic inf, and threading's waits raise OverflowError), and `inf` and `nan`
# pass a `<= 0` check (nan compares false with everything): issue 28.
MAX_SECONDS = 86400.0


def seconds_ok(seconds: float) -> bool:
    """A finite, positive number of seconds, at most MAX_SECONDS."""
    return math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS


def check_seconds(flag: str, seconds: float) -> float:
    if not seconds_ok(seconds):
        raise UsageError(f"{flag} {seconds:g}: expected a positive number of seconds, "
                         f"at most {MAX_SECONDS:g}")
    return seconds
