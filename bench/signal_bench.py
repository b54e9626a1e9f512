#!/usr/bin/env python3
"""SIGTERM, SIGINT or SIGHUP at a random moment of a whole `witness`, `run`, `controls` or `mr-check`
(issue 28): every try must end within a bounded time, with the right exit status and verdict line,
and leave nothing behind.

    .venv/bin/python bench/signal_bench.py [--tries N] [--seed S] [--commands witness,run,...]
                                           [--bound SECONDS] [--max-delay SECONDS] [--json] [--check]

Each try starts the command as a user does (the venv's `sandbox-conformance` script) under
tests/cancel_reaper.py, a subreaper that sees every process the run leaves, with a HOME and TMPDIR of
its own; sends the signal after a delay drawn uniformly from [0, the command's unsignalled wall time]
(measured once per command first, or --max-delay), and judges (`judge`):
- ended: the top process exits within --bound seconds of the signal (else its threads' stacks are
  taken with py-spy, when on PATH, and it is SIGKILLed);
- how: exit 128+N with `sandbox-conformance: KILLED-SIGx mode=M exit=128+N` last on stderr (an orderly
  stop); or killed by the signal itself, either before any code of ours ran (nothing said, nothing
  made: the interpreter's own start-up) or after the command had said its own verdict (a late signal
  ends the process); or its normal end, only if the signal came after it (a signal sent more than
  LATE_SLACK before a normal end was ignored);
- no traceback, no "Exception ignored" (a Cancelled swallowed in a callback);
- nothing left: no process (the reaper's oracle), no stamped directory whose owner is gone (TMPDIR,
  /tmp, /var/tmp), no mount under the try's directory, no stamped cgroup of a gone owner.

The last line is the tally per outcome and the stop times (signal to exit); --check exits 1 when any
try had a problem. tests/test_signal_anytime.py runs a seeded few of these in the suite."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import CLI, EXIT_UNAVAILABLE, REPO, Missing, load, need_venv

from sandbox_conformance.processes import owner  # REPO is on sys.path once _common is imported

REAPER = REPO / "tests" / "cancel_reaper.py"
COMMANDS = ("witness", "run", "controls", "mr-check")
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
BOUND = 30.0  # seconds from the signal to the top's exit: 3 x a group's STOP_GRACE would be a hang
LINGER = 15.0  # how long the reaper waits for the run's last process once the top has exited
LATE_SLACK = 0.02  # a normal end this soon after the signal was sent may simply have come first
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KILLED = re.compile(r"^sandbox-conformance: KILLED-(SIG[A-Z]+) mode=(\S+) exit=(\d+) time=\d+\.\d+s$",
                    re.M)
# Each command's own verdict, said when it ends by itself (a late signal may follow it).
OWN_VERDICT = {
    "witness": re.compile(r"^witness: .*: (PASS|FAIL)", re.M),
    "run": re.compile(r"^sandbox-conformance: (PASS|FAIL|ERROR|REFUSED) mode=", re.M),
    "controls": re.compile(r"^controls: .*: (PASS|FAIL)$", re.M),
    "mr-check": re.compile(r"^sandbox-conformance mr-check: (PASS|FAIL)", re.M),
}

MR_PYPROJECT = """\
[project]
name = "demo"
version = "0"

