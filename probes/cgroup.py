"""`cgroup` and `cgroup.delegation`: which cgroup layout this host has, where we live in it, and
whether a subtree is delegated to us -- proved by creating a throwaway child, writing its
`memory.max`, reading it back and removing it.

Never writes to a cgroup we do not own: the proof runs only under a root that passed every
ownership check below, and its child is removed in a `finally`, even on error."""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from probes.finding import Finding, Verdict
from probes.host import Host

# include/uapi/linux/magic.h
CGROUP2_SUPER_MAGIC = 0x63677270
CGROUP_SUPER_MAGIC = 0x27E0EB
TMPFS_MAGIC = 0x01021994
# include/linux/proc_ns.h: the initial cgroup namespace's inode number, the same on every boot.
PROC_CGROUP_INIT_INO = 0xEFFFFFFB

PROMISE_ENV = "SANDBOX_CONFORMANCE_CGROUP_ROOT"
# systemd >= 251 marks a cgroup it delegated (Delegate=yes) with this xattr: trusted.* when the
# system manager did it, user.* when a user manager did (docs/CGROUP_DELEGATION.md).
DELEGATE_XATTRS = ("trusted.delegate", "user.delegate")
PROOF_LIMIT = 64 * 1024 * 1024

# statfs(2) f_type for a path, or None when the path cannot be statted. Injected by unit tests:
# a fake host in tmp_path lives on tmpfs/ext4 whatever layout it pretends to have.
Statfs = Callable[[Path], int | None]


def statfs_magic(path: Path) -> int | None:
    """f_type from statfs(2). Python has os.statvfs, which drops f_type, so ask libc."""
    # CDLL(None): the libc already mapped into this process. ctypes.util.find_library would spawn
    # ldconfig (a subprocess per call) to find the same thing.
    libc = ctypes.CDLL(None, use_errno=True)
    # struct statfs starts with f_type (__fsword_t, a C long) on every Linux ABI we run on; the
    # buffer is larger than the struct (120 bytes on x86_64/aarch64).
    buf = ctypes.create_string_buffer(256)
    if libc.statfs(os.fsencode(path), buf) != 0:
        err = ctypes.get_errno()
        if err in (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.ELOOP):
            return None
        raise OSError(err, os.strerror(err), str(path))
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class Mount:
    root: str  # the subtree of the filesystem this mount shows
    mountpoint: str
    fstype: str
    super_options: str


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo (fs/proc_namespace.c, mangle()).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """proc(5) mountinfo: `id parent maj:min root mountpoint opts [optional...] - fstype source super`."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mounts.append(Mount(_unescape(fields[3]), _unescape(fields[4]), tail[0], tail[2]))
    return mounts


def own_cgroup(proc_self_cgroup: str) -> str | None:
    """Our cgroup on the unified hierarchy: the `0::` line (cgroups(7)); None when there is none."""
    for line in proc_self_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            return path.removesuffix(" (deleted)")
    return None


def resolve_root(own: str) -> str:
    """Truncate at the innermost `.service` / `.scope` component: that unit is what a manager
    delegates (Delegate=yes applies to a service or scope, never to a slice), and anything below it
    is ours to organise. With no such component the cgroup itself is the candidate."""
    parts = [p for p in own.split("/") if p]
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].endswith((".service", ".scope")):
            return "/" + "/".join(parts[: i + 1])
    return "/" + "/".join(parts)


def v1_bound_controllers(proc_cgroups: str) -> list[str]:
    """Controllers bound to a v1 hierarchy (/proc/cgroups column 2 non-zero, enabled): a controller
    can be attached to one hierarchy only, so these are unavailable to cgroup2 (cgroup-v2.rst)."""
    out = []
    for line in proc_cgroups.splitlines():
        if line.startswith("#"):
            continue
        cols = line.split()
        if len(cols) >= 4 and cols[1] != "0" and cols[3] == "1":
            out.append(cols[0])
    return sorted(out)


@dataclasses.dataclass(frozen=True)
class Layout:
    name: str  # "v1" | "hybrid" | "unified" | "none"
    v2_mount: Mount | None  # the cgroup2 mount we resolve paths through
    conflicts: tuple[str, ...] = ()


def decide_layout(mounts: Sequence[Mount], magic: Mapping[str, int | None]) -> Layout:
    """systemd's cg_unified_cached(): statfs("/sys/fs/cgroup") is CGROUP2 -> unified; TMPFS with
    /sys/fs/cgroup/unified CGROUP2 -> hybrid; otherwise legacy. mountinfo adds cgroup2 mounts elsewhere
    and the v1 hierarchies. statfs is the kernel's answer for the path now; a mountinfo entry it
    contradicts (an over-mounted cgroup2) is recorded as a conflict, not believed."""
    v2 = [m for m in mounts if m.fstype == "cgroup2"]
    v1 = [m for m in mounts if m.fstype == "cgroup"]
    conflicts = []
    confirmed = []
    for m in v2:
        got = magic.get(m.mountpoint)
        if got == CGROUP2_SUPER_MAGIC:
            confirmed.append(m)
        else:
            conflicts.append(f"mountinfo lists cgroup2 at {m.mountpoint} but statfs says "
                             f"{'nothing' if got is None else hex(got)}")
    # Prefer the standard places, in systemd's order.
    confirmed.sort(key=lambda m: {"/sys/fs/cgroup": 0, "/sys/fs/cgroup/unified": 1}.get(m.mountpoint, 2))
    top = magic.get("/sys/fs/cgroup")
    if top == CGROUP2_SUPER_MAGIC and not any(m.mountpoint == "/sys/fs/cgroup" for m in confirmed):
        conflicts.append("statfs says cgroup2 at /sys/fs/cgroup but mountinfo does not list it")
    mount = confirmed[0] if confirmed else None
    if mount is not None and mount.mountpoint == "/sys/fs/cgroup":
        name = "unified"
    elif mount is not None:
        name = "hybrid" if v1 else "unified"
    else:
        name = "v1" if v1 else "none"
    return Layout(name, mount, tuple(conflicts))


def fs_path(mount: Mount, cgroup: str) -> str | None:
    """Host-absolute path of `cgroup` through `mount`, or None when the mount does not show it
    (a bind mount of another subtree). Both are relative to our cgroup namespace's root."""
    base = mount.root.rstrip("/")
    if base and cgroup != base and not cgroup.startswith(base + "/"):
        return None
    rel = cgroup[len(base):].strip("/")
    return os.path.join(mount.mountpoint, rel) if rel else mount.mountpoint


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


