"""The witnesses: each asserts what a LIVE task observed from inside the sandbox (never the argv).

Every test is marked `witness(family)`; a family the profile does not promise is deselected by the
plugin. Path witnesses are parametrised by the profile's path templates ("{state}/db"), so node ids
are stable from run to run while the temp paths behind them are fresh. One launch serves them all
(`sbxc_task` is session-scoped). A launch that fails is a harness ERROR in every witness, never a
pass; a broken promise is a plain assertion FAILURE naming what the task saw."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from sandbox_conformance.conformance.harness import WitnessSession
from sandbox_conformance.conformance.launch import NoObservation
from sandbox_conformance.conformance.observer import Seen
from sandbox_conformance.conformance.plan import PLANT, WRITE, Task
from sandbox_conformance.conformance.plugin import Settings, settings
from sandbox_conformance.conformance.profile import Caps, NetworkMode, Profile, expand
from sandbox_conformance.kernel import mountinfo
from sandbox_conformance.kernel.cgroupfs import PROMISE_ENV

witness = pytest.mark.witness
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


def _p(task: Task, template: str) -> str:
    return expand(template, task.values)


def _control(task: Task, sbxc_settings: Settings) -> str:
    assert sbxc_settings.profile.task.control is not None
    return _p(task, sbxc_settings.profile.task.control)


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
    try:
        with open(path, errors="replace") as f:
            return f.read(4096)
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


# ---- network -----------------------------------------------------------------------------------------


def _socket_refused(task: Task) -> bool:
    """Every TCP attempt the task made was refused at socket(2) itself, with EPERM: a seccomp filter
    leaves it no network at all (codex)."""
    tcp = task.get("tcp") or []
    return bool(tcp) and all(
        c["result"].get("stage") == "socket" and c["result"].get("errno") == "EPERM" for c in tcp
    )


@witness("network")
def test_the_task_sees_only_the_loopback_interface(sbxc_task: Task) -> None:
    interfaces = sbxc_task.get("interfaces")
    if isinstance(interfaces, dict) and interfaces.get("errno") == "EPERM" and _socket_refused(sbxc_task):
        # if_nameindex(3) needs a socket too: no interface can be listed because no socket can be made,
        # which the refused connects prove (not the listing).
        return
    assert interfaces == ["lo"], f"interfaces inside: {interfaces}"


def _proxies(task: Task) -> list[dict[str, Any]]:
    """The proxies the task's environment offered it, with what each one did (inside.proxy_trials)."""
    trials = task.get("proxies")
    if trials is None:
        return []
    assert isinstance(trials, dict) and "error" not in trials, f"the task could not try its proxies: {trials}"
    return list(trials.get("offered", []))


def _through(entry: dict[str, Any], kinds: tuple[str, ...]) -> list[str]:
    """Targets of these kinds the proxy tunnelled to (and, for the echo listener, back from)."""
    out = []
    for t in entry.get("tunnels", []):
        r = t["result"]
        if t["kind"] in kinds and r.get("established") and r.get("echoed") is not False:
            out.append(f"{t['host']}:{t['port']} ({t['kind']}, {r.get('status')})")
    return out


@witness("network")
def test_the_task_cannot_reach_the_hosts_tcp_listener(sbxc_task: Task, sbxc_settings: Settings) -> None:
    reached = [c["target"] for c in sbxc_task.get("tcp") or [] if c["result"].get("ok")]
    assert sbxc_task.get("tcp"), "the task made no TCP connect attempt"
    assert not reached, f"the task connected to the host's TCP listener at {reached}"
    proxies = _proxies(sbxc_task)
    for p in proxies:
        through = _through(p, ("loopback", "host"))
        assert not through, (
            f"through the proxy {p['proxy']} (from {', '.join(p['vars'])}) the task reached {through}"
        )
    if sbxc_settings.profile.network is NetworkMode.none:
        # No proxy at all: one that answers is a way out whatever it lets through (srt's, with even one
        # name allowed, carries the task to it). That sandbox keeps network = "proxy", never "none".
        open_ = [
            f"{p['proxy']} (from {', '.join(p['vars'])})"
            + (
                f", through which it reached {_through(p, ('listed', 'unlisted'))}"
                if _through(p, ("listed", "unlisted"))
                else ""
            )
            for p in proxies
            if p["connect"].get("ok")
        ]
        assert not open_, f"network none, but the task is offered a proxy it can reach: {open_}"


@witness("network")
def test_the_task_cannot_reach_the_hosts_abstract_unix_socket(sbxc_task: Task) -> None:
    attempts = sbxc_task.get("unix_abstract") or []
    assert attempts, "the task made no abstract unix socket connect attempt"
    reached = [c["target"] for c in attempts if c["result"].get("ok")]
    assert not reached, (
        f"the task connected to the host's abstract unix socket @{reached[0] if reached else ''}"
    )


# ---- network through a proxy: [network] mode = "proxy", allowed = [...] ------------------------------


def _proxy_plan(task: Task) -> dict[str, Any]:
    assert task.plan.proxy is not None
    return dict(task.plan.proxy)


