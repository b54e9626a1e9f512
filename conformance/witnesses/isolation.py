"""The namespaces the host sees the task in (pid, ipc, uts and its hostname) and its privileges
(capabilities, no_new_privs), judged on the host's /proc/PID."""

from __future__ import annotations

from sandbox_conformance.conformance.plan import Task
from sandbox_conformance.conformance.plugin import Settings
from sandbox_conformance.conformance.profile import Caps

# The autouse fixture that names the running witness for _task_view: pytest finds a fixture among a
# module's own names, so every module of the suite imports it.
from sandbox_conformance.conformance.witnesses._common import _current as _current
from sandbox_conformance.conformance.witnesses._common import (
    _host_ns,
    _inside,
    _seen,
    _task_view,
    witness,
)

# ---- pid, ipc, uts: judged on the namespaces the HOST sees the task in ---------------------------------


# What the task reads of a command line (conformance/inside.py processes: 512 bytes).
CMDLINE_BYTES = 512


def _as_read_inside(cmdline: tuple[str, ...]) -> tuple[str, ...]:
    """`cmdline` as the task's 512-byte read of /proc/PID/cmdline shows it: a longer one (the harness's,
    with a long --host-cannot-observe reason or many paths) never compared equal whole, so the harness
    seen inside was not recognised."""
    raw = ("\0".join(cmdline) + "\0").encode(errors="replace")[:CMDLINE_BYTES]
    parts = raw.decode("utf-8", "replace").split("\0")
    while parts and parts[-1] == "":
        parts.pop()
    return tuple(parts)


@witness("pid")
def test_host_pids_are_invisible_to_the_task(sbxc_task: Task) -> None:
    host = sbxc_task.host
    if not _task_view(sbxc_task):
        pid_ns = _host_ns(sbxc_task, "pid")
        assert pid_ns != host.namespaces.get("pid"), "the task is in the host's pid namespace"
    procs = sbxc_task.get("processes")
    assert isinstance(procs, list), f"the task could not list processes: {procs}"
    harness_seen_as = _as_read_inside(host.harness_cmdline)
    harness = [
        p
        for p in procs
        if p["pid"] == host.harness_pid and tuple(p.get("cmdline", ())) == harness_seen_as
    ]
    assert not harness, f"the harness process (host pid {host.harness_pid}) is visible inside the task"
    if not _task_view(sbxc_task):
        # A second procfs, of the host's pid namespace, bound in beside the task's own /proc (a
        # monitoring agent's `-v /proc:/host/proc`): every host process is listed there, whatever the
        # task's own /proc shows. Read by the host at the handshake, through the task's root.
        shown = _seen(sbxc_task).host_procfs
        assert not isinstance(shown, str), f"the host could not tell which procfs the task reaches ({shown})"
        assert not shown, (
            f"a procfs of the host's pid namespace is mounted inside the task at {', '.join(shown)}: every "
            "host process is listed there"
        )


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
    assert tuple(pid1.get("cmdline", ())) != _as_read_inside(sbxc_task.host.pid1_cmdline), (
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