@dataclasses.dataclass(frozen=True)
class RootState:
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


@dataclasses.dataclass(frozen=True)
class CgroupOps:
    """The filesystem calls the proof makes. The kernel populates a new cgroup with its interface
    files and lets rmdir remove it while they exist; a unit test emulates that on a plain fs."""

    mkdir: Callable[[Path], None] = os.mkdir
    rmdir: Callable[[Path], None] = os.rmdir


def _write(path: Path, value: str) -> None:
    # No O_CREAT: on cgroupfs every interface file already exists; a missing one means the
    # controller is not enabled here, and creating a plain file would prove nothing.
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _ename(e: OSError) -> str:
    return errno.errorcode.get(e.errno or 0, str(e.errno))


def prove(root: Path, subtree_control: Sequence[str], ops: CgroupOps = CgroupOps()) -> tuple[bool, str, dict]:
    """Create a throwaway child under `root`, write memory.max, read it back, remove it.

    Returns (ok, what failed or what was proved, evidence). The child is removed and any
    subtree_control change undone in `finally`, whatever happened. Every OSError here is an answer
    about the host (EBUSY: cgroup v2's no-internal-process rule; EACCES: not ours), so it is reported
    by errno name rather than raised."""
    ev: dict[str, str] = {}
    child = root / f"sbxc-proof-{os.getpid()}-{os.urandom(4).hex()}"
    enabled_here = made = False
    try:
        if "memory" not in subtree_control:
            # Children get memory.* only when the parent enables it for them. A root that holds
            # processes cannot (EBUSY): the no-internal-process rule (cgroup-v2.rst).
            try:
                _write(root / "cgroup.subtree_control", "+memory")
                enabled_here = True
            except OSError as e:
                return False, f"cannot enable memory for children of {root}: {_ename(e)}", ev
        try:
            ops.mkdir(child)
            made = True
        except OSError as e:
            return False, f"cannot create a child cgroup under {root}: {_ename(e)}", ev
        try:
            _write(child / "memory.max", f"{PROOF_LIMIT}\n")
            back = (child / "memory.max").read_text().strip()
        except OSError as e:
            return False, f"cannot write {child.name}/memory.max: {_ename(e)}", ev
        ev["proof.memory.max"] = back
        if back != str(PROOF_LIMIT):
            return False, f"{child.name}/memory.max read back {back!r}, wrote {PROOF_LIMIT}", ev
        return True, f"created {child.name}, set memory.max={PROOF_LIMIT}, read it back", ev
    finally:
        if made:
            try:
                ops.rmdir(child)
                ev["proof.cleanup"] = "removed"
            except OSError as e:
                ev["proof.cleanup"] = f"FAILED to remove {child}: {_ename(e)}"
        if enabled_here:
            try:
                _write(root / "cgroup.subtree_control", "-memory")
            except OSError as e:
                ev["proof.subtree_control"] = f"FAILED to restore: {_ename(e)}"


