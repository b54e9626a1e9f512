"""A launcher that a signal ended says which signal, and whether the harness sent it (issue 28: under
load a launcher ended `exited 137; stderr: (empty)`, and nothing said who sent that SIGKILL).
processes/kills.py records every signal this process sends to end another, with why."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sandbox_conformance.conformance import observer
from sandbox_conformance.conformance.launch import NoObservation, parse_document
from sandbox_conformance.processes import kills
from sandbox_conformance.processes.children import run


def _error(argv: list[str], **kw: object) -> str:
    with pytest.raises(NoObservation) as e:
        parse_document("launcher 'x'", run(argv, timeout=30, **kw))  # type: ignore[arg-type]
    return str(e.value)


def test_a_launcher_killed_by_a_signal_we_did_not_send_says_so() -> None:
    said = _error(["sh", "-c", "kill -KILL $$"])
    assert said.startswith("launcher 'x': killed by SIGKILL; not sent by the harness"), said
    assert "stderr: (empty)" in said


def test_a_launcher_reporting_its_task_killed_names_the_signal_behind_128_plus_n() -> None:
    # A shell, or bwrap, exits 128 + N for the child it waited for: 137 is SIGKILL.
    said = _error(["sh", "-c", "sleep 60 & p=$!; kill -KILL $p; wait $p"])
    assert said.startswith("launcher 'x': exited 137 (128 + SIGKILL: the process it waited for"), said
    assert "not sent by the harness" in said


def test_a_launcher_the_harness_killed_names_the_kill_and_its_reason() -> None:
    said = _error(["sleep", "60"], on_start=lambda pid: kills.kill(pid, signal.SIGKILL, "a test's kill"))
    assert "killed by SIGKILL; the harness sent SIGKILL to pid " in said and "(a test's kill)" in said, said


def test_an_ordinary_failure_is_its_exit_as_before() -> None:
    assert _error(["sh", "-c", "echo boom >&2; exit 3"]) == "launcher 'x': exited 3; stderr: boom"


# ---- what sent that SIGKILL: the observer of another launch ------------------------------------------


def _in_new_pidns(*argv: str) -> tuple[subprocess.Popen[bytes], str]:
    """A process in a pid namespace of its own (unshare -pf, as a sandbox makes one), and that
    namespace."""
    proc = subprocess.Popen(["unshare", "-pf", *argv], start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for child in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
            with contextlib.suppress(OSError):
                return proc, os.readlink(f"/proc/{child}/ns/pid")
        time.sleep(0.01)
    raise AssertionError("unshare -pf started nothing")


def test_a_finished_launchs_observer_never_kills_the_next_sandbox_given_its_namespaces_number(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 28, under load: a pid namespace's number is the lowest free one, so a sandbox made the
    # moment a launch's task is gone gets that task's namespace number; the launch's observer, judging
    # what it left, took that sandbox's task for its own and SIGKILLed it. Its launcher (bwrap) then
    # `exited 137; stderr: (empty)`, and nothing said who sent it.
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for pid namespaces")
    first, ns = _in_new_pidns("sleep", "0.3")
    first.wait(timeout=10)
    exited = observer.boot_ticks()  # the launcher's exit: its observer judges what it left from here
    watch = observer.Watch("", "n", protected=(), host_namespaces={"pid": os.readlink("/proc/self/ns/pid")})
    watch.seen = observer.Seen(first.pid, {"pid": ns}, "error", "error", "error", "", "error")
    watch.since = observer.boot_ticks() - 1
    for _ in range(50):  # the number comes back at once when nothing else made a namespace meanwhile
        time.sleep(0.02)  # a tick (starttime's unit) after the launcher's exit
        nxt, nxt_ns = _in_new_pidns("sleep", "60")
        if nxt_ns == ns:
            break
        nxt.kill()
        nxt.wait(timeout=10)
    else:
        pytest.skip(f"the kernel never gave {ns} again in 50 tries")
    try:
        # Made while the finished launch's observer still looks (its grace for leftovers to go):
        # not a leftover of that launch.
        monkeypatch.setattr(observer, "boot_ticks", lambda: exited)
        watch.after_exit(first.pid)
        assert watch.survivors == [], watch.survivors
        assert nxt.poll() is None, "the next sandbox was killed as a leftover of a finished launch"
    finally:
        nxt.kill()
        nxt.wait(timeout=10)
