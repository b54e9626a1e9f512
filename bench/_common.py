"""What every bench here shares: where the venv is, one way to time a command, interleaved sides, the
median, and the one line a ratio is printed as.

Each figure is the wall time of a whole process, started as a user or CI starts it (processes/children.py's
wrapper: a timeout, the process group killed, a minimal environment). Sides are interleaved (A, B, A,
B, ...) after one warm-up of each, so a noisy neighbour hits both alike; a ratio is the ratio of the
medians, measured in the same run. Nothing here is ever a timed assert in a test."""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sandbox_conformance.processes.children import Completed, minimal_env, run  # noqa: E402  (after the path set-up, on purpose)

PYTHON = REPO / ".venv/bin/python"
CLI = REPO / ".venv/bin/sandbox-conformance"
SYSTEM_PYTHON = "/usr/bin/python3"  # what observers inside a sandbox run, as `python3 -I -S`
TIMEOUT = 300.0
EXIT_UNAVAILABLE = 75  # nothing was measured (a missing venv, no bwrap), as the CLI's 75


class Missing(Exception):
    """A prerequisite is absent: the bench exits 75 with this one line."""


def need_venv() -> None:
    for path, what in ((PYTHON, "the venv python"), (CLI, "the sandbox-conformance script")):
        if not os.access(path, os.X_OK):
            raise Missing(f"{what} is missing at {path}: run `make setup`")


def timed(argv: Sequence[str], *, cwd: str | None = "/", env: Mapping[str, str] | None = None,
          ok: Sequence[int] = (0,)) -> tuple[float, Completed]:
    """Wall seconds of one run of argv; a bench whose command fails says so (exit 1), it does not time
    an error path."""
    started = time.perf_counter()
    done = run(argv, timeout=TIMEOUT, cwd=cwd, env=env if env is not None else minimal_env())
    seconds = time.perf_counter() - started
    if done.returncode not in ok:
        raise SystemExit(f"bench: {' '.join(str(a) for a in argv[:5])} ... exited {done.returncode}: "
                         f"{done.stderr_tail() or done.stdout[-300:]}")
    return seconds, done


def interleaved(sides: Mapping[str, Callable[[], float]], reps: int) -> dict[str, float]:
    """Each side once as a warm-up (page cache, dentries: not what we measure), then `reps` rounds of
    every side in turn, the order reversed every other round (a side always run first would always
    meet the machine as the previous round left it); the median of each."""
    for fn in sides.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for rep in range(reps):
        for name in order if rep % 2 == 0 else reversed(order):
            samples[name].append(sides[name]())
    return {name: statistics.median(values) for name, values in samples.items()}


@dataclasses.dataclass(frozen=True)
class Ratio:
    """One line of the report: what was measured against what, and whether it meets its target."""

    key: str  # "a", "b", "c"
    what: str
    measured_s: float
    floor_s: float
    floor_what: str
    target: float  # the ratio must be at most this (strictly below, for `below`)
    below: bool = False  # target is "< target" rather than "<= target"
    unit: str = "ratio"  # "ratio" or "ms" (an absolute per-assertion figure: measured_s is the value)
    notes: tuple[str, ...] = ()

    @property
    def value(self) -> float:
        return self.measured_s * 1000 if self.unit == "ms" else self.measured_s / self.floor_s

    @property
    def ok(self) -> bool:
        return self.value < self.target if self.below else self.value <= self.target

    def line(self) -> str:
        op = "<" if self.below else "<="
        shown = f"{self.value:6.2f} ms" if self.unit == "ms" else f"{self.value:6.2f} x "
        unit = " ms" if self.unit == "ms" else " x"
        measured, floor = self.measured_s * 1000, self.floor_s * 1000
        return (f"({self.key}) {self.what:<26} {measured:8.1f} ms vs {floor:8.1f} ms"
                f"  {shown}  target {op} {self.target:g}{unit}  {'PASS' if self.ok else 'MISS'}")

    def to_json(self) -> dict[str, object]:
        return {"key": self.key, "what": self.what, "measured_ms": round(self.measured_s * 1000, 2),
                "floor_ms": round(self.floor_s * 1000, 2), "floor": self.floor_what,
                "value": round(self.value, 3), "unit": self.unit, "target": self.target,
                "comparison": "<" if self.below else "<=", "ok": self.ok, "notes": list(self.notes)}


def load() -> str:
    """The 1-minute load average and the core count, for the report: a 2-core machine shared with
    other jobs moves every figure here."""
    try:
        one = os.getloadavg()[0]
    except OSError:
        return "load unknown"
    return f"load {one:.2f} on {os.cpu_count()} cores"


def bare_launch(bwrap: str, as_user: str | None = None) -> list[str]:
    """The floor of one sandbox launch: a full-unshare bwrap (user with nesting refused, pid, net,
    ipc, uts, cgroup; a fresh /proc and /dev; only /usr from the host, as a task gets it) running the
    smallest observer there is, `python3 -I -S -c pass`."""
    prefix = ["setpriv", f"--reuid={as_user}", f"--regid={as_user}", "--init-groups", "--inh-caps=-all", "--"]
    argv = [*(prefix if as_user else []), bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent",
            "--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/lib", "/lib64", "/sbin"):
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
    return [*argv, "--proc", "/proc", "--dev", "/dev", "--", SYSTEM_PYTHON, "-I", "-S", "-c", "pass"]


def figure(label: str, seconds: float, note: str = "") -> str:
    """One measured median, aligned with the others: `label    123.4 ms  (note)`."""
    return f"{label:<28} {seconds * 1000:8.1f} ms" + (f"  ({note})" if note else "")
