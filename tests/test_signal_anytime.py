"""A stop signal at any moment of a run is an orderly stop (issue 28; docs/cancellation.md).

First the windows that hung or lost the signal, each made to happen on purpose (deterministic):
- before the handlers: held from the first line of ours (commands/__init__.py) and raised as the
  command's first act, with its verdict line;
- inside an import: a Cancelled raised in importlib's frames was swallowed ("Exception ignored in
  _get_module_lock") or left the import lock held; it is raised once the import is whole;
- while a worker thread starts a child: the stopper had already signalled the groups it knew, and the
  new child ran to its whole timeout.
Then the whole life of `witness`, `run`, `controls` and `mr-check`, signalled at seeded random moments
(bench/signal_bench.py, whose long form runs hundreds of tries): every try ends in bounded time with the
right status and verdict line, and leaves no process, directory, mount or cgroup."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from sandbox_conformance.processes import cancel
from sandbox_conformance.processes import children as run_mod

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import signal_bench  # noqa: E402  (bench/ is not a package)

KILLED = "sandbox-conformance: KILLED-SIGTERM mode=witness exit=143 time="


def _python(code: str, tmp: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {"PATH": signal_bench.BASE_PATH, "LANG": "C.UTF-8", "HOME": str(tmp), "TMPDIR": str(tmp)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=timeout)


def test_a_signal_before_the_handlers_is_held_and_ends_the_command_in_order(tmp_path: Path) -> None:
    # The process is the command (as the installed script is); the SIGTERM comes after our first line
    # ran and before the command installed its handlers. It ended the process at once, no verdict line.
    done = _python("""
        import os, signal, sys
        sys.argv = ["/venv/bin/sandbox-conformance", "witness", "--launcher", "true"]
        from sandbox_conformance import commands
        os.kill(os.getpid(), signal.SIGTERM)
        from sandbox_conformance.commands import cli
        sys.exit(cli.main())
        """, tmp_path)
    assert done.returncode == 143, (done.returncode, done.stderr[-2000:])
    assert done.stderr.strip().splitlines()[-1].startswith(KILLED), done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_a_held_signal_ends_a_command_that_installs_nothing_by_that_signal(tmp_path: Path) -> None:
    done = _python("""
        import os, signal, sys
        sys.argv = ["/venv/bin/sandbox-conformance", "probe", "--only", "platform"]
        from sandbox_conformance import commands
        os.kill(os.getpid(), signal.SIGHUP)
        from sandbox_conformance.commands import cli
        cli.main()
        print("not reached")
        """, tmp_path)
    assert done.returncode == -signal.SIGHUP, (done.returncode, done.stderr[-2000:])
    assert "not reached" not in done.stdout


def test_a_signal_inside_an_import_is_raised_once_the_import_is_whole(tmp_path: Path) -> None:
    # The handler runs inside the import (module body), where a raise is cut into importlib's own
    # frames; it is owed and raised right after, the module whole.
    (tmp_path / "slow_module.py").write_text(
        "import _thread, signal, time\n_thread.interrupt_main(signal.SIGTERM)\n"
        "for _ in range(20):\n    time.sleep(0.005)\nWHOLE = True\n")
    done = _python(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from sandbox_conformance.processes import cancel
        cancel.install("test")
        getattr(cancel, "begin", lambda: None)()  # (before issue 28, install raised at once)
        try:
            import slow_module
            for _ in range(200):
                __import__("time").sleep(0.005)
            print("not cancelled")
        except cancel.Cancelled as e:
            mod = sys.modules.get("slow_module")
            print("cancelled", e.name, "whole" if getattr(mod, "WHOLE", False) else "cut")
        finally:
            cancel.uninstall()
            cancel.close()
        """, tmp_path)
    assert done.stdout.split() == ["cancelled", "SIGTERM", "whole"], (done.stdout, done.stderr[-2000:])
    assert "Exception ignored" not in done.stderr


def test_a_child_a_worker_starts_as_the_stop_comes_is_stopped_not_waited_for(monkeypatch) -> None:
    # The stop comes between the worker's check and its child being tracked: the stopper had signalled
    # the groups it knew, so this one ran on to its whole timeout (60 s here).
    real = subprocess.Popen

    def popen_then_stop(*args: object, **kw: object) -> subprocess.Popen[str]:
        proc = real(*args, **kw)  # type: ignore[call-overload]
        cancel._state.received = cancel.Cancelled(signal.SIGTERM)
        return proc  # type: ignore[no-any-return]

    monkeypatch.setattr(run_mod.subprocess, "Popen", popen_then_stop)
    got: list[BaseException | int | None] = []

    def worker() -> None:
        try:
            got.append(run_mod.run(["sleep", "60"], timeout=60).returncode)
        except BaseException as e:
            got.append(e)

    t = threading.Thread(target=worker)
    try:
        started = time.monotonic()
        t.start()
        t.join(timeout=20)
        assert not t.is_alive(), "the child started as the stop came was waited for to its timeout"
        assert isinstance(got[0], cancel.Cancelled), got
        assert time.monotonic() - started < 15
    finally:
        cancel._state.received = None
        t.join(timeout=70)


# ---- the whole life of each command, at seeded random moments ---------------------------------------

# Tries per command, and the latest moment a signal is drawn from (about each one's unsignalled wall
# time on this 2-core machine): ~35 s in all, measured. The seed changes with the day, said in the output, so
# a failure can be replayed: bench/signal_bench.py --seed S --commands C.
TRIES = {"witness": 10, "run": 6, "controls": 4, "mr-check": 4}
LIFE = {"witness": 0.7, "run": 1.4, "controls": 2.2, "mr-check": 2.6}


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_stop_signal_at_any_moment_ends_each_command_in_order_and_leaves_nothing() -> None:
    if not os.access(signal_bench.CLI, os.X_OK):
        pytest.skip(f"no {signal_bench.CLI}: run `make setup`")
    seed = int(os.environ.get("SBXC_SIGNAL_SEED", time.strftime("%Y%m%d")))
    rng = random.Random(seed)
    bad = []
    with tempfile.TemporaryDirectory(prefix="sbxc-signal-test-") as d:
        scratch = Path(d)
        for command, n in TRIES.items():
            sc = signal_bench.scenario(command, scratch)
            for _ in range(n):
                sig = rng.choice(signal_bench.SIGNALS)
                t = signal_bench.one_try(sc, sig, rng.uniform(0, LIFE[command]), scratch)
                print(f"{t.command} {t.signal} at {t.delay:.3f} s: {t.outcome}, exit {t.status}, "
                      f"stop {t.stop_seconds} s")
                if t.problems:
                    bad.append(f"seed {seed}: {t.command} {t.signal} at {t.delay:.3f} s: {t.outcome}: "
                               + "; ".join(t.problems) + f"\n{t.stderr_tail}")
    assert not bad, "\n".join(bad)
