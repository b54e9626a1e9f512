"""proc(5) mountinfo, parsed whole, and the question a mount table answers: which mount serves a path,
and where a filesystem's subtree is visible. Pure functions of the text: the caller reads
/proc/self/mountinfo (the host) or /proc/PID/mountinfo (a live task, read FROM the host, so the
kernel's table and not whatever the sandbox shows the task). One function reads: root_mount_id(),
which mount a live task's root directory is (a table cannot say, see reachable())."""

from __future__ import annotations

import errno
import os
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

# Filesystems that hold no host data a write could land in: each is an instance of kernel state, not
# storage (a procfs write is a sysctl, governed by capabilities, not by the mount).
PSEUDO_FSTYPES = frozenset(
    {
        "proc",
        "sysfs",
        "devpts",
        "mqueue",
        "cgroup",
        "cgroup2",
        "nsfs",
        "bpf",
        "tracefs",
        "debugfs",
        "securityfs",
        "pstore",
        "fusectl",
        "configfs",
        "binfmt_misc",
        "autofs",
        "efivarfs",
        "selinuxfs",
    }
)


def unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo (fs/proc_namespace.c, mangle()).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


class Mount(NamedTuple):
    """One line of mountinfo: a mount, the subtree of its filesystem it shows and where, with the mount's
    and the superblock's options."""

    mount_id: int
    parent_id: int
    dev: str  # "major:minor", st_dev of the filesystem
    root: str  # the subtree of the filesystem this mount shows
    mount_point: str  # relative to the reading process's root
    options: tuple[str, ...]  # per-mount options (ro/rw, nosuid, ...)
    fstype: str
    source: str
    super_options: tuple[str, ...]

    @property
    def read_only(self) -> bool:
        # Either the mount or its superblock being ro refuses a write (EROFS from mnt_want_write /
        # sb_rdonly, fs/namespace.c).
        return "ro" in self.options or "ro" in self.super_options

    @property
    def storage(self) -> bool:
        return self.fstype not in PSEUDO_FSTYPES

    def to_json(self) -> dict[str, object]:
        return {
            "mount_id": self.mount_id,
            "parent_id": self.parent_id,
            "dev": self.dev,
            "root": self.root,
            "mount_point": self.mount_point,
            "fstype": self.fstype,
            "source": self.source,
            "ro": self.read_only,
        }


