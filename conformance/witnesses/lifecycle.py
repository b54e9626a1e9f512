"""The task's life, start to end: nothing the launch started outlives it (leftovers), the sandbox is
the same at every look (unchanged), and it dies with its launcher (lifecycle)."""

from __future__ import annotations

import pytest

from sandbox_conformance.conformance.harness import WitnessSession
from sandbox_conformance.conformance.plan import Task

# The autouse fixture that names the running witness for _task_view: pytest finds a fixture among a
# module's own names, so every module of the suite imports it.
from sandbox_conformance.conformance.witnesses._common import _current as _current
from sandbox_conformance.conformance.witnesses._common import (
    _inside,
    _seen,
    witness,
)


@witness("leftovers")
def test_nothing_the_launch_started_outlives_the_task(sbxc_task: Task) -> None:
    left = [f"pid {p['pid']} ({p['comm']}): {', '.join(p['why'])}" for p in sbxc_task.survivors]
    assert not left, f"still running after the launcher exited (killed by the harness): {left}"


@witness("unchanged")
def test_the_sandbox_is_the_same_at_every_look(sbxc_task: Task) -> None:
    # The host looks at the task at moments the launcher cannot know, from the task's start until it
    # is gone, and each look must match the one at the handshake; and the task looks again at itself
    # once the host has released it.
    _seen(sbxc_task)
    after = _inside(sbxc_task, "after_release")
    inside = []
    if after.get("namespaces") != sbxc_task.get("namespaces"):
        inside.append(f"namespaces: {sbxc_task.get('namespaces')} then {after.get('namespaces')}")
    before_status, after_status = sbxc_task.get("status") or {}, after.get("status") or {}
    for k in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp"):
        if before_status.get(k) != after_status.get(k):
            inside.append(f"{k}: {before_status.get(k)} then {after_status.get(k)}")
    table = sbxc_task.get("mountinfo")
    mounts = (
        sorted([str(m["mount_point"]), bool(m["ro"])] for m in table) if isinstance(table, list) else table
    )
    if mounts != after.get("mounts"):
        inside.append("the mount table changed")
    assert not sbxc_task.changes and not inside, (
        f"the sandbox changed while the task ran: the host's looks saw {list(sbxc_task.changes)}; "
        f"the task saw {inside}"
    )


@witness("lifecycle")
def test_the_task_dies_with_its_launcher(sbxc_task: Task, sbxc_session: WitnessSession) -> None:
    # A second launch: once the task waits at the handshake, the host SIGKILLs its launcher (the process
    # alone, not its group) and the task must be gone soon after (bwrap --die-with-parent; a platform
    # that loses its worker must not leave the task running, writing, holding its secrets). A launch
    # that failed outright (sbxc_task) is the harness error it is here too, not a red witness.
    if sbxc_session.unobservable:
        why = sbxc_session.unobservable
        pytest.skip(f"the host cannot observe the task ({why}): there is no process of it to find and kill")
    del sbxc_task
    r = sbxc_session.lifecycle()
    assert r.get("killed"), f"the lifecycle launch could not be made: {r.get('why')}"
    left = [f"pid {p['pid']} ({p['comm']}): {', '.join(p['why'])}" for p in r.get("survivors", [])]
    assert r.get("gone_after") is not None and not left, (
        f"{r.get('why') or 'the task outlived its launcher'}; still running after the launcher's SIGKILL "
        f"(killed by the harness): {left}"
    )
