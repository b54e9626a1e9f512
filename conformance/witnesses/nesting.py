"""Nested user namespaces: every door to one (clone, clone3, unshare, the i386 and x32 entry points)
is refused, with the errno the profile names."""

from __future__ import annotations

import os

import pytest

from sandbox_conformance.conformance.harness import WitnessSession
from sandbox_conformance.conformance.plan import Task
from sandbox_conformance.conformance.plugin import Settings

# The autouse fixture that names the running witness for _task_view: pytest finds a fixture among a
# module's own names, so every module of the suite imports it.
from sandbox_conformance.conformance.witnesses._common import _current as _current
from sandbox_conformance.conformance.witnesses._common import (
    _door,
    witness,
)

# ---- nested user namespaces --------------------------------------------------------------------------


ABI_DOORS = ("i386 unshare", "x32 unshare") if os.uname().machine == "x86_64" else ()


@witness("nested_userns")
def test_a_nested_user_namespace_is_refused_by_every_door(
    sbxc_task: Task, sbxc_session: WitnessSession, sbxc_settings: Settings
) -> None:
    why = sbxc_session.nested_userns_skip()
    if why:
        pytest.skip(why)  # never claim a boundary that is not there
    doors = sbxc_task.get("nested_userns")
    assert isinstance(doors, dict) and "error" not in doors, (
        f"the nested user namespace was not tried: {doors}"
    )
    expected = sbxc_settings.profile.nested_errno
    seen = {name: _door(r) for name, r in doors.items()}
    required = {"clone", "clone3", "unshare", *ABI_DOORS}
    assert required <= set(seen), f"doors not tried: {sorted(required - set(seen))}; tried {seen}"
    opened = [n for n, v in seen.items() if v == "CREATED"]
    assert not opened, (
        f"{' and '.join(opened)} with CLONE_NEWUSER created a user namespace inside the task: {seen}"
    )
    untried = {n: v for n, v in seen.items() if v.startswith("could not")}
    assert not untried, f"doors that could not be tried: {untried}"
    if expected:
        wrong = {n: v for n, v in seen.items() if v not in expected and not v.startswith("absent")}
        assert not wrong, f"refused with {wrong}, the profile says {' or '.join(expected)}"
