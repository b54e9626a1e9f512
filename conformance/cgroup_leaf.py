"""A per-task cgroup v2 leaf: made with the profile's limits, entered before the task executes, emptied
and removed afterwards whatever happened.

    with task_leaf(root, "task-1234", LeafLimits(memory_max=32 << 20, pids_max=64)) as leaf:
        run([*leaf.enter_argv(), *bwrap_argv], timeout=...)
        oom_kills = leaf.oom_kills()          # memory.events, read on the host side

Entering: the task's argv is prefixed with a /bin/sh shim that writes its own pid into the leaf's
cgroup.procs and then `exec`s the real argv, so the very first instruction of the task (bwrap, or
setpriv then bwrap) already runs in the leaf, and so does everything it forks. Chosen over
clone3(CLONE_INTO_CGROUP) because Python's subprocess cannot issue clone3, and a raw clone through
ctypes in a threaded process (probes run concurrently) is unsafe; chosen over preexec_fn for the same
reason (subprocess documents preexec_fn as unsafe with threads). /bin/sh rather than `python3 -I -S`:
both are always there, but dash starts in about a millisecond where python takes tens (hundreds
under the VM mode's TCG emulation), once per task. The shim runs as whoever launches the task, before
any privilege drop, so the write needs no delegation to the task's user.

Emptying: `cgroup.kill` (Linux >= 5.14, Documentation/admin-guide/cgroup-v2.rst) SIGKILLs every
process in the subtree atomically with respect to fork. Older kernels lack the file: freeze the leaf
(cgroup.freeze, >= 5.2, so nothing forks while we look) and SIGKILL each pid listed in cgroup.procs
until the list stays empty, with a deadline.

Every write goes through `_write_inside`, which refuses a path outside the leaf: this module can never
touch the rest of the tree it was given, let alone the host's. The file operations themselves are
probes/cgroupfs.CgroupFs, the seam the unit tests replace with a fake tree.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import re
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from sandbox_conformance.kernel.cgroupfs import CgroupFs
from sandbox_conformance.kernel.errnos import errname
from sandbox_conformance.processes import cancel, kills, owner

# The exit status the shim uses when it could not enter the leaf (what env(1) and timeout(1) use
# for "the wrapper itself failed"): the task never ran.
ENTER_FAILED = 125

# $1: the leaf's cgroup.procs; the rest: the task's argv. `exec` keeps the pid, so the pid written is
# the task's own. Writing fails loudly: an unconfined task is worse than no task.
_SHIM = (
    f'echo "$$" > "$1" || {{ echo "sbxc: cannot enter cgroup $1" >&2; exit {ENTER_FAILED}; }}; '
    'shift; exec "$@"'
)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class CgroupUnusable(Exception):
    """A leaf could not be made, limited, emptied or removed: one line naming the file and errno."""


class KillMethod(enum.StrEnum):
    cgroup_kill = "cgroup.kill"
    signal_loop = "sigkill-loop"  # kernel < 5.14: freeze + SIGKILL each pid in cgroup.procs


class LeafLimits(NamedTuple):
    """The limits to write into a leaf's interface files (`files`; `Leaf.apply` writes them). None writes
    nothing there: the new cgroup's default, "max", stays."""

    memory_max: int | None = None  # bytes; None leaves "max"
    pids_max: int | None = None
    # 0 so an allocation past memory.max is OOM-killed instead of pushed to swap (the VM has none, a
    # host may). Skipped when the kernel has no swap accounting (no memory.swap.max file).
    swap_max: int | None = 0

    def files(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.memory_max is not None:
            out["memory.max"] = str(self.memory_max)
        if self.swap_max is not None:
            out["memory.swap.max"] = str(self.swap_max)
        if self.pids_max is not None:
            out["pids.max"] = str(self.pids_max)
        return out


def parse_keyed(text: str) -> dict[str, int]:
    """A flat-keyed cgroup file (memory.events, pids.events, cgroup.events): "key value" lines."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


# The real cgroup filesystem's operations: CgroupFs holds no state, so one instance serves every leaf.
REAL_FS = CgroupFs()


class Leaf(NamedTuple):
    """One task's cgroup v2 leaf under a root we may write to: how a task enters it, what it counted, and how
    it is emptied and removed (see the module doc). Made by `make_leaf`, usually through `task_leaf`."""

    root: Path
    path: Path
    # The seam a unit test replaces with a fake tree. A field, so it takes part in == and repr: two
    # leaves on the real tree share REAL_FS and compare by their paths, as before; a leaf on a fake
    # tree is another leaf than one at the same path on the real tree.
    fs: CgroupFs = REAL_FS

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def enter_argv(self, shell: str = "/bin/sh") -> tuple[str, ...]:
        """The prefix that puts the task into this leaf before it executes (see the module doc)."""
        return (shell, "-c", _SHIM, "sbxc-enter", str(self.procs_file))

    @property
    def cgroup_path(self) -> str:
        """The leaf as a task inside reads it in /proc/self/cgroup ("0::<this>"): relative to the
        cgroup2 mount's root, which is also the cgroup namespace root where a container has one."""
        mount = self.path
        while mount.parent != mount and self.fs.exists(mount.parent / "cgroup.procs"):
            mount = mount.parent
        return "/" + str(self.path.relative_to(mount))

    def procs(self) -> list[int]:
        try:
            text = self.fs.read(self.procs_file)
        except FileNotFoundError:
            return []
        return [int(x) for x in text.split()]

    def _read_keyed(self, name: str) -> dict[str, int]:
        try:
            return parse_keyed(self.fs.read(self.path / name))
        except FileNotFoundError:
            return {}

    def memory_events(self) -> dict[str, int]:
        return self._read_keyed("memory.events")

    def pids_events(self) -> dict[str, int]:
        return self._read_keyed("pids.events")

    def oom_kills(self) -> int:
        """memory.events oom_kill: tasks in this leaf (and below) killed by the OOM killer."""
        return self.memory_events().get("oom_kill", 0)

    def _write_inside(self, name: str, text: str) -> None:
        target = self.path / name
        if target.parent != self.path or "/" in name:
            raise CgroupUnusable(f"refusing to write {target}: outside the leaf {self.path}")
        try:
            self.fs.write(target, text)
        except OSError as e:
            raise CgroupUnusable(f"write {text.strip()!r} to {target}: {errname(e)}") from e

    def apply(self, limits: LeafLimits) -> dict[str, str]:
        """Write the limits; returns what was written. A missing memory.max/pids.max means the
        controller is not enabled for this subtree: an error, never a silent pass."""
        written: dict[str, str] = {}
        for name, value in limits.files().items():
            if name == "memory.swap.max" and not self.fs.exists(self.path / name):
                continue  # no swap accounting in this kernel (CONFIG_MEMCG_SWAP off, or swapaccount=0)
            if not self.fs.exists(self.path / name):
                controller = name.split(".")[0]
                raise CgroupUnusable(
                    f"{self.path / name} missing: the {controller} controller is not enabled "
                    f"in {self.root / 'cgroup.subtree_control'}"
                )
            self._write_inside(name, value)
            written[name] = value
        return written

    def kill(self, *, timeout: float = 5.0) -> KillMethod:
        """SIGKILL everything in the leaf and wait until it is empty (or raise CgroupUnusable)."""
        method = KillMethod.cgroup_kill
        if self.fs.exists(self.path / "cgroup.kill"):
            kills.record(0, signal.SIGKILL, f"cgroup.kill of the leaf {self.path}")
            self._write_inside("cgroup.kill", "1")
        else:
            method = KillMethod.signal_loop
            if self.fs.exists(self.path / "cgroup.freeze"):
                self._write_inside("cgroup.freeze", "1")
        deadline = time.monotonic() + timeout
        while True:
            pids = self.procs()
            if not pids:
                return method
            if time.monotonic() > deadline:
                raise CgroupUnusable(
                    f"{self.path}: still holds pids {pids[:8]} after {timeout:.0f} s of {method}"
                )
            if method is KillMethod.signal_loop:
                for pid in pids:
                    kills.record(pid, signal.SIGKILL, f"emptying the leaf {self.path}")
                    with contextlib.suppress(ProcessLookupError):
                        self.fs.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def remove(self, *, timeout: float = 5.0) -> None:
        """rmdir, retried on EBUSY: exiting tasks leave the cgroup asynchronously after SIGKILL, so a
        leaf that cgroup.procs already shows empty can still be busy for a moment."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.fs.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise CgroupUnusable(f"rmdir {self.path}: {errname(e)}") from e
            time.sleep(0.02)


def leaf_path(root: Path, name: str) -> Path:
    """root/name, refusing any name that could leave root (a slash, "..", a dot file) or clash with a
    cgroup interface file (those all contain a dot after a controller name, e.g. "memory.max")."""
    if not _NAME.fullmatch(name) or name.startswith(("cgroup.", "memory.", "pids.", "cpu.", "io.")):
        raise CgroupUnusable(
            f"bad leaf name {name!r}: letters, digits, '_', '.', '-' only, and no interface-file names"
        )
    return root / name


def make_leaf(root: Path, name: str, limits: LeafLimits, *, fs: CgroupFs | None = None) -> Leaf:
    fs = fs or REAL_FS
    path = leaf_path(root, name)
    try:
        fs.mkdir(path)
    except FileExistsError:
        raise CgroupUnusable(f"{path} already exists: a leaf is per task, never reused") from None
    except OSError as e:
        raise CgroupUnusable(f"mkdir {path}: {errname(e)}") from e
    leaf = Leaf(root, path, fs)
    try:
        leaf.apply(limits)
    except CgroupUnusable:
        leaf.remove()
        raise
    return leaf


@contextlib.contextmanager
def task_leaf(
    root: Path, name: str, limits: LeafLimits, *, fs: CgroupFs | None = None, timeout: float = 5.0
) -> Iterator[Leaf]:
    """A leaf for one task; on the way out (normal or not, a cancelled run too) kill whatever is left
    and remove it. A real leaf is also registered with the guardian, which does the same if we are
    SIGKILLed, and the leaves a dead run left under this root are swept first (processes/owner.py)."""
    real = fs is None
    if real:
        _sweep_once(root)
    leaf = make_leaf(root, name, limits, fs=fs)
    key = cancel.empty_on_death(leaf.path) if real else None
    try:
        yield leaf
    finally:
        try:
            leaf.kill(timeout=timeout)
        finally:
            leaf.remove(timeout=timeout)
            if key is not None:
                cancel.done(key)


_swept: set[Path] = set()


def _sweep_once(root: Path) -> None:
    if root not in _swept:
        _swept.add(root)
        owner.say(owner.sweep_cgroup(root))


def unique_name(prefix: str = "task") -> str:
    """`<prefix>-<owner stamp>-<n>`: the stamp lets the next run sweep a leaf a SIGKILL left."""
    return f"{prefix}-{owner.stamp()}-{time.monotonic_ns() % 10**9}"


def summary(leaf: Leaf) -> Mapping[str, object]:
    """What the host-side witness reports about a leaf after its task ran."""
    return {
        "path": str(leaf.path),
        "memory_events": leaf.memory_events(),
        "pids_events": leaf.pids_events(),
        "oom_kill": leaf.oom_kills(),
    }
