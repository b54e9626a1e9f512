"""A launch's streams are bounded, and what a launch left running is judged after a timeout as after an
exit (processes/children.py; issue 28)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from witness_cli import witness

from sandbox_conformance.processes import children as run_mod


def test_a_100_mb_stderr_line_is_kept_as_a_bounded_tail_and_said_once() -> None:
    code = "import sys; sys.stderr.write('x' * 100_000_000); sys.stderr.write('LAST'); sys.exit(3)"
    lines: list[str] = []
    done = run_mod.run([sys.executable, "-c", code], timeout=60, on_line=lines.append)
    assert done.returncode == 3
    assert len(done.stderr) < run_mod.STDERR_KEEP + 200, len(done.stderr)
    assert done.stderr.endswith("LAST")
    assert done.stderr.count("characters of this stream were cut") == 1
    tail = done.stderr_tail()
    assert len(tail) < 4 * run_mod.TAIL_LINE_WIDTH, len(tail)
    assert "more characters" in tail


def test_a_launch_from_a_terminal_has_its_stderr_read_bounded_and_ends_with_its_leader() -> None:
    """The witness launches from a pseudo-terminal (conformance/harness.py _terminal): what the launcher
    writes there is its stderr, read while it runs (the terminal holds ~4 KiB: unread, it would stop
    the launcher), bounded as a pipe's is, and the run ends when the leader does, though the caller
    keeps the slave open."""
    import pty

    master, slave = pty.openpty()
    try:
        code = ("import sys; sys.stderr.write('é' * 3_000_000); sys.stderr.write('LAST'); sys.stderr.flush();"
                "sys.exit(3)")
        done = run_mod.run([sys.executable, "-c", code], timeout=60, on_line=lambda _: None,
                           terminal=slave, terminal_master=master)
        assert done.returncode == 3 and not done.timed_out  # it ended with its leader, not on our timeout
        assert done.stderr.endswith("LAST") and "é" in done.stderr, done.stderr[-100:]
        assert len(done.stderr) < run_mod.STDERR_KEEP + 200, len(done.stderr)
        assert done.stderr.count("characters of this stream were cut") == 1
    finally:
        os.close(master)
        os.close(slave)


def test_a_long_stdout_line_without_end_is_read_in_pieces_and_short_lines_still_arrive() -> None:
    code = ("import sys; print('{\"hello\": 1}', flush=True); sys.stdout.write('y' * 5_000_000); "
            "print(); print('{\"doc\": 2}')")
    lines: list[str] = []
    done = run_mod.run([sys.executable, "-c", code], timeout=60, on_line=lines.append)
    assert done.returncode == 0
    assert lines[0] == '{"hello": 1}\n' and lines[-1] == '{"doc": 2}\n'
    assert all(len(ln) <= run_mod.ON_LINE_MAX for ln in lines)
    assert done.stdout.endswith('{"doc": 2}\n')


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _reap_by_pidfile(pidfile: Path) -> None:
    """Kill the daemon a test started (by the pid it wrote), if it is still there."""
    try:
        pid = int(pidfile.read_text())
    except (FileNotFoundError, ValueError):
        return
    if _alive(pid):
        os.kill(pid, 9)


def test_after_exit_runs_after_a_timeout_too(tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    script = f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' & sleep 300"
    seen: list[int] = []
    daemon = 0

    def after_exit(pgid: int) -> None:
        nonlocal daemon
        seen.append(pgid)
        daemon = int(pidfile.read_text())
        os.kill(daemon, 9)  # what the observer's leftover kill does with a survivor

    try:
        done = run_mod.run(["sh", "-c", script], timeout=1.0, on_line=None, after_exit=after_exit)
        assert done.timed_out
        assert seen, "after_exit was not called after the timeout"
    finally:
        _reap_by_pidfile(pidfile)
    deadline = time.monotonic() + 5
    while _alive(daemon) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(daemon)


@pytest.mark.timeout(120)
def test_a_setsid_daemon_of_a_launcher_that_hangs_is_killed_after_the_launch_timeout(
    bwrap_path: str, tmp_path: Path
) -> None:
    pidfile = tmp_path / "daemon.pid"
    launcher = tmp_path / "hang.sh"
    launcher.write_text("#!/bin/sh\n"
                        f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' </dev/null >/dev/null 2>&1 &\n"
                        "exec sleep 300\n")
    launcher.chmod(0o755)
    done = witness("--launcher", str(launcher), "--launch-timeout", "2", timeout=100)
    daemon = int(pidfile.read_text())
    survived = _alive(daemon)
    _reap_by_pidfile(pidfile)  # the test's own clean-up, whatever it found
    assert done.returncode == 1, done.stdout[-2000:]
    assert "timed out" in done.stdout
    assert not survived, f"the launcher's setsid daemon {daemon} outlived the witness run"


def test_a_timed_out_child_whose_output_a_setsid_daemon_holds_returns_within_a_bound() -> None:
    # Without hooks, run() read to EOF: after the timeout's group kill it called communicate() with no
    # bound, and a daemon out of the group (setsid) holding stdout kept it there for the daemon's life.
    marker = f"sbxc-drain-{os.getpid()}"
    began = time.monotonic()
    try:
        daemon = f"setsid {sys.executable} -c 'import time; time.sleep(300)' {marker} &"
        done = run_mod.run(["sh", "-c", f"{daemon} echo hi; sleep 60"], timeout=1)
        assert done.timed_out
        assert time.monotonic() - began < 1 + run_mod.DRAIN_SECONDS + 5
        assert "still held open" in done.stderr
    finally:
        os.system(f"pkill -KILL -f '{marker}$'")


def test_a_reader_thread_refused_stops_the_child_it_was_to_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # Thread.start raising (pids.max, RLIMIT_NPROC) came before the try that stops the child: the
    # launcher ran on, untracked.
    import threading

    start = threading.Thread.start

    def refused(self: threading.Thread) -> None:
        if getattr(self, "_target", None) is not None and self._target.__name__ == "read_err":
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", refused)
    pids: list[int] = []
    with pytest.raises(RuntimeError):
        run_mod.run(["sleep", "60"], timeout=30, on_line=lambda _: None, on_start=pids.append)
    monkeypatch.undo()
    [pid] = pids
    assert not Path(f"/proc/{pid}").exists()  # stopped and reaped


def test_a_child_that_writes_much_on_its_way_out_is_read_while_it_stops() -> None:
    # run() interrupted (a stop signal in the main thread) stops its child with SIGTERM and a grace.
    # Before, it waited without reading the pipes: a child writing 300 KB as it stops blocked in
    # write(2) and was SIGKILLed after the whole grace (10 s).
    child = ("import signal,sys,time\n"
             "def bye(*_):\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"  # the run's stop sends two
             "    sys.stdout.write('x' * 300_000); sys.stdout.flush(); sys.exit(0)\n"
             "signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\ntime.sleep(60)\n")
    script = f"""
import os, signal, sys, threading, time
from sandbox_conformance.processes import cancel, children
cancel.install("t")
cancel.begin()
threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
began = time.monotonic()
try:
    children.run([sys.executable, "-c", {child!r}], timeout=60)
except cancel.Cancelled:
    print(round(time.monotonic() - began, 1))
cancel.uninstall()
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent.parent,
                          capture_output=True, text=True, timeout=60)
    took = float(done.stdout.strip() or "nan")
    assert took < 1 + run_mod.STOP_GRACE / 2, done.stdout + done.stderr
