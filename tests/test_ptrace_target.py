"""The `ptrace_outside` door's target (conformance/ptrace_target.py): a process of the task's user that
any process of that user may trace, so that only a sandbox refuses the attach; gone with the session,
and never a launch's leftover."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from sandbox_conformance.conformance import inside, observer, ptrace_target
from sandbox_conformance.conformance.harness import _cmdline as harness_cmdline
from sandbox_conformance.conformance.launch import as_user_prefix

# The door itself, as the task runs it, from a process of `prefix`'s user outside any sandbox.
ATTACH = ("import json, sys; from sandbox_conformance.conformance import inside; "
          "door = lambda: inside.door_ptrace(int(sys.argv[1]), json.loads(sys.argv[2])); "
          "print(json.dumps(inside.in_child(door)))")


def _door(prefix: tuple[str, ...], target: ptrace_target.Target) -> dict[str, object]:
    argv = [*prefix, sys.executable, "-c", ATTACH, str(target.pid), json.dumps(target.cmdline)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("as_user", [False, True], ids=["root", "user"])
def test_the_target_is_traceable_by_the_tasks_user_with_no_sandbox(as_user: bool, request) -> None:
    if os.geteuid() != 0:
        pytest.skip("the harness runs the target as the task's user only as root")
    prefix = as_user_prefix(request.getfixturevalue("test_user")) if as_user else ()
    target = ptrace_target.start(prefix)
    assert target is not None, "the target did not start"
    try:
        # Before: the harness was the target, and the kernel refused a user's task by credentials alone.
        if as_user:
            harness = _door(prefix, ptrace_target.Target(os.getpid(), harness_cmdline("self"), target.proc))
            assert harness.get("errno") == "EPERM", harness
        assert _door(prefix, target) == {"ok": True, "errno": None}
    finally:
        target.stop()
    assert target.proc.returncode is not None


def test_the_target_goes_when_its_stdin_closes_and_is_never_a_leftover() -> None:
    target = ptrace_target.start()
    assert target is not None
    try:
        seen = observer.Seen(0, {}, "error", "error", "error", "", "error")
        observer.OWN_HELPERS.add(target.pid)
        # Started after the launch's `since`, a child of ours: an orphan of the launch, but for the mark.
        left = observer.survivors(seen, -1, host_namespaces={}, harness_sid=os.getsid(0), since=0)
        assert target.pid not in [p["pid"] for p in left]
        observer.OWN_HELPERS.discard(target.pid)
        left = observer.survivors(seen, -1, host_namespaces={}, harness_sid=os.getsid(0), since=0)
        assert target.pid in [p["pid"] for p in left]
    finally:
        observer.OWN_HELPERS.discard(target.pid)
        began = time.monotonic()
        target.stop()
    assert time.monotonic() - began < ptrace_target.STOP_SECONDS, "it ends on EOF, not on the kill"
    assert inside  # the door under test is the task's own code