def parse(text: str) -> list[Mount]:
    """`id parent maj:min root mountpoint opts [optional...] - fstype source super`, in table order."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        a, b = left.split(), right.split()
        if len(a) < 6 or len(b) < 2:
            continue
        mounts.append(
            Mount(
                mount_id=int(a[0]),
                parent_id=int(a[1]),
                dev=a[2],
                root=unescape(a[3]),
                mount_point=unescape(a[4]),
                options=tuple(a[5].split(",")),
                fstype=b[0],
                source=unescape(b[1]),
                super_options=tuple(b[2].split(",")) if len(b) > 2 else (),
            )
        )
    return mounts


def under(path: str, top: str) -> bool:
    """`path` is `top` or lies beneath it (component-wise: /a/bc is not under /a/b)."""
    return path == top or top == "/" or path.startswith(top.rstrip("/") + "/")


def _rel(path: str, top: str) -> str:
    return "" if path == top else path[len(top.rstrip("/")) + 1 :] if top != "/" else path.lstrip("/")


def _join(top: str, rel: str) -> str:
    return posixpath.join(top, rel) if rel else top


def on_top(mounts: Sequence[Mount]) -> list[Mount]:
    """The mounts a path lookup can reach, resolved the way the kernel walks a path. Of a stack at one
    mount point only the last one mounted shows (it is the child of the one beneath it). A mount is
    reachable only through the mount that holds its mount point's directory: when something else
    now serves that directory (a tmpfs mounted over an ancestor, a stack on top of the holder), the
    mount and everything beneath it are hidden.

    Linear in the table (times the depth of a path), and the last few tables' answers are kept: every
    read-only path's witness asks about the same task's table, and with the longest-prefix search
    over the mounts shown so far made for each mount, a profile of 2,000 read-only paths (2,000 binds)
    took minutes (issue 28: O(paths x mounts^2))."""
    return list(_visible(mounts)[0])


def _visible(mounts: Sequence[Mount]) -> tuple[list[Mount], dict[str, Mount]]:
    """on_top's mounts, and the one that shows at each mount point; kept for the last few tables,
    known by identity (a task's table is one tuple, read again by every witness; a list may change)."""
    kept = isinstance(mounts, tuple)
    for key, value in _VISIBLE if kept else ():
        if key is mounts:
            return value
    by_id = {m.mount_id: m for m in mounts}
    covered = {
        m.parent_id
        for m in mounts
        if m.parent_id in by_id and by_id[m.parent_id].mount_point == m.mount_point
    }
    shown: list[Mount] = []
    at: dict[str, Mount] = {}  # mount point -> the last mount shown there (_longest's tie-break)
    # Shorter mount points first: whether a mount shows depends only on mounts above its path.
    for m in sorted(mounts, key=lambda m: len(m.mount_point.rstrip("/"))):
        if m.mount_id in covered:
            continue
        bottom, hops = m, 0
        while (
            (p := by_id.get(bottom.parent_id)) is not None
            and p is not bottom
            and p.mount_point == m.mount_point
            and hops < 256
        ):
            bottom, hops = p, hops + 1
        holder = by_id.get(bottom.parent_id)
        if holder is None or holder is bottom:
            shown.append(m)  # the root of this table (its parent lies outside it)
            at[m.mount_point] = m
            continue
        directory = posixpath.dirname(m.mount_point.rstrip("/")) or "/"
        if _longest_at(at, directory) is holder:
            shown.append(m)
            at[m.mount_point] = m
    order = {m.mount_id: i for i, m in enumerate(mounts)}
    value = (sorted(shown, key=lambda m: order[m.mount_id]), at)
    if kept:
        _VISIBLE.insert(0, (mounts, value))
        del _VISIBLE[4:]
    return value


_VISIBLE: list[tuple[Sequence[Mount], tuple[list[Mount], dict[str, Mount]]]] = []


def _longest_at(at: Mapping[str, Mount], path: str) -> Mount | None:
    """_longest over the mounts indexed by mount point: the path, then each of its ancestors."""
    path = path.rstrip("/") or "/"
    while True:
        m = at.get(path)
        if m is not None:
            return m
        if path in ("/", ""):
            return at.get("/")
        path = posixpath.dirname(path.rstrip("/")) or "/"


def _longest(mounts: Sequence[Mount], path: str) -> Mount | None:
    best: Mount | None = None
    for m in mounts:
        if under(path, m.mount_point) and (best is None or len(m.mount_point) >= len(best.mount_point)):
            best = m
    return best


def serving(mounts: Sequence[Mount], path: str) -> Mount | None:
    """The mount that serves `path` (no symlinks in it): the visible mount with the longest mount
    point at or above it."""
    return _longest_at(_visible(mounts)[1], path)


class Location(NamedTuple):
    """A path as the filesystem knows it: which filesystem, and where in it."""

    dev: str
    fs_path: str


def locate(mounts: Sequence[Mount], path: str) -> Location | None:
    m = serving(mounts, path)
    if m is None:
        return None
    return Location(m.dev, _join(m.root, _rel(path, m.mount_point)))


class Exposure(NamedTuple):
    """`what` (a Location) is reachable at `path` through `mount`."""

    path: str
    mount: Mount


def exposures(mounts: Sequence[Mount], what: Location) -> list[Exposure]:
    """Every path at which the filesystem subtree `what` (or a part of it) is visible in `mounts`,
    under any name: a mount of the same filesystem whose root is at or above `what` shows all of it at
    mount_point + the rest; one whose root is beneath `what` shows that part. Visible only where that
    mount is the one serving the path (a mask on top hides it)."""
    out = []
    for m in on_top(mounts):
        if m.dev != what.dev:
            continue
        if under(what.fs_path, m.root):
            path = _join(m.mount_point, _rel(what.fs_path, m.root))
        elif under(m.root, what.fs_path):
            path = m.mount_point
        else:
            continue
        if serving(mounts, path) == m:
            out.append(Exposure(path, m))
    return out


def devices(mounts: Iterable[Mount]) -> frozenset[str]:
    return frozenset(m.dev for m in mounts)


# ---- the task's own tree: from the mount its root directory is -----------------------------------------

# How the task names a mount stacked on top of its root directory: through `..`. A path that starts
# at "/" begins at the task's root mount and never crosses a mount stacked on that directory
# (path_init() sets the walk at fs->root, fs/namei.c). But `..` that arrives at the root directory
# (`/..`, `/usr/..`) ends in step_into(), whose handle_mounts() crosses every mount on that dentry
# (follow_dotdot()'s in_root case returns the root dentry itself, fs/namei.c): the stack on the root
# serves every path written through it. Seen on Linux 6.18 with firejail 0.9.72 as root (its
# `--read-only=/` bind stacked over the root, its remount hitting the root mount beneath): `echo >
# /x` gave EROFS, `echo > /../x` wrote /x on the host.
OVER_ROOT = "/.."


def root_mount_id(pid: int | str, proc: Path | str = "/proc") -> int:
    """The id of the mount that is process `pid`'s root directory (its fs->root), as mountinfo numbers
    mounts. Opening /proc/PID/root jumps to that path itself (proc_root_link(), fs/proc/base.c; a
    trailing magic link is a LAST_BIND jump after which no mount is crossed, fs/namei.c), so a mount
    stacked on the root is not followed; the O_PATH descriptor's fdinfo names its mount (`mnt_id`,
    proc(5), Linux 3.15). Needs ptrace read access to the process, as /proc/PID/root does."""
    fd = os.open(f"{proc}/{pid}/root", os.O_PATH | os.O_CLOEXEC)
    try:
        with open(f"{proc}/self/fdinfo/{fd}") as f:
            text = f.read()
    finally:
        os.close(fd)
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "mnt_id":
            return int(value)
    raise OSError(errno.ENOTSUP, f"no mnt_id in {proc}/self/fdinfo (a kernel before 3.15)")


def reachable(mounts: Sequence[Mount], root_id: int) -> tuple[Mount, ...]:
    """The mounts a task whose root directory is mount `root_id` can reach by a path, each once, in
    table order, as the task names them. A path walk goes down from the root mount: at a mount point
    it crosses to the LAST mount of the stack there (each one mounted on the one beneath, so its
    child), and a mount whose mount point lies in a directory another mount covers is hidden, with
    everything beneath it. What is stacked on the root directory itself is not what "/" names: it
    is reached through `..` only (OVER_ROOT), so it and its mounts come back with their mount point
    written that way ("/..", "/../usr"), which no path the profile names lies under.

    Unlike on_top(), which must guess the root (the last mount stacked at "/"), this starts from the
    root the kernel holds for the task (root_mount_id()). A root that is not in the table (a task
    chrooted into a directory of it: mountinfo lists only mounts at or under the task's root,
    show_mountinfo() in fs/proc_namespace.c) is walked all the same, from its children."""
    order = {m.mount_id: i for i, m in enumerate(mounts)}
    kids: dict[int, list[Mount]] = {}
    for m in mounts:
        if m.parent_id != m.mount_id:
            kids.setdefault(m.parent_id, []).append(m)
    root = next((m for m in mounts if m.mount_id == root_id), None)
    root_point = root.mount_point if root is not None else "/"
    out: dict[int, Mount] = {}

    def top(m: Mount) -> Mount:
        for _ in range(256):  # a stack is a chain of children at one mount point
            above = [c for c in kids.get(m.mount_id, ()) if c.mount_point == m.mount_point]
            if not above:
                break
            m = above[-1]
        return m

    def walk(m: Mount, over_root: bool, depth: int = 0) -> None:
        if m.mount_id in out or depth > 256:
            return
        out[m.mount_id] = _over_root(m) if over_root else m
        children = [c for c in kids.get(m.mount_id, ()) if c.mount_point != m.mount_point]
        for c in children:
            shadowed = any(
                o is not c
                and (
                    (o.mount_point != c.mount_point and under(c.mount_point, o.mount_point))
                    or (o.mount_point == c.mount_point and order[o.mount_id] > order[c.mount_id])
                )
                for o in children
            )
            if not shadowed:
                walk(top(c), over_root, depth + 1)

    if root is not None:
        walk(root, False)
    else:
        for c in kids.get(root_id, ()):
            if c.mount_point != root_point:
                walk(top(c), False)
    stacked = [c for c in kids.get(root_id, ()) if c.mount_point == root_point]
    if stacked:
        walk(top(stacked[-1]), True)
    return tuple(sorted(out.values(), key=lambda m: order[m.mount_id]))


def _over_root(m: Mount) -> Mount:
    return m._replace(mount_point=OVER_ROOT + (m.mount_point if m.mount_point != "/" else ""))


def for_task(mounts: Sequence[Mount], pid: int | str, proc: Path | str = "/proc") -> tuple[Mount, ...]:
    """reachable() from the live task's own root mount; OSError when that cannot be read."""
    return reachable(mounts, root_mount_id(pid, proc))


def over_root(m: Mount) -> bool:
    """`m` is reached only through `..` (reachable()): no host-side path through /proc/PID/root names
    it, since that `..` is walked from the harness's root, not the task's."""
    return m.mount_point == OVER_ROOT or m.mount_point.startswith(OVER_ROOT + "/")
