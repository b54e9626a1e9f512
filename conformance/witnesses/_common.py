"""What the witness modules share: the `witness` mark, the task's view and the host's, and the small
readers every promise family judges with. No tests here, and no name starting with `test_`."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_conformance.conformance.observer import Seen
from sandbox_conformance.conformance.plan import Task
from sandbox_conformance.conformance.plugin import Settings
from sandbox_conformance.conformance.profile import expand
from sandbox_conformance.kernel import mountinfo

witness = pytest.mark.witness


def _p(task: Task, template: str) -> str:
    return expand(template, task.values)


# The witness running now (set by _current), for _task_view to label its report.
_RUNNING: list[pytest.Item] = []
TASK_VIEW = "sbxc_view"  # a user property: "task" where the verdict rests on the task's view alone


@pytest.fixture(autouse=True)
def _current(request: pytest.FixtureRequest) -> Any:
    _RUNNING[:] = [request.node]
    yield
    _RUNNING.clear()


def _task_view(task: Task) -> bool:
    """True where the host was declared unable to see the task (gVisor, a VM): a witness whose promise
    the task shows by its own behaviour (what it can see, reach, read) then judges that alone, and its
    report says so ("kept, task's view only"). Never where the host could look and did not find it."""
    if task.seen is None and task.unobserved:
        if _RUNNING and (TASK_VIEW, "task") not in _RUNNING[0].user_properties:
            _RUNNING[0].user_properties.append((TASK_VIEW, "task"))
        return True
    return False


def _seen(task: Task) -> Seen:
    """The task's process as the host's kernel showed it. Where the host was declared unable to see
    the task, a kernel-state promise is not tested (a skip, a failure under --require): never judged
    on what the task's own, sandbox-controlled /proc says."""
    if task.seen is None:
        if task.unobserved:
            pytest.skip(task.unobserved)
        # Not a harness error: a launcher that prints a document with no live task behind it is the
        # broken (or hostile) sandbox this witness exists for.
        raise AssertionError(
            task.unseen
            or "no live task seen from the host (a sandbox whose tasks run out of this kernel's sight, "
            "such as gVisor or a VM, says so with --host-cannot-observe 'WHY')"
        )
    return task.seen


def _host_ns(task: Task, name: str) -> str:
    value = _seen(task).namespaces.get(name, "error: not read")
    assert not value.startswith("error"), (
        f"cannot tell the task's {name} namespace: the host's /proc/PID/ns/{name} gave {value}"
    )
    return value


def _mounts(task: Task) -> tuple[mountinfo.Mount, ...]:
    mounts = _seen(task).reach  # from the task's own root mount (mountinfo.reachable())
    assert not isinstance(mounts, str), f"cannot tell the task's mount table: the host's read gave {mounts}"
    return mounts


def _inside(task: Task, key: str) -> Any:
    value = task.get(key)
    assert value is not None, f"the task did not report {key}"
    assert not (isinstance(value, dict) and "error" in value), f"the task could not try {key}: {value}"
    return value


def _door(result: dict[str, Any]) -> str:
    if result.get("ok"):
        return "CREATED"
    if result.get("absent"):
        # The kernel has no such entry point (no x32 ABI: ENOSYS; no IA32 emulation: int 0x80 faults).
        return f"absent ({result.get('errno') or 'signal ' + str(result.get('signal'))})"
    if "error" in result or not result.get("errno"):
        return f"could not be tried: {result.get('error')}"
    return str(result["errno"])


def _declared_writable(task: Task, s: Settings) -> list[str]:
    fs, t = s.profile.filesystem, s.profile.task
    return [
        expand(p, task.values) for p in (*fs.writable, *fs.scratch, t.workdir, t.user_tmp) if p is not None
    ]
