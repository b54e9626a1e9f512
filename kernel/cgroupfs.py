"""The cgroup v2 filesystem, once for every layer: which filesystem a path is on, where cgroup2 is
mounted, which cgroup we are in, the file operations on it (one seam a unit test replaces with a fake
tree), and the proof that a subtree is ours to limit: a throwaway child whose memory.max takes a write
and reads it back.

Used by the probe (probes/cgroup.py), the per-task leaf (conformance/cgroup_leaf.py) and the
container/VM set-up step (runners/cgroup_setup.py). Stdlib only, importing only probes/ modules that
are too: tests/vm_selfcheck.py loads the leaf code under `python3 -I -S` in the VM guest."""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from sandbox_conformance.kernel import mountinfo
from sandbox_conformance.kernel.errnos import errname

# include/uapi/linux/magic.h
CGROUP2_SUPER_MAGIC = 0x63677270
CGROUP_SUPER_MAGIC = 0x27E0EB
# include/linux/proc_ns.h: the initial cgroup namespace's inode number, the same on every boot.
PROC_CGROUP_INIT_INO = 0xEFFFFFFB

# A subtree someone promises is ours to limit: checked by the cgroup.delegation probe, made by the
# container/VM set-up step, used for every task's leaf.
PROMISE_ENV = "SANDBOX_CONFORMANCE_CGROUP_ROOT"
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


# ---- mounts ---------------------------------------------------------------------------------------


def mount_at(mounts: Sequence[mountinfo.Mount], point: str) -> mountinfo.Mount | None:
    """The topmost mount at exactly `point` (probes/mountinfo.parse's table): a mount stacked on
    another at the same point comes later in mountinfo, and only it serves the path."""
    found = None
    for m in mounts:
        if m.mount_point == point:
            found = m
    return found


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


# ---- our own cgroup -------------------------------------------------------------------------------


def own_cgroup(proc_self_cgroup: str) -> str | None:
    """Our cgroup on the unified hierarchy: the `0::` line (cgroups(7)); None when there is none."""
    for line in proc_self_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            return path.removesuffix(" (deleted)")
    return None


def initial_cgroupns(proc: Path) -> bool:
    """True when we are, or may be, in the kernel's initial cgroup namespace, where the hierarchy's
    root is the whole machine's. "May be" when /proc cannot tell (no cgroup namespaces before Linux
    4.6, or an unreadable link): the cautious reading."""
    try:
        link = os.readlink(proc / "self" / "ns" / "cgroup")
    except (FileNotFoundError, PermissionError):
        return True
    return link == f"cgroup:[{PROC_CGROUP_INIT_INO}]"


# ---- the filesystem seam --------------------------------------------------------------------------


class CgroupFs:
    """The file operations cgroup code makes; tests substitute a fake cgroup tree in tmp_path that
    emulates what the kernel does and a plain filesystem does not (mkdir populates interface files,
    rmdir removes a cgroup despite them, cgroup.kill empties it).

    Opening for writing never creates: on cgroupfs every interface file already exists, and a missing
    one means the controller is not enabled here. Creating a plain file would hide exactly that, and
    on a fake tree would make a proof pass that proved nothing."""

    def mkdir(self, path: Path) -> None:
        os.mkdir(path)

    def rmdir(self, path: Path) -> None:
        os.rmdir(path)

    def write(self, path: Path, text: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def read(self, path: Path) -> str:
        return path.read_text()

    def exists(self, path: Path) -> bool:
        return path.exists()

    def kill(self, pid: int, sig: int) -> None:
        os.kill(pid, sig)


# ---- the memory.max proof -------------------------------------------------------------------------


class Proof(NamedTuple):
    """What `prove` found: whether a throwaway child under the root took a memory.max write and read it
    back, with the evidence."""

    ok: bool
    what: str  # what failed, or what was proved: one line
    evidence: Mapping[str, str]
    # What the proof could not undo (its child, its subtree_control change), or None. A caller that
    # goes on to use the root must not ignore it.
    leftover: str | None = None


def prove(root: Path, subtree_control: Sequence[str], fs: CgroupFs | None = None) -> Proof:
    """Create a throwaway child under `root`, write memory.max, read it back, remove it.

    The child is removed and any subtree_control change undone in `finally`, whatever happened. Every
    OSError here is an answer about the host (EBUSY: cgroup v2's no-internal-process rule; EACCES: not
    ours), so it is reported by errno name rather than raised."""
    fs = fs or CgroupFs()
    ev: dict[str, str] = {}
    child = root / f"sbxc-proof-{os.getpid()}-{os.urandom(4).hex()}"
    done: set[str] = set()
    try:
        ok, what = _limit_a_child(root, child, subtree_control, fs, ev, done)
    finally:
        left = []
        if "mkdir" in done:
            try:
                fs.rmdir(child)
                ev["proof.cleanup"] = "removed"
            except OSError as e:
                ev["proof.cleanup"] = f"FAILED to remove {child}: {errname(e)}"
                left.append(ev["proof.cleanup"])
        if "enable" in done:
            try:
                fs.write(root / "cgroup.subtree_control", "-memory")
            except OSError as e:
                ev["proof.subtree_control"] = f"FAILED to restore: {errname(e)}"
                left.append(f"{root / 'cgroup.subtree_control'}: {ev['proof.subtree_control']}")
    return Proof(ok, what, ev, "; ".join(left) or None)


def _limit_a_child(
    root: Path, child: Path, subtree_control: Sequence[str], fs: CgroupFs, ev: dict[str, str], done: set[str]
) -> tuple[bool, str]:
    if "memory" not in subtree_control:
        # Children get memory.* only when the parent enables it for them. A root that holds
        # processes cannot (EBUSY): the no-internal-process rule (cgroup-v2.rst).
        try:
            fs.write(root / "cgroup.subtree_control", "+memory")
        except OSError as e:
            return False, f"cannot enable memory for children of {root}: {errname(e)}"
        done.add("enable")
    try:
        fs.mkdir(child)
    except OSError as e:
        return False, f"cannot create a child cgroup under {root}: {errname(e)}"
    done.add("mkdir")
    try:
        fs.write(child / "memory.max", f"{PROOF_LIMIT}\n")
        back = fs.read(child / "memory.max").strip()
    except OSError as e:
        return False, f"cannot write {child.name}/memory.max: {errname(e)}"
    ev["proof.memory.max"] = back
    if back != str(PROOF_LIMIT):
        return False, f"{child.name}/memory.max read back {back!r}, wrote {PROOF_LIMIT}"
    return True, f"created {child.name}, set memory.max={PROOF_LIMIT}, read it back"
