"""The paths the profile names, each judged at its own path: masked, read_only, writable, absent and
hidden (parametrised by the profile's templates, "{state}/db"), the task's control directory and the
per-user temp."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from sandbox_conformance.conformance.plan import PLANT, WRITE, Task
from sandbox_conformance.conformance.plugin import Settings, settings
from sandbox_conformance.conformance.profile import Profile

# The autouse fixture that names the running witness for _task_view: pytest finds a fixture among a
# module's own names, so every module of the suite imports it.
from sandbox_conformance.conformance.witnesses._common import _current as _current
from sandbox_conformance.conformance.witnesses._common import (
    _declared_writable,
    _mounts,
    _p,
    _seen,
    witness,
)
from sandbox_conformance.kernel import mountinfo

PATH_FAMILIES: dict[str, tuple[str, Callable[[Profile], tuple[str, ...]]]] = {
    "masked_path": ("masked", lambda p: p.filesystem.masked),
    "read_only_path": ("read_only", lambda p: p.filesystem.read_only),
    "writable_path": ("writable", lambda p: p.filesystem.writable),
    "absent_path": ("absent", lambda p: p.filesystem.absent),
    "hidden_path": ("hidden", lambda p: p.filesystem.hidden),
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for arg, (_, paths) in PATH_FAMILIES.items():
        if arg in metafunc.fixturenames:
            templates = list(paths(settings(metafunc.config).profile)) or ["(none)"]
            metafunc.parametrize(arg, templates, ids=templates)


def _control(task: Task, sbxc_settings: Settings) -> str:
    assert sbxc_settings.profile.task.control is not None
    return _p(task, sbxc_settings.profile.task.control)


def _created(task: Task, directory: str, prefix: str) -> tuple[str, str]:
    """The file the plan had the task create in `directory` (path, content)."""
    [op] = [
        o
        for o in task.plan.ops
        if o["op"] == "create"
        and os.path.dirname(o["path"]) == directory
        and os.path.basename(o["path"]).startswith(prefix)
    ]
    return op["path"], op["data"]


# ---- masked ------------------------------------------------------------------------------------


@witness("masked")
def test_a_masked_directory_is_an_empty_read_only_tmpfs(sbxc_task: Task, masked_path: str) -> None:
    path = _p(sbxc_task, masked_path)
    # The task's real mount table, read from the host: the mount that serves the path there.
    mount = mountinfo.serving(_mounts(sbxc_task), path)
    assert mount is not None and mount.mount_point == path, (
        f"nothing is mounted at {masked_path} in the task's mount table (no mask)"
        + (f": it is served by the {mount.fstype} at {mount.mount_point}" if mount else "")
    )
    assert mount.fstype == "tmpfs", f"{masked_path} is a {mount.fstype} mount, not a tmpfs"
    assert mount.read_only, f"the tmpfs at {masked_path} is mounted {','.join(mount.options)}, not ro"
    assert mount.dev not in sbxc_task.host_devices, (
        f"the tmpfs at {masked_path} ({mount.dev}) is one the host has mounted too, not the sandbox's own"
    )
    listing = sbxc_task.observed("list", path)
    assert listing == "ok", f"listing {masked_path} gave {listing}"
    assert sbxc_task.value("list", path) == [], f"{masked_path} is not empty: {sbxc_task.value('list', path)}"


@witness("masked")
def test_a_masked_directorys_host_canary_is_invisible(sbxc_task: Task, masked_path: str) -> None:
    path = _p(sbxc_task, masked_path)
    reads = [o["path"] for o in sbxc_task.plan.ops if o["op"] == "read" and o["path"].startswith(path + "/")]
    if not reads:
        pytest.skip(f"the host has no file directly in {masked_path} to hide: the witness would be vacuous")
    seen = {r: sbxc_task.observed("read", r) for r in reads}
    assert all(v == "ENOENT" for v in seen.values()), f"host content under {masked_path} seen inside: {seen}"


@witness("masked")
def test_nothing_can_be_created_in_a_masked_directory(
    sbxc_task: Task, masked_path: str, sbxc_settings: Settings
) -> None:
    plant, _ = _created(sbxc_task, _p(sbxc_task, masked_path), PLANT)
    accepted = sbxc_settings.profile.filesystem.refuse
    seen = sbxc_task.observed("create", plant)
    assert seen in accepted, f"creating a file in {masked_path} gave {seen}, not {' or '.join(accepted)}"
    # A refusal refused: the host's own look afterwards.
    assert sbxc_task.host_after.get(plant) is None, f"the file created in {masked_path} reached the host"


# ---- read-only -------------------------------------------------------------------------------------


@witness("read_only")
def test_a_read_only_path_is_readable(sbxc_task: Task, read_only_path: str) -> None:
    path = _p(sbxc_task, read_only_path)
    if not os.path.exists(path):
        pytest.skip(f"{read_only_path} does not exist on the host: nothing to show readable")
    assert sbxc_task.observed("stat", path) == "ok", (
        f"{read_only_path} is not visible inside: stat gave {sbxc_task.observed('stat', path)}"
    )
    for o in sbxc_task.plan.ops:
        if o["op"] == "read" and (o["path"] == path or os.path.dirname(o["path"]) == path):
            # Bytes, as the task reads them (conformance/inside.py: 4096 bytes, then UTF-8 with
            # replacement): text mode would read 4096 characters and turn CRLF into LF (issue 28).
            with open(o["path"], "rb") as f:
                host = f.read(4096).decode("utf-8", "replace")
            seen = sbxc_task.observed("read", o["path"])
            assert sbxc_task.value("read", o["path"]) == host, (
                f"reading {o['path']} inside gave {seen}, not the host content"
            )
    if os.path.isdir(path):
        assert sbxc_task.observed("list", path) == "ok", (
            f"{read_only_path} cannot be listed inside: {sbxc_task.observed('list', path)}"
        )
        assert sbxc_task.value("list", path), f"{read_only_path} is empty inside but not on the host"


def _refusal_ok(task: Task, op: Mapping[str, Any], seen: str, accepted: tuple[str, ...]) -> bool:
    if seen in accepted:
        return True
    if op["op"] == "append" and not op.get("owned", True):
        return seen == "EACCES"  # a file the task user does not own: file modes answer first
    # A directory beneath the read-only path that does not exist inside (hidden by the sandbox).
    return (
        op["op"] == "create"
        and seen == "ENOENT"
        and task.observed("stat", os.path.dirname(op["path"])) == "ENOENT"
    )


@witness("read_only")
def test_a_read_only_path_refuses_writes_with_erofs(
    sbxc_task: Task, read_only_path: str, sbxc_settings: Settings
) -> None:
    # EROFS unless the profile accepts other refusals ([filesystem] refuse): the name says the default.
    path = _p(sbxc_task, read_only_path)
    ops = [o for o in sbxc_task.plan.ops if o.get("read_only") == read_only_path]
    if not ops:
        pytest.skip(f"{read_only_path} does not exist on the host: no write to try")
    tried = {
        f"{o['op']} {o['path'].replace(path, read_only_path, 1)}": sbxc_task.observed(o["op"], o["path"])
        for o in ops
    }
    accepted = sbxc_settings.profile.filesystem.refuse
    wrong = {
        k: v
        for (k, v), o in zip(tried.items(), ops, strict=True)
        if not _refusal_ok(sbxc_task, o, v, accepted)
    }
    assert not wrong, f"writes at and beneath {read_only_path} gave {wrong}, not {' or '.join(accepted)}"
    landed = [
        o["path"] for o in ops if o["op"] == "create" and sbxc_task.host_after.get(o["path"]) is not None
    ]
    assert not landed, f"files the task created under {read_only_path} reached the host: {landed}"


@witness("read_only")
def test_every_mount_beneath_a_read_only_path_is_read_only(
    sbxc_task: Task, read_only_path: str, sbxc_settings: Settings
) -> None:
    path = _p(sbxc_task, read_only_path)
    # Writable inside is not promised away for a hidden path beneath (its own promise: nothing written
    # there reaches the host), any more than for a declared writable one.
    declared = _declared_writable(sbxc_task, sbxc_settings) + [
        _p(sbxc_task, h) for h in sbxc_settings.profile.filesystem.hidden
    ]
    rw = [
        f"{m.fstype} at {m.mount_point}"
        for m in mountinfo.on_top(_mounts(sbxc_task))
        if mountinfo.under(m.mount_point, path)
        and not m.read_only
        and not any(mountinfo.under(m.mount_point, d) for d in declared)
        and m.mount_point not in _seen(sbxc_task).device_nodes
    ]
    # Only mounts AT or beneath the path: the one serving the path itself from above counts too.
    top = mountinfo.serving(_mounts(sbxc_task), path)
    if (
        top is not None
        and not top.read_only
        and top.mount_point != path
        and mountinfo.under(path, top.mount_point)
    ):
        rw.insert(0, f"{top.fstype} at {top.mount_point} (serving {read_only_path})")
    # A read-write mount whose every write the task tried was refused anyway (a seccomp filter or an LSM
    # answering for the mount) is a contradiction between the table and the task's behaviour; it stays
    # BROKEN, named as such: the mount is still writable by any call the refusing layer does not see
    # (io_uring, another ABI), which no write the task tried can rule out.
    ops = [o for o in sbxc_task.plan.ops if o.get("read_only") == read_only_path]
    accepted = sbxc_settings.profile.filesystem.refuse
    refused = bool(ops) and all(
        _refusal_ok(sbxc_task, o, sbxc_task.observed(o["op"], o["path"]), accepted) for o in ops
    )
    why = (
        "; a contradiction: every write the task tried there was refused, so something other than the "
        "mount refuses them, and only the calls it sees"
        if rw and refused
        else ""
    )
    assert not rw, f"read-write mounts at or beneath {read_only_path} in the task's mount table: {rw}{why}"


# ---- writable --------------------------------------------------------------------------------------


@witness("writable")
def test_a_writable_path_accepts_a_file_the_host_sees(sbxc_task: Task, writable_path: str) -> None:
    path, data = _created(sbxc_task, _p(sbxc_task, writable_path), WRITE)
    assert sbxc_task.observed("create", path) == "ok", (
        f"creating a file in {writable_path} gave {sbxc_task.observed('create', path)}"
    )
    assert sbxc_task.host_after.get(path) == data, (
        f"the host does not see the file written in {writable_path}"
    )


# ---- absent ----------------------------------------------------------------------------------------


@witness("absent")
def test_an_absent_path_does_not_exist_inside(sbxc_task: Task, absent_path: str) -> None:
    path = _p(sbxc_task, absent_path)
    if not os.path.exists(path):
        pytest.skip(f"{absent_path} does not exist on the host either: the witness would be vacuous")
    seen = sbxc_task.observed("stat", path)
    assert seen == "ENOENT", (
        f"{absent_path} (which exists on the host) is visible inside: stat gave {seen}"
        + (f", listing {sbxc_task.value('list', path)}" if sbxc_task.observed("list", path) == "ok" else "")
    )


# ---- hidden --------------------------------------------------------------------------------------------
# The weakest filesystem promise: what the host holds there is unreadable inside, and nothing the task
# writes there reaches the host. Whether the path exists, is empty or is writable inside is not asked
# (srt's deny-read path is an empty writable tmpfs, codex's a mode-000 one: both keep it).


def _host_text(path: str) -> str | None:
    # Bytes, as the task reads them (conformance/inside.py do_read): text mode would read 4096
    # characters and turn CRLF into LF, and a hidden file's content seen inside would never compare
    # equal (issue 28's false red, the other way round here: a leak missed).
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode("utf-8", "replace")
    except OSError:
        return None


@witness("hidden")
def test_a_hidden_paths_host_content_is_unreadable(sbxc_task: Task, hidden_path: str) -> None:
    path = _p(sbxc_task, hidden_path)
    if not os.path.exists(path):
        pytest.skip(
            f"{hidden_path} does not exist on the host: nothing to hide, the witness would be vacuous"
        )
    reads = [o["path"] for o in sbxc_task.plan.ops if o["op"] == "read" and mountinfo.under(o["path"], path)]
    host = {r: _host_text(r) for r in reads}
    if not any(host.values()):
        pytest.skip(f"the host has no file beneath {hidden_path} to hide: the witness would be vacuous")
    leaked = {
        r.replace(path, hidden_path, 1): "its host content"
        for r in reads
        if sbxc_task.observed("read", r) == "ok"
        and host[r] is not None
        and sbxc_task.value("read", r) == host[r]
    }
    listing = sbxc_task.value("list", path) if sbxc_task.observed("list", path) == "ok" else []
    try:
        on_host = set(os.listdir(path))
    except OSError:
        on_host = set()
    names = sorted(set(listing or []) & on_host)
    assert not leaked and not names, f"host content of {hidden_path} is readable inside: " + ", ".join(
        [f"{k} gave {v}" for k, v in leaked.items()] + ([f"listing shows {names}"] if names else [])
    )
    # Under any other name too: a mount in the task's real mount table that shows the host's tree there.
    with open("/proc/self/mountinfo") as f:
        host_mounts = mountinfo.parse(f.read())
    where = mountinfo.locate(host_mounts, path)
    aliases = (
        [
            f"{e.path} (through the mount at {e.mount.mount_point})"
            for e in mountinfo.exposures(_mounts(sbxc_task), where)
        ]
        if where is not None
        else []
    )
    assert not aliases, f"the host's {hidden_path} is reachable inside the task at {aliases}"


@witness("hidden")
def test_nothing_written_in_a_hidden_path_reaches_the_host(sbxc_task: Task, hidden_path: str) -> None:
    path = _p(sbxc_task, hidden_path)
    plant, data = _created(sbxc_task, path, PLANT)
    seen = sbxc_task.observed("create", plant)
    landed = sbxc_task.host_after.get(plant)
    assert landed is None, f"a file the task created in {hidden_path} ({seen} inside) reached the host" + (
        " with the task's content" if landed == data else ""
    )


# ---- the per-task control directory ----------------------------------------------------------------


@witness("control")
def test_the_control_directorys_files_are_readable(sbxc_task: Task, sbxc_settings: Settings) -> None:
    control = _control(sbxc_task, sbxc_settings)
    for name in sbxc_settings.profile.task.control_files:
        f = f"{control}/{name}"
        assert sbxc_task.observed("read", f) == "ok", f"reading {name} gave {sbxc_task.observed('read', f)}"
        # What the host seeded before the launch; it carries this run's nonce (conformance/layout.py).
        [seeded] = [o.get("expect") for o in sbxc_task.plan.ops if o["op"] == "read" and o["path"] == f]
        assert sbxc_task.value("read", f) == seeded, (
            f"{name} inside is not this task's seeded file: {sbxc_task.value('read', f)!r}"
        )


@witness("control")
def test_an_append_to_the_control_directorys_file_is_refused_with_erofs(
    sbxc_task: Task, sbxc_settings: Settings
) -> None:
    control = _control(sbxc_task, sbxc_settings)
    seen = {
        n: sbxc_task.observed("append", f"{control}/{n}") for n in sbxc_settings.profile.task.control_files
    }
    assert all(v == "EROFS" for v in seen.values()), f"appending to the control files gave {seen}"


@witness("control")
def test_a_file_cannot_be_planted_in_the_control_directory(sbxc_task: Task, sbxc_settings: Settings) -> None:
    control = _control(sbxc_task, sbxc_settings)
    plant, _ = _created(sbxc_task, control, PLANT)
    seen = sbxc_task.observed("create", plant)
    assert seen == "EROFS", f"planting a file in the control directory gave {seen}"
    assert sbxc_task.host_after.get(plant) is None, "the planted file reached the host's control directory"


@witness("control")
def test_the_control_directorys_files_cannot_be_removed(sbxc_task: Task, sbxc_settings: Settings) -> None:
    control = _control(sbxc_task, sbxc_settings)
    seen = {
        n: sbxc_task.observed("unlink", f"{control}/{n}") for n in sbxc_settings.profile.task.control_files
    }
    assert all(v == "EROFS" for v in seen.values()), f"removing the control files gave {seen}"


# ---- the per-user temp -------------------------------------------------------------------------------


@witness("user_tmp")
def test_a_sibling_in_the_per_user_temp_stays_writable(sbxc_task: Task, sbxc_settings: Settings) -> None:
    # What separates a read-only bind scoped to the task's control dir from a read-only task tree.
    assert sbxc_settings.profile.task.user_tmp is not None
    path, data = _created(sbxc_task, _p(sbxc_task, sbxc_settings.profile.task.user_tmp), WRITE)
    seen = sbxc_task.observed("create", path)
    assert seen == "ok", f"creating a file in the per-user temp gave {seen}"
    assert sbxc_task.host_after.get(path) == data, (
        "the host does not see the file written in the per-user temp"
    )