[[tool.sandbox-conformance.tiers]]
name = "sandbox"
globs = ["src/sandbox/**"]
run = { kind = "witness" }
"""


class Scenario(NamedTuple):
    command: str
    argv: tuple[str, ...]
    cwd: Path
    mode: str  # the verdict line's mode=
    normal: tuple[int, ...]  # its exit codes when it ends by itself


class Try(NamedTuple):
    command: str
    signal: str
    delay: float
    outcome: str  # orderly, before-our-code, late, finished-first, hung, wrong
    stop_seconds: float | None  # signal to the top's exit (None: the signal was not sent)
    problems: tuple[str, ...]
    status: int | None
    stderr_tail: str


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, timeout=60)


def scenario(command: str, scratch: Path) -> Scenario:
    """How `command` runs in a try: the reference sandbox, two controls in parallel, an mr-check of a
    repository whose one tier is the witness suite (its `run` child, that run's witness child)."""
    cli = str(CLI)
    if command == "witness":
        return Scenario(command, (cli, "witness"), scratch, "witness", (0,))
    if command == "run":
        return Scenario(command, (cli, "run", "--mode", "native"), scratch, "native", (0,))
    if command == "controls":
        return Scenario(command, (cli, "controls", "--only", "mask_dropped,network_shared", "--jobs", "2"),
                        scratch, "controls", (0,))
    if command == "mr-check":
        repo = scratch / "repo"
        if not repo.exists():
            (repo / "src/sandbox").mkdir(parents=True)
            (repo / "pyproject.toml").write_text(MR_PYPROJECT)
            (repo / "src/sandbox/launch.py").write_text("print('launch')\n")
            _git(repo, "init", "-q", "-b", "main")
            _git(repo, "-c", "user.email=b@example.invalid", "-c", "user.name=b", "add", "-A")
            _git(repo, "-c", "user.email=b@example.invalid", "-c", "user.name=b", "commit", "-q", "-m", "i")
            _git(repo, "checkout", "-q", "-b", "feature")
            (repo / "src/sandbox/launch.py").write_text("print('changed')\n")
        return Scenario(command, (cli, "mr-check", "-C", str(repo)), repo, "mr-check", (0,))
    raise ValueError(command)


def environment(scratch: Path) -> dict[str, str]:
    tmp = scratch / "tmpdir"
    tmp.mkdir(exist_ok=True)
    return {"PATH": BASE_PATH, "LANG": "C.UTF-8", "HOME": str(scratch), "TMPDIR": str(tmp)}


# ---- what a try may leave ----------------------------------------------------------------------------

# What these scenarios make outside their own TMPDIR (a launcher's minimal environment has no TMPDIR):
# /tmp and /var/tmp are shared with other jobs on the machine, whose OCI bundles are not ours.
OURS_OUTSIDE = ("sbxc-witness-", "sbxc-controls-", "sbxc-mr-check.")


def stamped_dirs(env: dict[str, str]) -> set[Path]:
    out = set()
    for d in dict.fromkeys([env["TMPDIR"], "/tmp", "/var/tmp"]):
        with contextlib.suppress(OSError):
            for p in Path(d).iterdir():
                if owner.owned(p.name) and (d == env["TMPDIR"] or p.name.startswith(OURS_OUTSIDE)):
                    out.add(p)
    return out


def _cgroup_mounts() -> list[Path]:
    out = []
    for ln in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = ln.partition(" - ")
        if right.startswith("cgroup2 "):
            out.append(Path(left.split()[4]))
    return out


def stamped_cgroups() -> set[Path]:
    """Leaves named with a stamp (task-STAMP-N, neighbour-STAMP-N) anywhere under a cgroup2 mount."""
    out = set()
    for top in _cgroup_mounts():
        for dirpath, dirnames, _ in os.walk(top):
            for name in dirnames:
                if name.startswith(("task-o", "neighbour-o")) and owner.find(name) is not None:
                    out.add(Path(dirpath) / name)
    return out


def mounts_under(path: Path) -> list[str]:
    text = Path("/proc/self/mountinfo").read_text()
    return [ln for ln in text.splitlines() if str(path) in ln.split(" - ")[0]]


def _gone(paths: set[Path]) -> list[Path]:
    return sorted(p for p in paths if p.exists() and owner.gone(owner.find(p.name)))  # type: ignore[arg-type]


# ---- one try -----------------------------------------------------------------------------------------

def _stacks(pid: int) -> str:
    spy = shutil.which("py-spy") or os.environ.get("PY_SPY")
    if spy:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            return subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                                  timeout=30).stdout
    lines = []
    with contextlib.suppress(OSError):
        for t in sorted(Path(f"/proc/{pid}/task").iterdir()):
            with contextlib.suppress(OSError):
                lines.append(f"thread {t.name} {(t / 'comm').read_text().strip()}: "
                             f"{(t / 'wchan').read_text().strip()}")
    return "\n".join(lines)


