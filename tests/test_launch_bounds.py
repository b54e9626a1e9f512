"""A launch's streams are bounded, and what a launch left running is judged after a timeout as after an
exit (processes/children.py; issue 28)."""

from __future__ import annotations

import os
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
