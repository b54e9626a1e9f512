"""Who owns what a run leaves on the host, and the sweep that removes what a dead run left.

Every directory, cgroup leaf and container a run creates carries its owner's stamp in its name,
`o<pid>.<start>.<host>`, from the moment it exists (so a SIGKILL between creating it and labelling
it cannot leave an unlabelled one):
- `pid` and `start`, the process's start time (proc(5), /proc/PID/stat field 22, clock ticks since
  boot): a pid alone is reused, the pair names one process for the life of the kernel;
- `host`, 8 hex digits of a hash of the boot id and our pid namespace: a pid means something only in
  the boot and the namespace it was read in.

The sweep (`sweep`, `sweep_cgroup`) removes an item only when its stamp is from this boot and this
pid namespace and that process is gone. A live run's items are never touched, nor anything without a
stamp (not ours), nor a stamp from another boot or pid namespace: a VM guest sees its host's
/var/tmp through 9p, a sandbox sharing /tmp sees its host's; neither can tell whether that owner
lives. A previous boot's leftovers are the OS's to clean (systemd-tmpfiles: /tmp at boot, /var/tmp
by age). Stdlib only (the guardian and the VM's guest import nothing else)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from sandbox_conformance.kernel import mountinfo
from sandbox_conformance.kernel.errnos import errname
from sandbox_conformance.processes import kills

# The directories runs leave: every owner names its own `sbxc-KIND-` (or `sbxc-KIND.`) and puts its
# stamp right after it (`tempfile.mkdtemp(prefix=f"{PREFIX}{owner.stamp()}-")`); this floor knows only
# that shape, not the owners (tests/test_cancel.py holds every mkdtemp of ours to it).
OURS = "sbxc-"
_OWNED = re.compile(OURS + r"[a-z][a-z-]*?[-.]o\d+\.\d+\.[0-9a-f]{8}")


def owned(name: str) -> bool:
    """Whether a directory entry's name is one of ours: `sbxc-KIND-` or `sbxc-KIND.` with a stamp."""
    return _OWNED.match(name) is not None and find(name) is not None


# What an owner asks to be done before its directory is removed (a runtime's `delete --force` of the
# container whose state lives there): a JSON list of argvs in the directory itself, so a sweep in a
# process that never imported that owner still does it. Run only when the file is the sweeper's own.
BEFORE_REMOVAL = ".sbxc-before-removal"
BEFORE_REMOVAL_TIMEOUT = 20.0  # seconds for each recorded command
# A directory whose name the profile chooses (a layout named like a platform's, conformance/layout.py)
# carries no stamp: a symlink beside it does, made before it, `.sbxc-owned-<stamp>-NAME -> NAME`.
LABEL_PREFIX = ".sbxc-owned-"
VAR_TMP = "/var/tmp"  # where the VM's scratch lives: on the host's /, visible to the guest over 9p
KILL_TIMEOUT = 10.0

_STAMP = re.compile(r"o(\d+)\.(\d+)\.([0-9a-f]{8})")


class Stamp(NamedTuple):
    """An owner's stamp, `o<pid>.<start>.<host>` in a name (see the module doc): one process of one boot and
    pid namespace."""

    pid: int
    start: int  # clock ticks after boot
    host: str  # boot id + pid namespace, hashed

    def __str__(self) -> str:
        return f"o{self.pid}.{self.start}.{self.host}"