def one_try(sc: Scenario, sig: int, delay: float, scratch: Path, *, bound: float = BOUND) -> Try:
    env = environment(scratch)
    before_dirs, before_cgroups = stamped_dirs(env), stamped_cgroups()
    out, err = scratch / "top.out", scratch / "top.err"
    reaper = subprocess.Popen([sys.executable, str(REAPER), "--linger", str(LINGER), "--stdout", str(out),
                               "--stderr", str(err), "--", *sc.argv], stdout=subprocess.PIPE, text=True,
                              env=env, cwd=sc.cwd, start_new_session=True)
    assert reaper.stdout is not None
    problems: list[str] = []
    sent: float | None = None
    stacks = ""
    try:
        top = json.loads(reaper.stdout.readline())["top"]
        started = time.monotonic()
        time.sleep(max(0.0, started + delay - time.monotonic()))
        if reaper.poll() is None:
            sent = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.kill(top, sig)
        try:
            rest, _ = reaper.communicate(timeout=bound + LINGER)
        except subprocess.TimeoutExpired:
            stacks = _stacks(top)
            problems.append(f"no exit within {bound + LINGER:.0f} s of the signal")
            with contextlib.suppress(ProcessLookupError):
                os.kill(top, signal.SIGKILL)
            rest, _ = reaper.communicate(timeout=LINGER + 30)
    finally:
        if reaper.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(reaper.pid, signal.SIGKILL)
            reaper.wait()
    doc = json.loads(rest.strip().splitlines()[-1])
    stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
    outcome, said = judge(sc, sig, doc["status"], stdout, stderr, sent, doc["ended"])
    problems += said
    stop = doc["ended"] - sent if sent is not None else None
    if stop is not None and stop > bound:
        problems.append(f"took {stop:.1f} s from the signal to the exit (bound {bound:.0f} s)")
    if doc["left"]:
        problems.append(f"still running {LINGER:.0f} s after the top exited: {doc['left']}")
    left_dirs = _gone(stamped_dirs(env) - before_dirs)
    if left_dirs:
        problems.append(f"left on disk: {[str(p) for p in left_dirs]}")
    left_cgroups = _gone(stamped_cgroups() - before_cgroups)
    if left_cgroups:
        problems.append(f"left cgroups: {[str(p) for p in left_cgroups]}")
    mounts = mounts_under(scratch)
    if mounts:
        problems.append(f"left mounts: {mounts}")
    if stacks:
        problems.append("stacks of the hung process:\n" + stacks)
    if problems and outcome not in ("hung", "wrong"):
        outcome = "wrong"
    if any(p.startswith("no exit within") for p in problems):
        outcome = "hung"
    tail = "\n".join(stderr.strip().splitlines()[-6:])
    return Try(sc.command, signal.Signals(sig).name, round(delay, 3), outcome,
               round(stop, 3) if stop is not None else None, tuple(problems), doc["status"], tail)


def judge(sc: Scenario, sig: int, status: int, stdout: str, stderr: str, sent: float | None,
          ended: float) -> tuple[str, list[str]]:
    """How the try ended (orderly, before-our-code, late, finished-first) and what was wrong with it."""
    name = signal.Signals(sig).name
    problems = []
    if sig == signal.SIGINT and _interpreter_start(stderr) and status in (1, -sig, 128 + sig):
        # Python's own SIGINT handler, before our first line ran (site, the script's first import).
        return "before-our-code", problems
    for bad in ("Traceback (most recent call last)", "Exception ignored"):
        if bad in stderr:
            problems.append(f"{bad!r} on stderr")
    lines = stderr.strip().splitlines()
    last = KILLED.match(lines[-1]) if lines else None
    own = OWN_VERDICT[sc.command].search(stdout + "\n" + stderr)
    if sent is None:
        return "finished-first", problems if status in sc.normal else [*problems, f"exit {status}"]
    if status == 128 + sig:
        if last is None:
            problems.append(f"exit {status} without a KILLED verdict line last on stderr")
        elif (last.group(1), last.group(2), int(last.group(3))) != (name, sc.mode, 128 + sig):
            problems.append(f"verdict line {lines[-1]!r}: expected KILLED-{name} mode={sc.mode} "
                            f"exit={128 + sig}")
        return "orderly", problems
    if status == -sig:
        if not stderr.strip() and not stdout.strip():
            return "before-our-code", problems
        if own is not None:
            return "late", problems
        return "wrong", [*problems, f"killed by {name} with no verdict line"]
    if status in sc.normal and own is not None:
        if sent < ended - LATE_SLACK:
            problems.append(f"{name} sent {ended - sent:.2f} s before a normal end (exit {status}): ignored")
        return "finished-first", problems
    return "wrong", [*problems, f"exit {status} (expected {128 + sig} for {name})"]