@witness("network_proxy")
def test_a_listed_name_is_reachable_through_the_proxy(sbxc_task: Task, sbxc_settings: Settings) -> None:
    plan = _proxy_plan(sbxc_task)
    if not sbxc_settings.profile.network_allowed:
        pytest.skip("[network] allowed lists no name: nothing must come through")
    if plan["unserved"]:
        pytest.skip(f"the suite cannot serve every allowed name here: {plan['unserved']}")
    proxies = _proxies(sbxc_task)
    assert proxies, "network proxy, but the task's environment names no proxy (no *_proxy variable)"
    for name in sbxc_settings.profile.network_allowed:
        came_back = {
            p["proxy"]: [
                t["result"] for t in p.get("tunnels", []) if t["kind"] == "listed" and t["host"] == name
            ]
            for p in proxies
        }
        ok = [proxy for proxy, rs in came_back.items() if any(r.get("echoed") for r in rs)]
        assert ok, f"{name} (allowed) did not come back through any proxy offered: {came_back}"
    direct = [d for d in ((sbxc_task.get("proxies") or {}).get("direct") or []) if d["result"].get("ok")]
    assert not direct, f"the task reached {direct} directly, not through the proxy"


@witness("network_proxy")
def test_the_proxy_refuses_unlisted_names_loopback_and_the_hosts_addresses(sbxc_task: Task) -> None:
    plan = _proxy_plan(sbxc_task)
    proxies = _proxies(sbxc_task)
    assert proxies, "network proxy, but the task's environment names no proxy (no *_proxy variable)"
    kinds = sorted({t["kind"] for t in plan["targets"] if t["kind"] != "listed"})
    tried = [p for p in proxies if p.get("tunnels")]
    assert tried, f"no proxy offered could be tried: {[(p['proxy'], p['connect']) for p in proxies]}"
    through = {p["proxy"]: _through(p, ("unlisted", "loopback", "host")) for p in proxies}
    through = {k: v for k, v in through.items() if v}
    assert not through, f"the proxy let through what is not allowed ({', '.join(kinds)}): {through}"


# ---- nested user namespaces --------------------------------------------------------------------------


ABI_DOORS = ("i386 unshare", "x32 unshare") if os.uname().machine == "x86_64" else ()


def _door(result: dict[str, Any]) -> str:
    if result.get("ok"):
        return "CREATED"
    if result.get("absent"):
        # The kernel has no such entry point (no x32 ABI: ENOSYS; no IA32 emulation: int 0x80 faults).
        return f"absent ({result.get('errno') or 'signal ' + str(result.get('signal'))})"
    if "error" in result or not result.get("errno"):
        return f"could not be tried: {result.get('error')}"
    return str(result["errno"])


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


# ---- pid, ipc, uts, net: judged on the namespaces the HOST sees the task in ----------------------------


@witness("pid")
def test_host_pids_are_invisible_to_the_task(sbxc_task: Task) -> None:
    host = sbxc_task.host
    if not _task_view(sbxc_task):
        pid_ns = _host_ns(sbxc_task, "pid")
        assert pid_ns != host.namespaces.get("pid"), "the task is in the host's pid namespace"
    procs = sbxc_task.get("processes")
    assert isinstance(procs, list), f"the task could not list processes: {procs}"
    harness = [
        p
        for p in procs
        if p["pid"] == host.harness_pid and tuple(p.get("cmdline", ())) == host.harness_cmdline
    ]
    assert not harness, f"the harness process (host pid {host.harness_pid}) is visible inside the task"


@witness("pid")
def test_pid_1_is_the_sandboxs_init(sbxc_task: Task, sbxc_settings: Settings) -> None:
    nspid = _seen(sbxc_task).nspid
    assert len(nspid) >= 2, (
        f"the host sees the task with NSpid {nspid}: it is not in a pid namespace of its own"
    )
    procs = sbxc_task.get("processes")
    assert isinstance(procs, list), f"the task could not list processes: {procs}"
    [pid1] = [p for p in procs if p["pid"] == 1] or [None]
    assert pid1 is not None, "PID 1 is not visible inside the task"
    assert tuple(pid1.get("cmdline", ())) != sbxc_task.host.pid1_cmdline, (
        f"PID 1 inside is the host's init ({' '.join(sbxc_task.host.pid1_cmdline)[:80]})"
    )
    inits = sbxc_settings.profile.process.init
    if inits is not None:
        assert pid1.get("comm") in inits, (
            f"PID 1 inside is {pid1.get('comm')!r}, the profile says {' or '.join(map(repr, inits))}"
        )


@witness("ipc")
def test_the_ipc_namespace_is_private(sbxc_task: Task) -> None:
    host = sbxc_task.host.namespaces.get("ipc")
    if not _task_view(sbxc_task):
        assert _host_ns(sbxc_task, "ipc") != host, f"the task shares the host's ipc namespace {host}"
    # And by behaviour: the harness's System V shared memory segment is not there for the task.
    if sbxc_task.host.shm_key:
        shm = _inside(sbxc_task, "shm")
        assert shm.get("errno") == "ENOENT", (
            f"the host's shared memory segment (key {sbxc_task.host.shm_key:#x}) is visible to the task: "
            f"shmget gave {shm}"
        )


