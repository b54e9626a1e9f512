"""`cgroup` and `cgroup.delegation`: which cgroup layout this host has, where we live in it, and
whether a subtree is delegated to us -- proved by creating a throwaway child, writing its
`memory.max`, reading it back and removing it.

Never writes to a cgroup we do not own: the proof runs only under a root that passed every
ownership check below, and its child is removed in a `finally`, even on error."""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from sandbox_conformance.kernel import mountinfo
from sandbox_conformance.kernel.cgroupfs import (
    CGROUP2_SUPER_MAGIC,
    CGROUP_SUPER_MAGIC,
    PROMISE_ENV,
    CgroupFs,
    Statfs,
    initial_cgroupns,
    own_cgroup,
    prove,
    statfs_magic,
    v1_bound_controllers,
)
from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.probes.host import Host

# systemd >= 251 marks a cgroup it delegated (Delegate=yes) with this xattr: trusted.* when the
# system manager did it, user.* when a user manager did (docs/CGROUP_DELEGATION.md).
DELEGATE_XATTRS = ("trusted.delegate", "user.delegate")


def resolve_root(own: str) -> str:
    """Truncate at the innermost `.service` / `.scope` component: that unit is what a manager
    delegates (Delegate=yes applies to a service or scope, never to a slice), and anything below it
    is ours to organise. With no such component the cgroup itself is the candidate."""
    parts = [p for p in own.split("/") if p]
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].endswith((".service", ".scope")):
            return "/" + "/".join(parts[: i + 1])
    return "/" + "/".join(parts)


class CgroupLayout(NamedTuple):
    """The host's cgroup layout as `decide_layout` reads it from statfs and mountinfo: which kind, the
    cgroup2 mount to resolve paths through, and where the two sources disagree."""

    name: str  # "v1" | "hybrid" | "unified" | "none"
    v2_mount: mountinfo.Mount | None  # the cgroup2 mount we resolve paths through
    conflicts: tuple[str, ...] = ()


def decide_layout(mounts: Sequence[mountinfo.Mount], magic: Mapping[str, int | None]) -> CgroupLayout:
    """systemd's cg_unified_cached(): statfs("/sys/fs/cgroup") is CGROUP2 -> unified; TMPFS with
    /sys/fs/cgroup/unified CGROUP2 -> hybrid; otherwise legacy. mountinfo adds cgroup2 mounts elsewhere
    and the v1 hierarchies. statfs is the kernel's answer for the path now; a mountinfo entry it
    contradicts (an over-mounted cgroup2) is recorded as a conflict, not believed."""
    v2 = [m for m in mounts if m.fstype == "cgroup2"]
    v1 = [m for m in mounts if m.fstype == "cgroup"]
    conflicts = []
    confirmed = []
    for m in v2:
        got = magic.get(m.mount_point)
        if got == CGROUP2_SUPER_MAGIC:
            confirmed.append(m)
        else:
            conflicts.append(f"mountinfo lists cgroup2 at {m.mount_point} but statfs says "
                             f"{'nothing' if got is None else hex(got)}")
    # Prefer the standard places, in systemd's order.
    confirmed.sort(key=lambda m: {"/sys/fs/cgroup": 0, "/sys/fs/cgroup/unified": 1}.get(m.mount_point, 2))
    top = magic.get("/sys/fs/cgroup")
    if top == CGROUP2_SUPER_MAGIC and not any(m.mount_point == "/sys/fs/cgroup" for m in confirmed):
        conflicts.append("statfs says cgroup2 at /sys/fs/cgroup but mountinfo does not list it")
    mount = confirmed[0] if confirmed else None
    if mount is not None and mount.mount_point == "/sys/fs/cgroup":
        name = "unified"
    elif mount is not None:
        name = "hybrid" if v1 else "unified"
    else:
        name = "v1" if v1 else "none"
    return CgroupLayout(name, mount, tuple(conflicts))


def fs_path(mount: mountinfo.Mount, cgroup: str) -> str | None:
    """Host-absolute path of `cgroup` through `mount`, or None when the mount does not show it
    (a bind mount of another subtree). Both are relative to our cgroup namespace's root."""
    base = mount.root.rstrip("/")
    if base and cgroup != base and not cgroup.startswith(base + "/"):
        return None
    rel = cgroup[len(base):].strip("/")
    return os.path.join(mount.mount_point, rel) if rel else mount.mount_point


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except (FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError):
        return None


def _words(text: str | None) -> list[str]:
    return sorted((text or "").split())


def _xattr(path: Path, name: str) -> str | None:
    try:
        return os.getxattr(path, name).decode(errors="replace")
    except OSError as e:
        # ENODATA: not set; ENOTSUP: this fs has no such namespace; EPERM/EACCES: trusted.* unreadable.
        if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EPERM, errno.EACCES, errno.ENOENT):
            return None
        raise