def _interpreter_start(stderr: str) -> bool:
    """A KeyboardInterrupt traceback none of whose frames is a file of ours (the venv's script and
    site-packages are the interpreter's start, not our code)."""
    lines = stderr.strip().splitlines()
    if not lines or lines[-1] != "KeyboardInterrupt" or "Traceback (most recent call last)" not in stderr:
        return False
    frames = re.findall(r'^  File "([^"]+)"', stderr, re.M)
    ours = [f for f in frames if f.startswith(str(REPO)) and not f.startswith(str(REPO / ".venv"))]
    return not ours


# ---- the bench ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sbxc-signal-bench-") as d:
        yield Path(d)


def life(sc: Scenario, scratch: Path) -> float:
    """The command's unsignalled wall time (one run): where the signals are drawn from."""
    env = environment(scratch)
    started = time.monotonic()
    done = subprocess.run(sc.argv, cwd=sc.cwd, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode not in sc.normal:
        raise Missing(f"{sc.command} does not run here unsignalled (exit {done.returncode}): "
                      f"{done.stderr.strip().splitlines()[-1:]}")
    return time.monotonic() - started


def tries(commands: Sequence[str], n: int, seed: int, *, max_delay: float | None = None,
          bound: float = BOUND) -> Iterator[Try]:
    rng = random.Random(seed)
    with scratch_dir() as scratch:
        scenarios = {c: scenario(c, scratch) for c in commands}
        lives = {c: max_delay if max_delay is not None else life(s, scratch) for c, s in scenarios.items()}
        for i in range(n):
            c = commands[i % len(commands)]
            sig = rng.choice(SIGNALS)
            yield one_try(scenarios[c], sig, rng.uniform(0, lives[c]), scratch, bound=bound)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tries", type=int, default=200)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--commands", default=",".join(COMMANDS))
    p.add_argument("--bound", type=float, default=BOUND)
    p.add_argument("--max-delay", type=float, default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--check", action="store_true")
    a = p.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(1 << 32)
    commands = [c for c in a.commands.split(",") if c]
    try:
        need_venv()
        if shutil.which("bwrap") is None:
            raise Missing("bwrap not found: the reference sandbox cannot run")
        done: list[Try] = []
        for t in tries(commands, a.tries, seed, max_delay=a.max_delay, bound=a.bound):
            done.append(t)
            if not a.json:
                stop = f"{t.stop_seconds:6.2f} s" if t.stop_seconds is not None else "   -    "
                print(f"{len(done):4d} {t.command:<9} {t.signal:<8} at {t.delay:6.3f} s  {t.outcome:<15} "
                      f"stop {stop}  exit {t.status}", flush=True)
                for prob in t.problems:
                    print("       PROBLEM: " + prob.replace("\n", "\n         "), flush=True)
                if t.problems:
                    print("       stderr: " + t.stderr_tail.replace("\n", "\n         "), flush=True)
    except Missing as e:
        print(f"bench: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    tally: dict[str, int] = {}
    for t in done:
        tally[t.outcome] = tally.get(t.outcome, 0) + 1
    stops = [t.stop_seconds for t in done if t.stop_seconds is not None and t.outcome == "orderly"]
    bad = [t for t in done if t.problems]
    if a.json:
        print(json.dumps({"seed": seed, "load": load(), "tally": tally, "tries": [t._asdict() for t in done]},
                         indent=2))
    else:
        stop = (f"; orderly stop median {statistics.median(stops):.2f} s, max {max(stops):.2f} s"
                if stops else "")
        print(f"seed {seed}, {load()}: {len(done)} tries, {len(bad)} with problems; "
              + ", ".join(f"{n} {o}" for o, n in sorted(tally.items())) + stop)
    return 1 if a.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())