def start_time(pid: int | str, proc: Path = Path("/proc")) -> int | None:
    """/proc/PID/stat field 22, or None when there is no such process. A zombie is dead: it only
    waits to be reaped."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # proc(5): comm is in parentheses and may hold anything; the fields resume after the LAST ')'.
    rest = text[text.rindex(")") + 2:].split()
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[19])


def host_key(proc: Path = Path("/proc")) -> str:
    try:
        boot = (proc / "sys/kernel/random/boot_id").read_text().strip()
        pidns = os.readlink(proc / "self/ns/pid")
    except OSError:
        return "unknown"  # no stamp matches it: this process judges nobody gone, and is never judged
    import hashlib  # here, not at the top: OpenSSL's start-up is ~5 ms of every `probe`, which never stamps

    return hashlib.sha256(f"{boot} {pidns}".encode()).hexdigest()[:8]


_mine: dict[int, Stamp] = {}


def mine() -> Stamp:
    """This process's stamp (read once per process: a forked child has its own). Without a readable
    /proc it is one no name can carry (start -1, host "unknown"): nothing is ever swept then."""
    pid = os.getpid()
    if pid not in _mine:
        try:
            start = start_time(pid)
        except OSError:
            start = None
        _mine[pid] = Stamp(pid, -1, "unknown") if start is None else Stamp(pid, start, host_key())
    return _mine[pid]


def stamp() -> str:
    return str(mine())


def find(name: str) -> Stamp | None:
    m = _STAMP.search(name)
    return Stamp(int(m[1]), int(m[2]), m[3]) if m else None


def gone(owner: Stamp, proc: Path = Path("/proc")) -> bool:
    """True only when `owner` is from this boot and pid namespace and no longer runs."""
    me = mine()
    if owner.host != me.host or me.start < 0:
        return False
    return start_time(owner.pid, proc) != owner.start


class Swept(NamedTuple):
    """One stamped item the sweep found whose run is gone: removed, or left with why; `line` says which."""

    path: str
    owner: Stamp
    problem: str = ""  # empty: removed; else why it is still there

    def line(self) -> str:
        if self.problem:
            return f"left {self.path} (its run, pid {self.owner.pid}, is gone): {self.problem}"
        return f"swept {self.path}: its run (pid {self.owner.pid}) is gone"


def say(swept: Iterable[Swept], prog: str = "sandbox-conformance") -> None:
    for s in swept:
        print(f"{prog}: {s.line()}", file=sys.stderr, flush=True)


def temp_dirs() -> list[str]:
    """Where tempfile may have put a run's directories (its candidates, tempfile._candidate_tempdir_list,
    without its write test: a read-only host is still swept, and never made to fail here), and
    /var/tmp."""
    env = [os.environ[k] for k in ("TMPDIR", "TEMP", "TMP") if os.environ.get(k)]
    return list(dict.fromkeys([*env, "/tmp", VAR_TMP]))


_swept_once = False


def sweep_once() -> None:
    """The sweep a run does before it creates its first stamped directory (layout, scratch): once
    per process, each removal said on stderr."""
    global _swept_once
    if not _swept_once:
        _swept_once = True
        say(sweep())


def make_named_dir(parent: str, prefix: str) -> str:
    """A fresh directory `parent/PREFIX<random>` (0700, as mkdtemp makes), labelled for the sweep by a
    stamped symlink beside it that exists before it does (see LABEL_PREFIX)."""
    import secrets

    for _ in range(100):
        name = f"{prefix}{secrets.token_hex(4)}"
        label = os.path.join(parent, f"{LABEL_PREFIX}{stamp()}-{name}")
        os.symlink(name, label)
        try:
            os.mkdir(os.path.join(parent, name), 0o700)
        except FileExistsError:
            os.unlink(label)
            continue
        except BaseException:
            os.unlink(label)
            raise
        return os.path.join(parent, name)
    raise FileExistsError(errno.EEXIST, f"no free name {prefix}* in {parent}")


def unlabel(path: str) -> None:
    """Remove the label of a directory `make_named_dir` made, once the directory is gone."""
    parent, name = os.path.split(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(parent, f"{LABEL_PREFIX}{stamp()}-{name}"))


_SHM_LABEL = re.compile(r"-shm-(\d+)\Z")


def label_shm(key: int, parent: str) -> str:
    """Label a System V shared memory segment (its key) for the sweep: an empty file
    `.sbxc-owned-<stamp>-shm-KEY` in `parent`. IPC objects outlive their creator (ipc_namespaces(7)),
    and a key carries no name of ours. Returns the label's path (removed by the owner with the segment)."""
    path = os.path.join(parent, f"{LABEL_PREFIX}{stamp()}-shm-{key}")
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return path