@witness("uts")
def test_the_uts_namespace_is_private(sbxc_task: Task, sbxc_settings: Settings) -> None:
    host = sbxc_task.host.namespaces.get("uts")
    if _task_view(sbxc_task):
        # The name it sees is its own; a namespace of its own is what only the host can show.
        assert sbxc_task.get("hostname") != sbxc_task.host.hostname, (
            f"the task sees the host's hostname {sbxc_task.host.hostname!r}"
        )
    else:
        assert _host_ns(sbxc_task, "uts") != host, f"the task shares the host's uts namespace {host}"
    name = sbxc_settings.profile.namespaces.hostname
    if name is not None:
        assert sbxc_task.get("hostname") == name, (
            f"hostname inside is {sbxc_task.get('hostname')!r}, not {name!r}"
        )


@witness("network")
def test_the_task_has_a_network_namespace_of_its_own(sbxc_task: Task) -> None:
    host = sbxc_task.host.namespaces.get("net")
    assert _host_ns(sbxc_task, "net") != host, f"the task shares the host's network namespace {host}"


# ---- capabilities, no_new_privs: the host's /proc/PID/status ------------------------------------------


def _host_status(task: Task) -> dict[str, str]:
    status = _seen(task).status
    assert not isinstance(status, str), f"cannot tell: the host's /proc/PID/status gave {status}"
    return dict(status)


@witness("capabilities")
def test_the_task_has_no_capabilities(sbxc_task: Task, sbxc_settings: Settings) -> None:
    status = _host_status(sbxc_task)
    names: tuple[str, ...] = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
    if sbxc_settings.profile.process.capabilities is Caps.none_effective:
        # None it can use, none it can gain at execve; the bounding set is not promised.
        names = ("CapPrm", "CapEff", "CapAmb")
    sets = {k: status.get(k) for k in names}
    held = {k: v for k, v in sets.items() if v is None or int(v, 16) != 0}
    assert not held, f"capability sets of the task as the host sees them: {held}"


@witness("no_new_privs")
def test_no_new_privs_is_set(sbxc_task: Task) -> None:
    nnp = _host_status(sbxc_task).get("NoNewPrivs")
    assert nnp == "1", f"NoNewPrivs of the task as the host sees it is {nnp}"


# ---- environment: the environment the host's kernel holds for the task --------------------------------


def _host_environ(task: Task) -> dict[str, str]:
    if _task_view(task):
        inside = task.get("environment")
        assert isinstance(inside, dict), f"the task could not read its environment: {inside}"
        return dict(inside)
    env = _seen(task).environ
    assert not isinstance(env, str), f"cannot tell: the host's /proc/PID/environ gave {env}"
    return dict(env)


@witness("environment")
def test_only_allowlisted_environment_keys_arrive(sbxc_task: Task, sbxc_settings: Settings) -> None:
    env = _host_environ(sbxc_task)
    extra = sorted(set(env) - set(sbxc_settings.profile.environment.allow or ()))
    assert not extra, f"keys outside the allowlist arrived: {extra}"


@witness("environment")
def test_the_launchers_secret_does_not_reach_the_task(sbxc_task: Task) -> None:
    env = _host_environ(sbxc_task)
    key, secret = sbxc_task.host.secret_key, sbxc_task.host.secret_value
    assert key not in env, f"{key} reached the task"
    # Under any name: a launcher that renames it, or passes it as an allowlisted key's value.
    carriers = sorted(k for k, v in env.items() if secret in v or secret in k)
    assert not carriers, f"the launcher's secret value reached the task in {carriers}"


@witness("environment_set")
def test_the_environment_set_by_the_profile_is_exactly_that(sbxc_task: Task, sbxc_settings: Settings) -> None:
    wanted = {k: expand(v, sbxc_task.values) for k, v in sbxc_settings.profile.environment.set.items()}
    env = _host_environ(sbxc_task)
    wrong = {k: env.get(k) for k, v in wanted.items() if env.get(k) != v}
    assert not wrong, f"environment values differ from the profile's [environment.set]: {wrong}"


# ---- what only the host can tell: aliases, the write surface, the task's own /proc, leftovers ---------


@witness("aliases")
def test_no_mount_shows_a_protected_host_path_under_any_name(sbxc_task: Task) -> None:
    _mounts(sbxc_task)
    found = [
        f"{e['template']} at {e['path']} (through the mount at {e['mount_point']}; lists {e['listing']})"
        for e in _seen(sbxc_task).exposures
    ]
    # And by content, whatever the mechanism (a copy, a hardlink, an overlay of the host's tree): the
    # task searched every mount that can hold files for this run's canaries and their inodes.
    reach = sbxc_task.plan.reach or {}
    if reach.get("canaries"):
        scan = _inside(sbxc_task, "aliases")
        found += [f"a protected canary's content at {p}" for p in scan["found"]]
        found += [f"a protected file's inode (the same device and inode) at {p}" for p in scan["same_inode"]]
    assert not found, f"host content that must be hidden is reachable inside the task: {found}"