class RootState(NamedTuple):
    """What we observed about a candidate delegated root; decided on by `blockers()`, a pure function."""

    path: str  # host-absolute
    promised: bool
    exists: bool
    is_dir: bool
    magic: int | None
    hierarchy_root: bool  # the same directory (st_dev, st_ino) as the root of our cgroup2 mount
    machine_root: bool  # the kernel's root cgroup: no cgroup.type, which every other cgroup has
    initial_cgroupns: bool  # True when we are (or may be) in the kernel's initial cgroup namespace
    writable: Mapping[str, bool]  # ".", "cgroup.procs", "cgroup.subtree_control" -> access(W_OK)
    delegate_xattr: str | None
    controllers: tuple[str, ...]
    subtree_control: tuple[str, ...]


def blockers(state: RootState, euid: int, v1_bound: Sequence[str]) -> list[str]:
    """Every reason `state.path` may not be written by us, most fundamental first; empty: go ahead."""
    p = state.path
    if not state.exists:
        return [f"{p} does not exist"]
    if not state.is_dir:
        return [f"{p} is not a directory"]
    if state.magic != CGROUP2_SUPER_MAGIC:
        got = "unknown" if state.magic is None else hex(state.magic)
        kind = " (a cgroup v1 hierarchy)" if state.magic == CGROUP_SUPER_MAGIC else ""
        return [f"{p} is not on a cgroup2 filesystem (statfs magic {got}{kind})"]
    out = []
    if state.machine_root:
        # cgroup-v2.rst: "cgroup.type ... exists on non-root cgroups". Whatever path or cgroup
        # namespace led here, this is the whole machine's root cgroup.
        out.append(f"{p} is the machine's root cgroup (it has no cgroup.type), which nobody delegates")
    elif state.hierarchy_root and state.initial_cgroupns:
        # The root cgroup of the initial namespace belongs to the whole machine; no manager
        # delegates it, and its children are where the init system keeps everyone else.
        out.append(f"{p} is the root of the host's cgroup2 hierarchy, which nobody delegates")
    names = (".", "cgroup.procs", "cgroup.subtree_control")
    unwritable = [("the directory" if n == "." else n) for n in names if not state.writable.get(n, False)]
    if unwritable:
        out.append(f"{', '.join(unwritable)} of {p} not writable by uid {euid}")
    # Root passes every access() check (CAP_DAC_OVERRIDE), so for root write access proves nothing:
    # ownership must come from the promise, a manager's delegate mark, or a cgroup namespace of
    # our own whose root the container engine handed us.
    own_ns_root = state.hierarchy_root and not state.initial_cgroupns and not state.machine_root
    if euid == 0 and not (state.promised or state.delegate_xattr or own_ns_root) and not out:
        out.append(f"{p} carries no trusted.delegate/user.delegate mark and uid 0 can write anywhere, "
                   f"so nothing shows it is ours (set {PROMISE_ENV} to a subtree you own)")
    if "memory" not in state.controllers:
        where = "; memory is bound to a cgroup v1 hierarchy" if "memory" in v1_bound else ""
        have = " ".join(state.controllers) or "none"
        out.append(f"no memory controller available at {p} (cgroup.controllers: {have}){where}")
    return out


