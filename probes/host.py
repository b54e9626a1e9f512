"""The host a probe looks at: roots and the command runner are parameters, so a unit test can build
a fake host in tmp_path and an integration test can use the real one (psutil's PROCFS_PATH idea)."""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from sandbox_conformance.processes.children import Completed, Runner, run

# A trial that misses its budget is tried once more with this many times the budget, before it is
# unknown: a slow host (a TCG guest while the host is busy) misses 10 s where a live one answers
# in 12 (issue 28: the userns rung timed out at 10.9 s and 12.1 s in the host-shape lab under
# two CPU-bound processes). A trial that hangs costs 10 + 30 s, once: a hung rung ends the ladder.
RETRY_FACTOR = 3.0


class _HostFields(NamedTuple):
    root: Path  # the filesystem root marker files are looked up under
    proc: Path
    sys: Path
    env: Mapping[str, str]
    runner: Runner
    euid: int
    # When set, trials run as this user (through setpriv), not as ourselves: `probe --as-user`.
    as_user: str | None
    timeout: float


class Host(_HostFields):
    """The host a probe looks at (see the module doc): where its /, /proc and /sys are, its environment and
    euid, and how its trials run. A test builds a fake one in tmp_path. `env` and `euid` default to this
    process's, read when the Host is made."""

    __slots__ = ()

    def __new__(cls, root: Path = Path("/"), proc: Path = Path("/proc"), sys: Path = Path("/sys"),
                env: Mapping[str, str] | None = None, runner: Runner = run, euid: int | None = None,
                as_user: str | None = None, timeout: float = 10.0) -> Host:
        return super().__new__(cls, root, proc, sys, dict(os.environ) if env is None else env, runner,
                               os.geteuid() if euid is None else euid, as_user, timeout)

    def _replace(self, **changes: Any) -> Host:
        # NamedTuple's own _replace builds the tuple directly, past the defaults above.
        return Host(**{**self._asdict(), **changes})

    def path(self, absolute: str) -> Path:
        """A host-absolute path under this host's root."""
        return self.root / absolute.lstrip("/")

    def read(self, path: Path) -> str:
        return path.read_text(errors="replace")

    def which(self, name: str) -> str | None:
        """Resolve through PATH as given, dropping relative entries: a binary in the current directory
        must never stand in for the system one (bubblewrap's own advice for setuid installs)."""
        path = self.env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        safe = os.pathsep.join(p for p in path.split(os.pathsep) if p.startswith("/"))
        found = shutil.which(name, path=safe)
        return os.path.realpath(found) if found else None

    def trial(self, argv: list[str], *, timeout: float, **kw: Any) -> Completed:
        """Run one trial with `timeout`, and once more with RETRY_FACTOR times it if it timed out. The
        result's seconds are both tries' (what the wait cost)."""
        done = self.runner(argv, timeout=timeout, **kw)
        if not done.timed_out:
            return done
        again = self.runner(argv, timeout=timeout * RETRY_FACTOR, **kw)
        return again._replace(seconds=done.seconds + again.seconds)

    @property
    def trial_prefix(self) -> tuple[str, ...]:
        """argv prefix that makes a trial run as the probed user rather than as us."""
        if self.as_user is None:
            return ()
        # The primary group by number: setpriv reads --regid=NAME as a group name, and a user whose
        # primary group has another name (nobody: nogroup) has no group of its own name (issue 28).
        return ("setpriv", f"--reuid={self.as_user}", f"--regid={primary_gid(self.as_user)}",
                "--init-groups", "--inh-caps=-all", "--reset-env", "--")

    @property
    def user(self) -> str:
        if self.as_user:
            return self.as_user
        try:
            return pwd.getpwuid(self.euid).pw_name
        except KeyError:
            return str(self.euid)


def primary_gid(user: str) -> int | str:
    """`user`'s primary gid from the passwd database, or the name itself when there is no such user
    (setpriv then says so)."""
    try:
        return pwd.getpwnam(user).pw_gid
    except KeyError:
        return user