def _declared_writable(task: Task, s: Settings) -> list[str]:
    fs, t = s.profile.filesystem, s.profile.task
    return [
        expand(p, task.values) for p in (*fs.writable, *fs.scratch, t.workdir, t.user_tmp) if p is not None
    ]


@witness("write_surface")
def test_every_writable_host_mount_is_a_declared_writable_path(
    sbxc_task: Task, sbxc_settings: Settings
) -> None:
    declared = _declared_writable(sbxc_task, sbxc_settings)
    fs = sbxc_settings.profile.filesystem
    scratch = [expand(p, sbxc_task.values) for p in fs.scratch]
    seen = _seen(sbxc_task)
    with open("/proc/self/mountinfo") as f:  # the host's, where the declared paths live
        host = mountinfo.parse(f.read())

    def declared_here(m: mountinfo.Mount) -> bool:
        # Under a scratch path, any mount the sandbox makes for the task alone. Under a declared writable
        # path, only that host directory itself, bound at its own place: a read-write bind of other host
        # storage mounted at or beneath it (the host's /etc at {workdir}/etc) is surface nobody declared.
        if any(mountinfo.under(m.mount_point, d) for d in scratch):
            return True
        return any(mountinfo.locate(host, m.mount_point) == mountinfo.Location(m.dev, m.root)
                   for d in declared if mountinfo.under(m.mount_point, d))

    undeclared = [
        f"{m.fstype} {m.source}:{m.root} at {m.mount_point}"
        for m in mountinfo.on_top(_mounts(sbxc_task))
        # Read-write, holding data (not procfs and the like), and on a filesystem the host has mounted
        # too: what the task writes there reaches the host. A tmpfs the sandbox made is its own.
        if not m.read_only
        and m.storage
        and m.dev in sbxc_task.host_devices
        and not declared_here(m)
        and m.mount_point not in seen.device_nodes
        # A mount the task's credentials cannot even reach is no surface it can write to.
        and m.mount_point not in seen.unreachable
    ]
    assert not undeclared, (
        f"read-write mounts of host storage that the profile does not declare writable: {undeclared}"
    )


@witness("kernel_view")
def test_the_tasks_proc_shows_the_kernels_state(sbxc_task: Task) -> None:
    # Every comparison the host can make is made: where the host's reading works and the task's own
    # fails (its /proc/self does not resolve, a field is missing), that is a disagreement, never a skip.
    seen = _seen(sbxc_task)
    kernel = sbxc_task.get("kernel") or {}
    differ = []

    def unread(what: str, value: Any) -> None:
        differ.append(f"{what}: the host reads it, the task cannot ({value!r})")

    inside_ns = sbxc_task.get("namespaces") or {}
    if not isinstance(inside_ns, dict) or "error" in inside_ns:
        unread("ns/*", inside_ns)
        inside_ns = {}
    for ns, host_value in seen.namespaces.items():
        if host_value.startswith("error"):
            continue
        mine = inside_ns.get(ns, "")
        if not mine or mine.startswith("error"):
            unread(f"ns/{ns}", mine or None)
        elif mine != host_value:
            differ.append(f"ns/{ns}: inside {mine}, host {host_value}")
    if seen.nspid:
        if not isinstance(kernel.get("pid"), int):
            unread("getpid()", kernel.get("pid"))
        elif kernel["pid"] != seen.nspid[-1]:
            differ.append(f"getpid() {kernel['pid']}, host NSpid {seen.nspid}")
    status = sbxc_task.get("status") or {}
    if not isinstance(seen.status, str):
        if not isinstance(status, dict) or "error" in status:
            unread("/proc/self/status", status)
            status = {}
        for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
            if seen.status.get(k) is None:
                continue
            if k not in status:
                unread(f"status {k}", None)
            elif status[k] != seen.status.get(k):
                differ.append(f"{k}: inside {status[k]}, host {seen.status.get(k)}")
        caps = kernel.get("caps") or {}
        if "error" in caps or not caps:
            unread("capget(2)", caps)
        for k, v in caps.items():
            if k != "error" and int(v, 16) != int(seen.status.get(k, "0"), 16):
                differ.append(f"capget {k} {v}, host {seen.status.get(k)}")
        nnp = kernel.get("no_new_privs")
        if not isinstance(nnp, int):
            unread("prctl(PR_GET_NO_NEW_PRIVS)", nnp)
        elif str(nnp) != seen.status.get("NoNewPrivs"):
            differ.append(f"prctl(PR_GET_NO_NEW_PRIVS) {nnp}, host {seen.status.get('NoNewPrivs')}")
    env = sbxc_task.get("environment")
    if not isinstance(seen.environ, str):
        if not isinstance(env, dict) or "error" in env:
            unread("/proc/self/environ", env)
        elif env != seen.environ:
            differ.append(f"environment: inside {sorted(env)}, host {sorted(seen.environ)}")
    magic = kernel.get("proc_magic")
    if not isinstance(magic, str) or magic.startswith("error"):
        unread("statfs(/proc)", magic)
    elif magic != "9fa0":
        differ.append(f"/proc is not a procfs (statfs f_type {magic})")
    assert not differ, f"the task's /proc does not show the kernel's state: {differ}"


