"""proc(5) mountinfo, parsed whole, and the question a mount table answers: which mount serves a path,
and where a filesystem's subtree is visible. Pure functions of the text: the caller reads
/proc/self/mountinfo (the host) or /proc/PID/mountinfo (a live task, read FROM the host, so the
kernel's table and not whatever the sandbox shows the task)."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence
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
    mount and everything beneath it are hidden."""
    by_id = {m.mount_id: m for m in mounts}
    covered = {
        m.parent_id
        for m in mounts
        if m.parent_id in by_id and by_id[m.parent_id].mount_point == m.mount_point
    }
    shown: list[Mount] = []
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
            continue
        directory = posixpath.dirname(m.mount_point.rstrip("/")) or "/"
        if _longest(shown, directory) is holder:
            shown.append(m)
    order = {m.mount_id: i for i, m in enumerate(mounts)}
    return sorted(shown, key=lambda m: order[m.mount_id])


def _longest(mounts: Sequence[Mount], path: str) -> Mount | None:
    best: Mount | None = None
    for m in mounts:
        if under(path, m.mount_point) and (best is None or len(m.mount_point) >= len(best.mount_point)):
            best = m
    return best


def serving(mounts: Sequence[Mount], path: str) -> Mount | None:
    """The mount that serves `path` (no symlinks in it): the visible mount with the longest mount
    point at or above it."""
    return _longest(on_top(mounts), path)


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