def _initial_cgroupns(host: Host) -> bool:
    try:
        link = os.readlink(host.proc / "self/ns/cgroup")
    except (FileNotFoundError, PermissionError):
        return True  # cannot tell: assume the host's namespace, the cautious reading
    return link == f"cgroup:[{PROC_CGROUP_INIT_INO}]"


def observe_root(host: Host, path: str, *, promised: bool, layout: Layout, statfs: Statfs) -> RootState:
    real = host.path(path)
    exists, is_dir = real.exists(), real.is_dir()
    mount = layout.v2_mount
    # Compare directories, not strings: a symlink or a second bind mount must not smuggle the
    # hierarchy root past this check.
    hierarchy_root = False
    if mount is not None and mount.root == "/" and exists:
        try:
            a, b = os.stat(real), os.stat(host.path(mount.mountpoint))
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
        initial_cgroupns=_initial_cgroupns(host),
        writable=writable, delegate_xattr=xattr,
        controllers=tuple(_words(_read(real / "cgroup.controllers"))),
        subtree_control=tuple(_words(_read(real / "cgroup.subtree_control"))),
    )


def probe(host: Host, *, statfs: Statfs = statfs_magic, ops: CgroupOps = CgroupOps()) -> list[Finding]:
    mounts = parse_mountinfo(_read(host.proc / "self/mountinfo") or "")
    points = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} | {m.mountpoint for m in mounts
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
             "v2_mount": layout.v2_mount.mountpoint if layout.v2_mount else None}
    if layout.v2_mount is None:
        cg = Finding("cgroup", Verdict.unsupported,
                     f"no cgroup2 hierarchy mounted (layout {layout.name}); "
                     f"v1 holds: {' '.join(v1_bound) or 'nothing'}", ev, facts)
    else:
        held = f"; v1 holds {' '.join(v1_bound)}" if layout.name == "hybrid" and v1_bound else ""
        cg = Finding("cgroup", Verdict.supported,
                     f"{layout.name} layout: cgroup2 at {layout.v2_mount.mountpoint}, own cgroup {own}, "
                     f"root {root or '(not visible)'}, controllers {' '.join(available) or 'none'}{held}",
                     ev, facts)
    return [cg, delegation(host, layout, root, v1_bound, statfs=statfs, ops=ops, base_evidence=ev)]


def delegation(host: Host, layout: Layout, resolved: str | None, v1_bound: Sequence[str], *,
               statfs: Statfs, ops: CgroupOps, base_evidence: Mapping[str, str]) -> Finding:
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
    ok, what, proof_ev = prove(host.path(candidate), state.subtree_control, ops)
    ev.update(proof_ev)
    if not ok:
        lead = f"{PROMISE_ENV}={candidate}" if promised else candidate
        return Finding("cgroup.delegation", failed, f"{lead}: proof failed: {what}", ev, facts)
    facts["root"] = candidate
    return Finding("cgroup.delegation", Verdict.supported, f"delegated root {candidate}: {what}", ev, facts)
