"""A launcher that a signal ended says which signal, and whether the harness sent it (issue 28: under
load a launcher ended `exited 137; stderr: (empty)`, and nothing said who sent that SIGKILL).
probes/kills.py records every signal this process sends to end another, with why."""

from __future__ import annotations

import signal

import pytest

from conformance.launch import HarnessError, parse_document
from probes import kills
from probes.run import run


def _error(argv: list[str], **kw: object) -> str:
    with pytest.raises(HarnessError) as e:
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