def remove_shm(key: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(ctypes.c_int(key), ctypes.c_size_t(0), ctypes.c_int(0))
    if shmid >= 0:
        libc.shmctl(ctypes.c_int(shmid), ctypes.c_int(0), None)  # IPC_RMID


def _labelled(top: str, label: str) -> str | None:
    # The directory a label names: a plain name beside it, never a path elsewhere.
    try:
        target = os.readlink(os.path.join(top, label))
    except OSError:
        return None
    return os.path.join(top, target) if target and "/" not in target and target not in (".", "..") else None


def sweep(*, dirs: Sequence[str] | None = None, include_self: bool = False) -> list[Swept]:
    """Remove every stamped directory whose owner is gone (and ours too with include_self: the end
    of a cancelled run, once its children are stopped)."""
    me = mine()
    out = []
    for top in dirs or temp_dirs():
        try:
            names = sorted(os.listdir(top))
        except OSError:
            continue
        for name in names:
            labelled = name.startswith(LABEL_PREFIX)
            if not labelled and not owned(name):
                continue
            owner = find(name)
            if owner is None or not (gone(owner) or (include_self and owner == me)):
                continue
            path = os.path.join(top, name)
            if labelled and (shm := _SHM_LABEL.search(name)):
                remove_shm(int(shm[1]))
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                out.append(Swept(f"shared memory key {shm[1]}", owner))
                continue
            if labelled:
                target = _labelled(top, name)
                if target is not None and os.path.isdir(target) and not os.path.islink(target):
                    if os.geteuid() != 0 and os.lstat(target).st_uid != os.geteuid():
                        continue
                    problem = remove_dir(target)
                    out.append(Swept(target, owner, problem))
                    if problem:
                        continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                continue
            try:
                if os.geteuid() != 0 and os.lstat(path).st_uid != os.geteuid():
                    continue  # another user's run: theirs to sweep (a sticky /tmp would refuse us)
            except FileNotFoundError:
                continue  # a concurrent sweep got there first
            out.append(Swept(path, owner, remove_dir(path)))
    return out


def remove_dir(path: str) -> str:
    """Remove what a dead run left at `path`: first whatever still runs from it (a process whose
    command line names it: qemu with its workdir, an OCI guardian), then what its owner asked for
    (BEFORE_REMOVAL), then the tree. Returns "" or why it is still there."""
    kill_naming(path)
    before_removal(path)
    mounts = mounts_under(path)
    if mounts:
        # rmtree would walk into a mount and delete what it shows: never. The Docker tier's sweep
        # unmounts its own data root first (tests/docker_tier.py).
        return f"still has mounts under it ({mounts[0]}, ...)"
    rmtree(path)
    if os.path.lexists(path):
        return "could not remove it"
    return ""


def ask_before_removal(path: str | Path, argvs: Sequence[Sequence[str]]) -> None:
    """Record, in the directory `path` just made, the commands to run before it is removed."""
    import json

    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(os.path.join(path, BEFORE_REMOVAL), flags, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump([list(a) for a in argvs], f)


def before_removal(path: str) -> None:
    """Run what the owner of `path` recorded (ask_before_removal), each with a timeout. Only a file
    that is ours (not a symlink, owned by this euid) in a directory that is ours: root's sweep never
    runs a command another user wrote."""
    import json
    import subprocess

    me = os.geteuid()
    try:
        fd = os.open(os.path.join(path, BEFORE_REMOVAL), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return
    with os.fdopen(fd) as f:
        try:
            if os.fstat(f.fileno()).st_uid != me or os.lstat(path).st_uid != me:
                return
            argvs = json.loads(f.read(65536))
        except (OSError, ValueError):
            return
    if not isinstance(argvs, list):
        return
    for argv in argvs:
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            continue
        # A session of its own, killed whole on the timeout: what the command started (an engine's
        # helper) goes with it. Not processes/children.run, which imports this module's importer.
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            continue
        try:
            proc.wait(timeout=BEFORE_REMOVAL_TIMEOUT)
        except subprocess.TimeoutExpired:
            kills.killpg(proc.pid, signal.SIGKILL, "the sweep: a dead run's clean-up command past its time")
            proc.wait()
        else:
            # what it left in its group, once it is done
            kills.killpg(proc.pid, signal.SIGKILL, "the sweep: what a dead run's clean-up command left")


def rmtree(path: str) -> None:
    # A task may have left read-only directories in its writable trees; as their owner or root,
    # restoring write permission on the parent and retrying is enough (conformance/layout.py). Only
    # a parent INSIDE the tree: when the top itself fails (another run removing the same dead
    # directory at once: its guardian, a second sweep), its parent is /tmp, which a chmod to 0755
    # made unwritable to every user (measured: two witness runs in parallel, the matrix's).
    top = os.path.abspath(path)

    def retry(func, p, exc):  # type: ignore[no-untyped-def]
        parent = os.path.dirname(os.path.abspath(p))
        if isinstance(exc[1], FileNotFoundError) or not parent.startswith(top):
            return  # gone already, or the top's own parent: never ours to change
        with contextlib.suppress(OSError):
            os.chmod(parent, 0o755)
            func(p)

    shutil.rmtree(path, onerror=retry)  # onerror: Python 3.11 (onexc is 3.12+)


def kill_naming(path: str, proc: Path = Path("/proc")) -> list[int]:
    """SIGKILL every process whose command line names `path` (or something under it); the caller
    has established that its owner is gone."""
    needle = path.encode()
    me, killed = os.getpid(), []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(w == needle or w.startswith(needle + b"/") or (b"=" + needle) in w for w in words):
            kills.kill(int(entry.name), signal.SIGKILL, f"the sweep: it names a dead run's {path}")
            killed.append(int(entry.name))
    return killed


def mounts_under(path: str, table: Path = Path("/proc/self/mountinfo")) -> list[str]:
    """Every mount point at or beneath `path`, deepest first (the order they can be unmounted in)."""
    points = [m.mount_point for m in mountinfo.parse(table.read_text())
              if mountinfo.under(m.mount_point, path)]
    return sorted(points, key=len, reverse=True)


# ---- cgroup leaves ---------------------------------------------------------------------------------

def kill_cgroup(path: Path, *, timeout: float = KILL_TIMEOUT) -> bool:
    """Empty a cgroup and everything under it: cgroup.kill (Linux >= 5.14), else SIGKILL each pid
    until cgroup.procs stays empty. True when it is empty."""
    kill = path / "cgroup.kill"
    if kill.exists():
        kills.record(0, signal.SIGKILL, f"cgroup.kill of {path}")
        with contextlib.suppress(OSError):
            kill.write_text("1")
    deadline = time.monotonic() + timeout
    while True:
        pids = []
        for d in [path, *(p for p in path.rglob("*") if p.is_dir())]:
            with contextlib.suppress(OSError):
                pids += [int(x) for x in (d / "cgroup.procs").read_text().split()]
        if not pids:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in pids:
            kills.kill(pid, signal.SIGKILL, f"a cgroup emptied: {path}")
        time.sleep(0.02)


def remove_cgroup(path: Path, *, timeout: float = KILL_TIMEOUT) -> str:
    """Kill what runs in a cgroup tree, then rmdir it bottom-up (cgroupfs removes only an empty
    directory with no children; EBUSY while dying tasks leave it, so retried). "" or why not."""
    if not path.is_dir():
        return ""
    if not kill_cgroup(path, timeout=timeout):
        return f"processes still in it after {timeout:.0f} s"
    deadline = time.monotonic() + timeout
    for d in sorted((p for p in [path, *path.rglob("*")] if p.is_dir()), key=lambda p: len(p.parts),
                    reverse=True):
        while True:
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    return f"rmdir {d}: {errname(e)}"
                time.sleep(0.02)
    return ""


def sweep_cgroup(root: Path) -> list[Swept]:
    """Leaves under a delegated root whose owner is gone (conformance/cgroup_leaf.py names them
    `<kind>-<stamp>-<n>`): killed, then removed. Nothing unstamped, nothing of a live run."""
    out: list[Swept] = []
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return out
    for child in children:
        owner = find(child.name)
        if owner is not None and gone(owner):
            out.append(Swept(str(child), owner, remove_cgroup(child)))
    return out