def observe_root(host: Host, path: str, *, promised: bool, layout: CgroupLayout, statfs: Statfs) -> RootState:
    real = host.path(path)
    exists, is_dir = real.exists(), real.is_dir()
    mount = layout.v2_mount
    # Compare directories, not strings: a symlink or a second bind mount must not smuggle the
    # hierarchy root past this check.
    hierarchy_root = False
    if mount is not None and mount.root == "/" and exists:
        try:
            a, b = os.stat(real), os.stat(host.path(mount.mount_point))
            hierarchy_root = (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
        except FileNotFoundError:
            pass
    magic = statfs(real) if exists else None
    machine_root = magic == CGROUP2_SUPER_MAGIC and is_dir and not (real / "cgroup.type").exists()
    writable = {n: os.access(real / n if n != "." else real, os.W_OK) for n in
                (".", "cgroup.procs", "cgroup.subtree_control")} if is_dir else {}
    xattr = None
    if is_dir:
        for name in DELEGATE_XATTRS:
            xattr = _xattr(real, name)
            if xattr:
                xattr = f"{name}={xattr}"
                break
    return RootState(
        path=path, promised=promised, exists=exists, is_dir=is_dir,
        magic=magic, hierarchy_root=hierarchy_root, machine_root=machine_root,
        initial_cgroupns=initial_cgroupns(host.proc),
        writable=writable, delegate_xattr=xattr,
        controllers=tuple(_words(_read(real / "cgroup.controllers"))),
        subtree_control=tuple(_words(_read(real / "cgroup.subtree_control"))),
    )


def probe(host: Host, *, statfs: Statfs = statfs_magic, fs: CgroupFs | None = None) -> list[Finding]:
    mounts = mountinfo.parse(_read(host.proc / "self/mountinfo") or "")
    points = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} | {m.mount_point for m in mounts
                                                             if m.fstype == "cgroup2"}
    magic = {p: statfs(host.path(p)) for p in sorted(points)}
    layout = decide_layout(mounts, magic)
    own = own_cgroup(_read(host.proc / "self/cgroup") or "")
    v1_bound = v1_bound_controllers(_read(host.proc / "cgroups") or "")
    ev: dict[str, str] = {f"statfs {p}": ("none" if m is None else hex(m)) for p, m in magic.items()}
    ev["/proc/self/cgroup 0::"] = own if own is not None else "(no 0:: line)"
    ev["v1 bound controllers"] = " ".join(v1_bound) or "none"
    for i, c in enumerate(layout.conflicts):
        ev[f"conflict.{i}"] = c

    root_cg = resolve_root(own) if own is not None else None
    root = fs_path(layout.v2_mount, root_cg) if (layout.v2_mount and root_cg is not None) else None
    available = _words(_read(host.path(root) / "cgroup.controllers")) if root else []
    enabled = _words(_read(host.path(root) / "cgroup.subtree_control")) if root else []
    facts = {"layout": layout.name, "own": own, "root": root, "controllers_available": available,
             "controllers_enabled": enabled, "v1_controllers": v1_bound,
             "v2_mount": layout.v2_mount.mount_point if layout.v2_mount else None}
    if layout.v2_mount is None:
        cg = Finding("cgroup", Verdict.unsupported,
                     f"no cgroup2 hierarchy mounted (layout {layout.name}); "
                     f"v1 holds: {' '.join(v1_bound) or 'nothing'}", ev, facts)
    else:
        held = f"; v1 holds {' '.join(v1_bound)}" if layout.name == "hybrid" and v1_bound else ""
        cg = Finding("cgroup", Verdict.supported,
                     f"{layout.name} layout: cgroup2 at {layout.v2_mount.mount_point}, own cgroup {own}, "
                     f"root {root or '(not visible)'}, controllers {' '.join(available) or 'none'}{held}",
                     ev, facts)
    return [cg, delegation(host, layout, root, v1_bound, statfs=statfs, fs=fs, base_evidence=ev)]


def delegation(host: Host, layout: CgroupLayout, resolved: str | None, v1_bound: Sequence[str], *,
               statfs: Statfs, fs: CgroupFs | None, base_evidence: Mapping[str, str]) -> Finding:
    promised_path = host.env.get(PROMISE_ENV, "")
    promised = bool(promised_path)
    ev = dict(base_evidence)
    if promised:
        ev[PROMISE_ENV] = promised_path
        if not os.path.isabs(promised_path):
            return Finding("cgroup.delegation", Verdict.denied,
                           f"{PROMISE_ENV}={promised_path} is not an absolute path",
                           ev, {"root": None, "promised": True})
        candidate: str | None = os.path.normpath(promised_path)
    else:
        candidate = resolved
    facts = {"root": None, "promised": promised, "candidate": candidate}
    # A promise is kept or broken: `denied` names what failed. Without one, no delegation is simply
    # something this host does not offer us.
    failed = Verdict.denied if promised else Verdict.unsupported
    if candidate is None:
        why = ("no cgroup2 hierarchy mounted" if layout.v2_mount is None
               else "our cgroup is not visible through the cgroup2 mount")
        return Finding("cgroup.delegation", failed, f"no delegated cgroup root: {why} (layout {layout.name})",
                       ev, facts)
    state = observe_root(host, candidate, promised=promised, layout=layout, statfs=statfs)
    ev["candidate"] = candidate
    ev["candidate.controllers"] = " ".join(state.controllers) or "none"
    ev["candidate.subtree_control"] = " ".join(state.subtree_control) or "none"
    ev["candidate.delegate_xattr"] = state.delegate_xattr or "none"
    ev["candidate.initial_cgroupns"] = str(state.initial_cgroupns)
    found = blockers(state, host.euid, v1_bound)
    if found:
        lead = (f"{PROMISE_ENV}={candidate} is unusable" if promised
                else f"no usable delegated root ({layout.name} layout)")
        for i, b in enumerate(found):
            ev[f"blocker.{i}"] = b
        return Finding("cgroup.delegation", failed, f"{lead}: {'; '.join(found)}", ev, facts)
    proof = prove(host.path(candidate), state.subtree_control, fs)
    ev.update(proof.evidence)
    if not proof.ok or proof.leftover:
        # A proof that could not undo itself left a child or a subtree_control change in the root: a
        # root we cannot clean up after is no root to run in (cgroup_setup refuses it the same way).
        lead = f"{PROMISE_ENV}={candidate}" if promised else candidate
        what = proof.what if not proof.ok else f"could not clean up after it: {proof.leftover}"
        return Finding("cgroup.delegation", failed, f"{lead}: proof failed: {what}", ev, facts)
    facts["root"] = candidate
    return Finding("cgroup.delegation", Verdict.supported, f"delegated root {candidate}: {proof.what}", ev,
                   facts)