@witness("workdir")
def test_the_task_starts_in_its_working_directory(sbxc_task: Task, sbxc_settings: Settings) -> None:
    template = sbxc_settings.profile.task.workdir
    assert template is not None
    want = _p(sbxc_task, template)
    inside = sbxc_task.get("cwd")
    assert inside == want, f"the task started in {inside}, not in {template}"
    seen = _seen(sbxc_task)
    assert not isinstance(seen.cwd, str), f"the host could not read the task's working directory: {seen.cwd}"
    st = os.stat(want)
    # The same path inside can name another directory (an empty tmpfs, a copy): the host's kernel
    # says which directory the task is really in.
    assert tuple(seen.cwd) == (st.st_dev, st.st_ino), (
        f"the task is in a directory named {want} that is not the host's {template} "
        f"(host sees dev/inode {tuple(seen.cwd)}, the workdir is {(st.st_dev, st.st_ino)})"
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


@witness("terminal")
def test_the_task_cannot_type_into_the_terminal_it_was_started_from(
    sbxc_task: Task, sbxc_session: WitnessSession
) -> None:
    # A third launch, from a pseudo-terminal the harness holds (the launcher's controlling terminal,
    # the task's stderr), as a user runs a sandbox from a shell: the task must not be able to push
    # input into it (TIOCSTI), which a shell would run as typed (bwrap CVE-2017-5226).
    del sbxc_task
    r = sbxc_session.terminal()
    t = r.get("terminal")
    assert isinstance(t, dict) and "error" not in t, (
        f"the terminal launch gave no answer (exit {r.get('exit')}, timed out: {r.get('timed_out')}; "
        f"said {r.get('stderr')!r}): {t}"
    )
    tiocsti = t.get("tiocsti") or {}
    assert not tiocsti.get("ok") and not r.get("injected"), (
        f"the task pushed input into the terminal it was started from: TIOCSTI {tiocsti}, the terminal "
        f"read {r.get('injected')!r}; it holds /dev/tty: {t.get('dev_tty')}, session leader: "
        f"{t.get('session_leader')}"
    )


# ---- the other syscall doors: each answers as the profile's [syscalls] table says ---------------------


def _own_session_keyring() -> object:
    # The harness's session keyring (keyrings(7)), asked the way the task asked for its own, to say
    # whether the task's is the same one.
    from sandbox_conformance.conformance import inside

    return inside.door_keyctl().get("returned")


@witness("syscalls")
def test_every_other_syscall_door_answers_as_the_profile_says(
    sbxc_task: Task, sbxc_session: WitnessSession, sbxc_settings: Settings
) -> None:
    # io_uring, keyctl, the new mount API, AF_VSOCK, a ptrace of a process outside and TIOCLINUX: each
    # tried once by the task with arguments that change nothing (bubblewrap's and Flatpak's
    # try-syscall tests), each judged by the errno the profile names for it.
    doors = _inside(sbxc_task, "doors")
    seen = {name: _door(r) for name, r in doors.items() if isinstance(r, dict)}
    expected = sbxc_settings.profile.doors()
    promised = sbxc_settings.profile.promises()
    if "tioclinux" in seen and expected.get("tioclinux") != "allowed" and "terminal" in promised:
        # Only the terminal launch has a terminal to try it on.
        t = sbxc_session.terminal().get("terminal")
        if isinstance(t, dict) and isinstance(t.get("tioclinux"), dict):
            seen["tioclinux"] = _door(t["tioclinux"])
    wrong: dict[str, str] = {}
    for name, want in expected.items():
        if want == "allowed":
            continue
        got = seen.get(name, "not tried")
        if got.startswith("absent"):
            continue  # no such entry point here (no terminal, no keyctl number): nothing to open
        if got == "CREATED" or got.startswith(("could not", "not tried")):
            wrong[name] = "OPENED" if got == "CREATED" else got
        elif want != "refused" and got not in want:
            wrong[name] = f"{got}, the profile says {' or '.join(want)}"
    if "OPENED" in wrong.get("keyctl", "") and doors["keyctl"].get("returned") == _own_session_keyring():
        wrong["keyctl"] += " (the harness's own session keyring)"
    assert not wrong, f"doors that did not answer as the profile says: {wrong}; every door: {seen}"


# ---- what the task holds and reaches: descriptors, the secret anywhere, kernel settings, devices, sockets --
# Every profile makes these promises unless it disclaims one ([promises] not_claimed). Each is judged
# from both sides: what the task managed from inside, and what the host's kernel shows around it.


def _reach(task: Task) -> dict[str, Any]:
    reached = dict(_seen(task).reached)
    assert reached, "the host did not read what the task holds (no reach reading)"
    return reached


def _inside(task: Task, key: str) -> Any:
    value = task.get(key)
    assert value is not None, f"the task did not report {key}"
    assert not (isinstance(value, dict) and "error" in value), f"the task could not try {key}: {value}"
    return value


@witness("descriptors")
def test_the_task_holds_no_descriptor_that_leads_out(sbxc_task: Task) -> None:
    host = {} if _task_view(sbxc_task) else _reach(sbxc_task)
    held = [f"pid {d['pid']} fd {d['fd']} -> {d['link']}: {d['why']}" for d in host.get("descriptors", [])]
    inside = _inside(sbxc_task, "descriptors")
    # From inside: a directory the task can climb out of, a socket that is connected or listening.
    walked = [
        f"fd {d['fd']} ({d.get('link')}): a directory whose '..' lists {d['parent'].get('listing')}"
        for d in inside
        if d.get("type") == "dir" and isinstance(d.get("parent"), dict) and d["parent"].get("ok")
    ]
    sockets = [
        f"fd {d['fd']} ({d.get('link')}): a socket, peer {d.get('peer')}"
        for d in inside
        if d.get("type") == "socket"
        and (d.get("listening") or not str(d.get("peer", "")).startswith("error"))
    ]
    assert not held and not walked and not sockets, (
        f"descriptors that lead out of the sandbox: host sees {held}; the task walked {walked}; "
        f"sockets {sockets}"
    )


@witness("secrets")
def test_the_launchers_secret_is_readable_nowhere_in_the_task(sbxc_task: Task) -> None:
    reached = {} if _task_view(sbxc_task) else _reach(sbxc_task)
    holders = list(reached.get("secret_holders", []))
    files = [f"{e['host_path']} at {e['path']}" for e in reached.get("secret_file", [])]
    scan = _inside(sbxc_task, "secrets")
    inside = list(scan.get("found", []))
    from_fds = [f"fd {d['fd']}" for d in sbxc_task.get("descriptors") or [] if d.get("secret")]
    left = list(sbxc_task.secret_files)
    assert not (holders or files or inside or from_fds or left), (
        "the launcher's secret is readable in the task: "
        + "; ".join(
            f"{what}: {where}"
            for what, where in (
                ("host sees it in", holders),
                ("its file is reachable", files),
                ("the task read it from", inside + from_fds),
                ("written where the task works", left),
            )
            if where
        )
    )


@witness("kernel_interfaces")
def test_the_hosts_kernel_settings_cannot_be_opened_for_writing(sbxc_task: Task) -> None:
    tried = _inside(sbxc_task, "kernel_writes")
    assert tried, "no kernel setting was tried"
    opened = [
        t["path"] + (" (written back)" if t.get("wrote_back") else "") for t in tried if t.get("opened")
    ]
    view = _task_view(sbxc_task)
    proc_sys = "(the host cannot observe the task)" if view else _reach(sbxc_task).get("proc_sys")
    assert not opened, (
        f"the task opened host kernel settings for writing: {opened}; the mount serving /proc/sys in the "
        f"task, as the host reads it: {proc_sys}"
    )


@witness("devices")
def test_only_allowlisted_device_nodes_can_be_opened(sbxc_task: Task) -> None:
    tried = _inside(sbxc_task, "devices")
    opened = [
        f"{d['path']} ({d['rdev']}, {d.get('how')})"
        for d in tried
        if d.get("opened") and not d.get("allowed")
    ]
    tried_paths = {d["path"] for d in tried}
    seen = [] if _task_view(sbxc_task) else _reach(sbxc_task)["devices"]
    # The host sees a node the task never tried: a path outside /dev (a node bound next to a minimal /dev)
    # or one the task's own listing missed. Whether it would open is then unknown: never a pass.
    untried = [f"{d['path']} ({d['rdev']})" for d in seen if d["path"] not in tried_paths]
    assert not opened and not untried, (
        f"device nodes off the allowlist: the task opened {opened}; the host sees, untried, {untried}"
    )


@witness("host_sockets")
def test_no_host_unix_socket_can_be_connected_to(sbxc_task: Task, sbxc_settings: Settings) -> None:
    allowed = {expand(p, sbxc_task.values) for p in sbxc_settings.profile.unix_allowed}
    tried = _inside(sbxc_task, "unix_sockets")
    connected = [t["path"] for t in tried if t.get("ok") and t["path"] not in allowed]
    # A sandbox that refuses socket(AF_UNIX) outright (srt's seccomp filter) leaves a socket file it
    # shows unusable: the task's first step fails before any path is looked up. Only then is what the
    # host sees not a way out; the task tried every one (the planted socket among them).
    outright = bool(tried) and all(t.get("stage") == "socket" for t in tried)
    exposed = [
        f"{e['host_path']} at {e['path']}"
        for e in ([] if _task_view(sbxc_task) else _reach(sbxc_task)["sockets"])
        if e["path"] not in allowed and e["host_path"] not in allowed and not outright
    ]
    knocks = sbxc_task.knocks
    assert not connected and not exposed and not knocks, (
        f"host unix sockets reachable from the task: it connected to {connected}; the host sees {exposed}"
        + (f"; the planted daemon socket took {knocks} connection(s)" if knocks else "")
    )


# ---- cgroup limits -----------------------------------------------------------------------------------
# The harness gives each task its own leaf with the profile's limits (conformance/harness.py) when the
# cgroup.delegation probe proved a usable root; the witness program tries the limits from inside and
# the harness reads the leaf's event counters on the host. Also marked `cgroup` for `-m cgroup`.

cgroup = pytest.mark.cgroup


def _leaf(task: Task, session: WitnessSession) -> dict[str, Any]:
    if task.cgroup is None:
        _, why = session.cgroup_root()
        found = session.guard.get("cgroup.delegation")
        if found is not None and found.facts.get("promised") and not found.ok:
            # A set SANDBOX_CONFORMANCE_CGROUP_ROOT is a promise (STYLE.md 11): broken, it is a failure
            # of the run, never a quiet skip. Only an unset variable is an honest skip.
            raise NoObservation(
                f"{PROMISE_ENV} is set but unusable, so no task got a cgroup leaf: {found.reason} "
                f"(unset it to skip the cgroup witnesses instead)"
            )
        pytest.skip(f"no cgroup leaf for the task: {why}")
    return dict(task.cgroup)


def _own_cgroup(task: Task) -> dict[str, Any]:
    """For a launcher that keeps its own cgroups: the task's cgroup as the host's kernel shows it (its
    /proc/PID/cgroup, and that directory's limits read through the host's cgroup2 mount). None of it
    comes from the task or from the harness: the promise is the sandbox's."""
    files = dict(_seen(task).cgroup_files)
    assert "error" not in files, f"cannot tell the task's cgroup: {files.get('error')}"
    assert files["path"] != task.host.cgroup, (
        f"the task runs in the harness's own cgroup {files['path']}: no leaf of its own, no limit of its own"
    )
    return files


def _limit_kept(task: Task, name: str, promised: int | None) -> None:
    files = _own_cgroup(task)
    value = files.get(name, "")
    assert not value.startswith("error"), f"cannot tell {name} of the task's cgroup {files['path']}: {value}"
    assert value != "max" and promised is not None and int(value) <= promised, (
        f"the task's cgroup {files['path']} has {name} {value}, the profile promises {promised}"
    )


def _trial(task: Task, name: str) -> dict[str, Any]:
    trial = task.get(name)
    assert isinstance(trial, dict), f"the task made no {name.replace('_', ' ')}"
    assert "error" not in trial, f"the {name.replace('_', ' ')} could not be made: {trial['error']}"
    return trial


def _seen_by_host(task: Task, leaf: dict[str, Any], pid: int) -> dict[str, Any] | None:
    """The host's view (harness.host_view) of the task's process `pid` (as the task numbers it), among
    the processes the leaf's cgroup.procs listed while the task ran."""
    pidns = (task.get("namespaces") or {}).get("pid")
    before: list[dict[str, Any]] = (leaf.get("kill") or {}).get("before", [])
    for v in before:
        if v["pidns"] == pidns and v["nspid"] and v["nspid"][-1] == pid:
            return v
    return None


@witness("cgroup")
@cgroup
def test_the_task_runs_in_its_own_cgroup_leaf(sbxc_task: Task, sbxc_session: WitnessSession) -> None:
    if not sbxc_session.leaves_by_harness:
        files = _own_cgroup(sbxc_task)
        # Not the root either: a cgroup of the sandbox's own, somewhere below.
        assert files["path"] not in ("/", ""), f"the task runs in the root cgroup {files['path']!r}"
        return
    leaf = _leaf(sbxc_task, sbxc_session)
    kill = leaf.get("kill") or {}
    assert kill.get("before"), f"the host never saw the task's leaf populated: {kill.get('why')}"
    me = _seen_by_host(sbxc_task, leaf, sbxc_task.get("pid"))
    assert me is not None, (
        f"the task's process was not in its leaf {leaf['cgroup_path']} while it ran "
        f"(cgroup.procs held {[v['pid'] for v in kill['before']]})"
    )
    assert me["cgroup"] == [f"0::{leaf['cgroup_path']}"], (
        f"the host sees the task in {me['cgroup']}, not in its leaf {leaf['cgroup_path']}"
    )
    inside = sbxc_task.get("cgroup_self")
    assert isinstance(inside, str), f"the task could not read /proc/self/cgroup: {inside}"
    v2 = [line[3:] for line in inside.splitlines() if line.startswith("0::")]
    assert v2, f"no cgroup v2 line in the task's /proc/self/cgroup: {inside!r}"
    if v2[0] == "/":
        # A cgroup namespace (bwrap --unshare-cgroup-try) made while already in the leaf is rooted at
        # the leaf, so the leaf reads "/" (cgroup_namespaces(7)); in the host's namespace "/" would be
        # the root cgroup itself.
        assert sbxc_task.get("namespaces")["cgroup"] != sbxc_task.host.namespaces.get("cgroup"), (
            "the task reads 0::/ in the host's cgroup namespace: it is in the root cgroup"
        )
    else:
        assert v2[0] == leaf["cgroup_path"], f"the task reads 0::{v2[0]}, not its leaf {leaf['cgroup_path']}"


@witness("memory_max")
@cgroup
def test_an_allocation_past_memory_max_is_oom_killed(
    sbxc_task: Task, sbxc_session: WitnessSession, sbxc_settings: Settings
) -> None:
    if not sbxc_session.leaves_by_harness:
        # The kernel enforces what memory.max says, on the cgroup the host sees the task in.
        _limit_kept(sbxc_task, "memory.max", sbxc_settings.profile.limits.memory_max)
        return
    leaf = _leaf(sbxc_task, sbxc_session)
    trial = _trial(sbxc_task, "memory_trial")
    limit = sbxc_settings.profile.limits.memory_max
    assert trial["signal"] == 9, (
        f"a child allocating {trial['size'] >> 20} MiB under memory.max {limit} ended with "
        + (f"signal {trial['signal']}" if trial["signal"] is not None else f"exit {trial['exit']}")
        + ", not SIGKILL by the OOM killer"
    )
    assert leaf["oom_kill"] >= 1, f"the leaf's memory.events shows no oom_kill: {leaf['memory_events']}"


@witness("pids_max")
@cgroup
def test_forking_past_pids_max_fails_with_eagain(
    sbxc_task: Task, sbxc_session: WitnessSession, sbxc_settings: Settings
) -> None:
    if not sbxc_session.leaves_by_harness:
        _limit_kept(sbxc_task, "pids.max", sbxc_settings.profile.limits.pids_max)
        return
    leaf = _leaf(sbxc_task, sbxc_session)
    limit = sbxc_settings.profile.limits.pids_max
    if (sbxc_task.plan.cgroup or {}).get("pids_forks") is None:
        pytest.skip(f"pids_max {limit} is too large to exhaust from inside a witness")
    trial = _trial(sbxc_task, "pids_trial")
    assert trial["refused"] == "EAGAIN", (
        f"{trial['forked']} of {trial['tries']} forks succeeded under pids.max {limit}"
        + (f", then fork failed with {trial['refused']}" if trial["refused"] else "")
    )
    assert limit is not None and trial["forked"] < limit, f"{trial['forked']} forks under pids.max {limit}"
    assert leaf["pids_events"].get("max", 0) >= 1, f"the leaf's pids.events: {leaf['pids_events']}"


@witness("cgroup")
@cgroup
@pytest.mark.harness_leaf
def test_a_task_tree_is_reaped_whole_by_cgroup_kill(sbxc_task: Task, sbxc_session: WitnessSession) -> None:
    leaf = _leaf(sbxc_task, sbxc_session)
    kill = leaf.get("kill") or {}
    assert kill.get("killed"), f"the harness did not kill the task's leaf: {kill.get('why')}"
    tree = sbxc_task.get("tree")
    assert isinstance(tree, list) and len(tree) == 3, f"the task could not spawn its tree: {tree}"
    seen = {t["role"]: _seen_by_host(sbxc_task, leaf, t["pid"]) for t in tree}
    missing = [role for role, v in seen.items() if v is None]
    assert not missing, f"the host did not see the task's {', '.join(missing)} in its leaf"
    me = _seen_by_host(sbxc_task, leaf, sbxc_task.get("pid"))
    escaped = seen["setsid grandchild"]
    assert escaped is not None  # `missing` above is empty
    # Not vacuous: the grandchild really left the task's session, so a session or process-group kill
    # would have missed it.
    assert me is None or escaped["sid"] != me["sid"], "the setsid grandchild stayed in the task's session"
    assert kill["after"] == [], f"the leaf still lists {kill['after']} after cgroup.kill"
    assert kill["alive_after"] == [], (
        f"host pids {kill['alive_after']} of the task's leaf survived {kill['method']}"
    )


@witness("cgroup")
@cgroup
@pytest.mark.harness_leaf
def test_a_neighbour_tasks_leaf_is_not_writable_from_inside(
    sbxc_task: Task, sbxc_session: WitnessSession
) -> None:
    leaf = _leaf(sbxc_task, sbxc_session)
    writes = sbxc_task.get("neighbour_writes")
    assert writes, "the task made no write to the neighbour's leaf"
    broken = [w["path"] for w in writes if "error" in w["result"]]
    assert not broken, f"the writes to {broken} could not be tried"
    through = [f"{w['data']!r} > {w['path']}" for w in writes if w["result"].get("ok")]
    assert not through, f"the task wrote to a neighbour task's leaf: {', '.join(through)}"
    nb = leaf["neighbour"]
    assert nb["memory_max_after"] == nb["memory_max_before"], (
        f"the neighbour's memory.max changed: {nb['memory_max_before']} -> {nb['memory_max_after']}"
    )
    assert nb["procs_after"] == [], f"processes entered the neighbour's leaf: {nb['procs_after']}"
