"""What only the host's kernel can tell: a protected path under another name (aliases), the write
surface, the task's own /proc against the kernel's state, the directory the task really starts in."""

from __future__ import annotations

import os
from typing import Any

from sandbox_conformance.conformance.plan import Task
from sandbox_conformance.conformance.plugin import Settings
from sandbox_conformance.conformance.profile import expand

# The autouse fixture that names the running witness for _task_view: pytest finds a fixture among a
# module's own names, so every module of the suite imports it.
from sandbox_conformance.conformance.witnesses._common import _current as _current
from sandbox_conformance.conformance.witnesses._common import (
    _declared_writable,
    _inside,
    _mounts,
    _p,
    _seen,
    witness,
)
from sandbox_conformance.kernel import mountinfo

# ---- what only the host can tell: aliases, the write surface, the task's own /proc, its workdir -------


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
