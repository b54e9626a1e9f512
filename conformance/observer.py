"""The second observer: the live task as the HOST's kernel shows it.

The witness program reports what the task can do from inside, and everything it reads about itself
comes through files the sandbox controls (a sandbox may mount a forged /proc). So while the task waits
at a handshake, the harness finds the task's process on the host and reads its kernel state from the
host's /proc: namespaces, status (capability sets, NoNewPrivs, Seccomp, NSpid), the environment it
was exec'd with, its real mount table, its cgroup. Promises about kernel state are judged on this
reading; the inside reading must agree with it.

Finding the task: it sets its comm to a per-launch tag (prctl(PR_SET_NAME); 15 bytes, TASK_COMM_LEN
in include/linux/sched.h) before it announces the handshake on stdout, then blocks until SIGUSR1.
The harness looks the tag up under /proc/*/comm, not through the launcher's process tree, which
runc-style and daemon-based launchers leave. No live process with the tag is a harness error, never
a pass: a launcher that prints a recorded document runs nothing the host can see."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import signal
import stat
import threading
import time
from collections.abc import Callable, Container, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from sandbox_conformance.conformance.claims import NONE, Claimed, Claims
from sandbox_conformance.kernel import acl, mountinfo, procfs
from sandbox_conformance.kernel.cgroupfs import own_cgroup
from sandbox_conformance.kernel.errnos import errname
from sandbox_conformance.probes.finding import EMPTY
from sandbox_conformance.processes import cancel, children, kills

NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "user", "uts")
STATUS_KEYS = (
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
    "Seccomp",
    "NSpid",
    "Uid",
    "Gid",
    "Groups",
)
READY_KEY = "sbxc_ready"
# Processes of the harness's own that live beside the launches (conformance/ptrace_target.py): never a
# launch's leftover, whenever they started.
OWN_HELPERS: set[int] = set()
# How long a found task's process group may take to go after the launcher exits: a pid namespace is
# emptied asynchronously once its init dies (zap_pid_ns_processes, kernel/pid_namespace.c).
SURVIVOR_GRACE = 1.0
# The host's one trial of its own (binfmt_instance): an unshare(1), a mount(8) and a cat(1).
BINFMT_TRIAL_SECONDS = 10.0


def tag(launch_nonce: str) -> str:
    return ("sbxc" + launch_nonce)[:15]


def _read(path: Path | str) -> str:
    """A /proc file's text in three system calls (open, read to EOF, close) rather than a text file
    object's seven: the scans below read a few files of every process on the host, from a thread that
    competes with the witness's main thread for the GIL, which each call gives up and waits for."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def find(task_tag: str, proc: Path = Path("/proc")) -> list[int]:
    """Host pids whose comm is `task_tag`: every process on the host is looked at, so a second one
    carrying the tag makes the launch ambiguous rather than going unseen."""
    found = []
    for name in procfs.pids(proc):
        try:
            comm = procfs.read_small(f"{proc}/{name}/comm").rstrip("\n")
        except OSError:
            continue  # exited meanwhile
        if comm == task_tag:
            found.append(int(name))
    return found


def stat_fields(text: str) -> dict[str, int | str]:
    # proc(5): comm is in parentheses and may hold spaces; fields resume after the LAST ')'.
    rest = text[text.rindex(")") + 2 :].split()
    return {
        "state": rest[0],
        "ppid": int(rest[1]),
        "pgid": int(rest[2]),
        "sid": int(rest[3]),
        "starttime": int(rest[19]),
    }


def dead(pid: int | str, state: object, proc: Path = Path("/proc")) -> bool:
    """Whether a process whose stat says `state` is over. "Z" alone is not: a main thread that exited
    (SYS_exit) while other threads run leaves the leader a zombie and the process running, /proc/PID/
    status's Threads counting them (signal->nr_threads drops the leader's only when it is released)."""
    if state == "X":
        return True
    if state != "Z":
        return False
    try:
        text = _read(proc / str(pid) / "status")
    except OSError:
        return True
    threads = _status(text, ("Threads",)).get("Threads", "1")
    return not threads.isdigit() or int(threads) <= 1


def view(pid: int, proc: Path = Path("/proc")) -> Path:
    """Where a process's descriptors, cwd and root are read: /proc/PID, or, when its main thread has
    exited while others run (its fd listing is then empty, its cwd and root ENOENT), a live thread's
    /proc/PID/task/TID."""
    base = proc / str(pid)
    try:
        if stat_fields(procfs.read_small(base / "stat"))["state"] != "Z":
            return base
        tids = sorted(os.listdir(base / "task"), key=int)
    except (OSError, ValueError):
        return base
    for tid in (t for t in tids if t != str(pid)):
        with contextlib.suppress(OSError, ValueError):
            if stat_fields(procfs.read_small(base / "task" / tid / "stat"))["state"] != "Z":
                return base / "task" / tid
    return base


class Protected(NamedTuple):
    """A host path whose content must be visible nowhere in the task (a masked path's content, an
    absent path): `template` names it in messages."""

    template: str
    host_path: str


class Seen(NamedTuple):
    """The task's process as the host saw it while the task waited. A field that could not be read
    holds `error: ERRNO` (a string) instead: cannot tell, which no witness reads as a pass."""

    pid: int
    namespaces: Mapping[str, str]
    status: Mapping[str, str] | str
    environ: Mapping[str, str] | str
    mounts: tuple[mountinfo.Mount, ...] | str
    cgroup: str
    proc_stat: Mapping[str, int | str] | str
    # Found while the task waited, through /proc/PID/root (the task's own view of paths):
    exposures: tuple[Mapping[str, Any], ...] = ()  # protected content reachable under some name
    device_nodes: frozenset[str] = frozenset()  # rw mount points that are device nodes
    # rw mount points the task's credentials cannot reach (see unreachable()): listed, not judged.
    unreachable: frozenset[str] = frozenset()
    # The task's cgroup v2 directory as the host reads it: path, memory.max, pids.max.
    cgroup_files: Mapping[str, str] = EMPTY
    # (st_dev, st_ino) of the directory the task is in: stat(2) follows /proc/PID/cwd into the task's
    # own mount namespace (proc(5)), so this names the host directory whatever path the task sees.
    cwd: tuple[int, int] | str = "error: not read"
    # The mounts the task can reach from its own root mount, as it names them (mountinfo.reachable()).
    reach: tuple[mountinfo.Mount, ...] | str = "error: not read"
    # What the task holds and reaches, read from the host (see `what_it_reaches`): descriptors, the secret in
    # any process's environment or argv, device nodes, host unix sockets; EMPTY when not asked.
    reached: Mapping[str, Any] = EMPTY
    # Mount points (as the task names them) of a procfs of OUR pid namespace the task reaches: every
    # host process listed there, environ and all (see host_procfs).
    host_procfs: tuple[str, ...] | str = ()

    @property
    def nspid(self) -> list[int]:
        if isinstance(self.status, str):
            return []
        return [int(x) for x in self.status.get("NSpid", "").split()]

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "namespaces": dict(self.namespaces),
            "status": self.status if isinstance(self.status, str) else dict(self.status),
            "environ_keys": sorted(self.environ) if not isinstance(self.environ, str) else self.environ,
            "mounts": [m.to_json() for m in self.mounts] if not isinstance(self.mounts, str) else self.mounts,
            "cgroup": self.cgroup,
            "exposures": list(self.exposures),
            "device_nodes": sorted(self.device_nodes),
            "unreachable": sorted(self.unreachable),
            "cwd": list(self.cwd) if not isinstance(self.cwd, str) else self.cwd,
            "reach": self.reach if isinstance(self.reach, str) else [m.mount_id for m in self.reach],
            "reached": dict(self.reached),
            "host_procfs": self.host_procfs if isinstance(self.host_procfs, str) else list(self.host_procfs),
        }


T = TypeVar("T")


def _attempt(fn: Callable[[], T]) -> T | str:
    """fn's result, or `error: ERRNO` when it raised an OSError (Seen's "cannot tell")."""
    try:
        return fn()
    except OSError as e:
        return f"error: {errname(e)}"


def _listing(path: Path) -> list[str]:
    return sorted(os.listdir(path))[:20]


def _stripped(path: Path) -> str:
    return path.read_text().strip()


def _status(text: str, keys: Sequence[str] = STATUS_KEYS) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in keys:
            out[key] = value.strip()
    return out


def _environ(raw: bytes) -> dict[str, str]:
    out = {}
    for kv in raw.split(b"\0"):
        if kv:
            k, _, v = kv.decode(errors="replace").partition("=")
            out[k] = v
    return out


def read(
    pid: int,
    *,
    protected: Sequence[Protected] = (),
    host_mounts: Sequence[mountinfo.Mount] = (),
    proc: Path = Path("/proc"),
    asked: Reach | None = None,
    host_pidns: str = "",
) -> Seen:
    base = proc / str(pid)
    spaces = {ns: _attempt(functools.partial(os.readlink, base / "ns" / ns)) for ns in NAMESPACES}
    mounts = _attempt(lambda: tuple(mountinfo.parse(_read(base / "mountinfo"))))
    # What the task can reach, from the mount its root really is (not the last one stacked on "/").
    reach = mounts if isinstance(mounts, str) else _attempt(
        functools.partial(mountinfo.for_task, mounts, pid, proc)
    )
    root = base / "root"
    found: list[dict[str, Any]] = []
    nodes: set[str] = set()
    if not isinstance(reach, str):
        for p in protected:
            where = mountinfo.locate(host_mounts, p.host_path)
            if where is None:
                continue
            for exp in mountinfo.exposures(reach, where):
                # Confirmed through the task's own root: the kernel resolves the alias in the task's
                # mount namespace (proc(5), /proc/PID/root), and lists what is there.
                listing = _attempt(functools.partial(_listing, root / exp.path.lstrip("/")))
                found.append(
                    {
                        "template": p.template,
                        "path": exp.path,
                        "mount_point": exp.mount.mount_point,
                        "listing": listing,
                    }
                )
        for m in mountinfo.on_top(reach):
            if not m.read_only and m.storage:
                with contextlib.suppress(OSError):
                    mode = os.stat(root / m.mount_point.lstrip("/")).st_mode
                    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                        nodes.add(m.mount_point)
    status = _attempt(lambda: _status(_read(base / "status")))
    shut: set[str] = set()
    if not isinstance(reach, str) and not isinstance(status, str):
        uid_map = _attempt(lambda: _read(base / "uid_map"))
        creds = Creds.of(status, uid_map)  # "error: ERRNO" has no 3-field line: no mapped ranges
        held = held_mounts(base, reach)
        for m in mountinfo.on_top(reach):
            writable = not m.read_only and m.storage and m.mount_point not in nodes
            # A mount the task already holds a way into (its cwd, its root, an open descriptor)
            # needs no path search: relative writes reach it whatever the directories above say.
            # (One reached only through `..` has no host-side path to search: never excused.)
            excused = not mountinfo.over_root(m) and unreachable(root, m.mount_point, creds)
            if writable and m.mount_id not in held and excused:
                shut.add(m.mount_point)
    cgroup = _attempt(lambda: _read(base / "cgroup"))
    reached: Mapping[str, Any] = EMPTY
    if asked is not None and not isinstance(mounts, str) and not isinstance(status, str):
        visible = mounts if isinstance(reach, str) else reach
        reached = what_it_reaches(
            pid, asked, mounts, visible, host_mounts, spaces, host_pidns=host_pidns, proc=proc
        )
    return Seen(
        pid=pid,
        namespaces=spaces,
        status=status,
        environ=_attempt(lambda: _environ((base / "environ").read_bytes())),
        mounts=mounts,
        cgroup=cgroup,
        proc_stat=_attempt(lambda: stat_fields(_read(base / "stat"))),
        exposures=tuple(found),
        device_nodes=frozenset(nodes),
        unreachable=frozenset(shut),
        cgroup_files=cgroup_files(cgroup, host_mounts),
        cwd=_attempt(lambda: _dev_ino(os.stat(base / "cwd"))),
        reach=reach,
        reached=reached,
        host_procfs=reach if isinstance(reach, str)
        else _attempt(functools.partial(host_procfs, root, reach)),
    )


def host_procfs(root: Path, visible: Sequence[mountinfo.Mount]) -> tuple[str, ...]:
    """The procfs mounts the task reaches that are instances of the harness's own pid namespace (the
    host's /proc bound in at /host/proc, a monitoring agent's way): `self` in a procfs resolves to the
    READER's pid in that procfs's pid namespace (fs/proc/self.c proc_self_get_link), so read here,
    through the task's root, it names our own pid only in a procfs of our namespace (or an ancestor's);
    in the task's own it does not resolve (ENOENT). A mount of a procfs sub-tree (/proc/sys bound
    alone) lists no processes and is a kernel interface, judged by kernel_interfaces."""
    me = str(os.getpid())
    out = []
    for m in visible:
        if m.fstype != "proc" or m.root != "/":
            continue
        try:
            if os.readlink(root / m.mount_point.lstrip("/") / "self") == me:
                out.append(m.mount_point)
        except OSError as e:
            if not isinstance(e, FileNotFoundError | NotADirectoryError):
                raise
    return tuple(out)


def _dev_ino(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _mount_of(link: Path) -> int:
    """The mount a /proc magic link (cwd, root) is on: an O_PATH open of it is a descriptor of that very
    path, mount and all, whose fdinfo names the mount (proc(5))."""
    fd = os.open(link, os.O_PATH | os.O_CLOEXEC)
    try:
        mnt = _fdinfo(Path(f"/proc/self/fdinfo/{fd}")).get("mnt_id", "")
    finally:
        os.close(fd)
    if not mnt.isdigit():
        raise OSError(f"no mnt_id in the fdinfo of {link}")
    return int(mnt)


class Creds(NamedTuple):
    """The task's credentials as the host's kernel holds them (real ids, not the namespace's)."""

    fsuid: int
    fsgid: int
    groups: frozenset[int]
    mapped: tuple[tuple[int, int], ...]  # (outside start, count) of the task's user namespace uid_map

    @classmethod
    def of(cls, status: Mapping[str, str], uid_map: str) -> Creds:
        uids, gids = status.get("Uid", "0 0 0 0").split(), status.get("Gid", "0 0 0 0").split()
        groups = status.get("Groups", "").split()
        ranges = []
        for line in uid_map.splitlines():
            parts = line.split()
            if len(parts) == 3:
                ranges.append((int(parts[1]), int(parts[2])))
        return cls(int(uids[3]), int(gids[3]), frozenset(int(g) for g in groups), tuple(ranges))

    def maps(self, uid: int) -> bool:
        return any(start <= uid < start + count for start, count in self.mapped)


def held_mounts(base: Path, mounts: Sequence[mountinfo.Mount]) -> frozenset[int]:
    """The mounts serving the task's cwd, root and every open descriptor. readlink(2) on /proc/PID/cwd
    and fd/N gives the path as the task's own mount namespace names it (proc(5)). The MOUNT counts,
    not the filesystem: a second mount of the same filesystem (a bind in a directory the task cannot
    search) is no way in. A reference whose path does not lead to a mount of its own filesystem (a
    deleted file, a descriptor opened outside the task's root) holds every mount of that filesystem:
    such a mount is then judged as reachable, never excused."""
    refs = [base / "cwd", base / "root"]
    with contextlib.suppress(OSError):
        refs += [base / "fd" / n for n in os.listdir(base / "fd")]
    out: set[int] = set()
    for ref in refs:
        try:
            st = os.stat(ref)  # the kernel follows the task's own reference
        except OSError:
            continue  # gone since the listing: holds nothing
        dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        try:
            target = os.readlink(ref)
        except OSError:
            target = ""
        m = mountinfo.serving(mounts, target) if target.startswith("/") else None
        if m is not None and m.dev == dev and not target.endswith(" (deleted)"):
            out.add(m.mount_id)
        else:
            out |= {x.mount_id for x in mounts if x.dev == dev}
    return frozenset(out)


def unreachable(root: Path, mount_point: str, creds: Creds) -> bool:
    """The task cannot even reach `mount_point`: a directory on the way denies its fsuid and groups
    search (x) permission, and that directory's owner is not mapped into the task's user namespace,
    so no capability the task holds there can override it (capabilities(7): CAP_DAC_* apply only to
    inodes whose owner and group map into the namespace). bwrap run unprivileged leaves such
    submounts of a --ro-bind read-write, being unable to reach them itself."""
    if creds.fsuid == 0 and creds.maps(0):
        return False  # root in the initial namespace (or mapped to it) passes every search check
    path = root
    for part in [p for p in mount_point.split("/") if p]:  # the mount's own root directory too
        path = path / part
        try:
            st = os.stat(path)
            ok = _permits(path, st, creds, acl.EXECUTE)
        except (OSError, ValueError):
            return False  # cannot tell: judged as reachable, never as a pass
        if not ok and not creds.maps(st.st_uid):
            return True
    return False


def cgroup_files(cgroup: str, host_mounts: Sequence[mountinfo.Mount]) -> dict[str, str]:
    """The limits of the task's cgroup v2 directory, read through the host's cgroup2 mount (the one
    showing the hierarchy's root; `0::PATH` is relative to it, cgroups(7))."""
    path = own_cgroup(cgroup)
    mount = next((m for m in host_mounts if m.fstype == "cgroup2" and m.root == "/"), None)
    if path is None or mount is None:
        return {"error": "no cgroup v2 line" if path is None else "no cgroup2 mount on the host"}
    d = Path(mount.mount_point) / path.lstrip("/")
    out = {"path": path}
    for name in ("memory.max", "pids.max"):
        out[name] = _attempt(functools.partial(_stripped, d / name))
    return out


# ---- what the task holds and reaches ----------------------------------------------------------------


class Reach(NamedTuple):
    """What the host looks for around the task (conformance/plan.py reach_plan says what the task tries)."""

    secret: str = ""
    secret_file: str = ""  # a file in the launcher's working directory holding the secret
    sockets: tuple[str, ...] = ()  # listening unix sockets of the host, by path
    devices: Mapping[str, str] = EMPTY  # allowed device node path -> "major:minor" ("*": any)


# readlink(2) of a namespace descriptor: "net:[4026531840]" (proc(5), /proc/PID/ns).
_NS_LINK = re.compile(r"^(cgroup|ipc|mnt|net|pid|pid_for_children|time|time_for_children|user|uts):\[\d+\]$")
# Where each /proc/PID/net table keeps the socket's inode (net/ipv4/tcp_ipv4.c get_tcp4_sock,
# net/unix/af_unix.c unix_seq_show, net/netlink/af_netlink.c, net/packet/af_packet.c).
# Cheapest first (SocketTables): a task's descriptor is most often a unix socket.
_INODE_COLUMN = {"unix": 6, "netlink": 9, "udp": 9, "udp6": 9, "raw": 9, "raw6": 9, "packet": 8,
                 "udplite": 9, "udplite6": 9, "tcp": 9, "tcp6": 9}
PTS_MAJORS = range(136, 144)  # Documentation/admin-guide/devices.txt: Unix98 PTY slaves
PTMX = "5:2"  # the same list: the PTY master multiplex device


def task_pids(pid: int, pidns: str, host_pidns: str, proc: Path = Path("/proc")) -> list[int]:
    """The task and every process that can share what it holds: its whole pid namespace where it has one
    of its own (the sandbox's init, its helpers), else the task and its descendants."""
    table = _process_table(proc)
    if pidns and not pidns.startswith("error") and pidns != host_pidns:
        return sorted(p for p, (_, _, ns) in table.items() if ns == pidns)
    return sorted([pid, *(p for p, _ in _below(pid, table))])


def descendants(pid: int, proc: Path = Path("/proc")) -> list[tuple[int, int]]:
    """Every live process below `pid`, with its start time (conformance/claims.py's pairs)."""
    return _below(pid, _process_table(proc))


def _process_table(proc: Path) -> dict[int, tuple[int, int, str]]:
    """{pid: (ppid, starttime, pid namespace)} of every process, in one pass over /proc."""
    table: dict[int, tuple[int, int, str]] = {}
    for name in procfs.pids(proc):
        try:
            st = stat_fields(procfs.read_small(f"{proc}/{name}/stat"))
            pidns = procfs.readlink(f"{proc}/{name}/ns/pid")
            table[int(name)] = (int(st["ppid"]), int(st["starttime"]), pidns)
        except (OSError, ValueError):
            continue
    return table


def _below(pid: int, table: Mapping[int, tuple[int, int, str]]) -> list[tuple[int, int]]:
    children: dict[int, list[int]] = {}
    for p, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append((child, table[child][1]))
            todo.append(child)
    return out


class SocketTables:
    """The inodes of the sockets in one network namespace (its /proc/PID/net tables), read as a
    descriptor asks, one table at a time, the cheap ones first: /proc/net/tcp and tcp6 walk every
    bucket of the kernel's TCP hash tables, whichever namespace they belong to (net/ipv4/tcp_ipv4.c
    established_get_first), 4 ms each here with one socket in them, and a task that holds no TCP
    socket never needs them."""

    def __init__(self, net: Path) -> None:
        self._net, self._left = net, list(_INODE_COLUMN)
        self._inodes: set[int] = set()

    def __contains__(self, inode: object) -> bool:
        while inode not in self._inodes and self._left:
            name = self._left.pop(0)
            self._inodes |= _table_inodes(self._net / name, _INODE_COLUMN[name])
        return inode in self._inodes


def _table_inodes(path: Path, column: int) -> set[int]:
    try:
        lines = _read(path).splitlines()[1:]
    except OSError:
        return set()
    out = set()
    for line in lines:
        parts = line.split()
        if len(parts) > column and parts[column].isdigit():
            out.add(int(parts[column]))
    return out


def _fdinfo(path: Path) -> dict[str, str]:
    out = {}
    for line in _read(path).splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


def _rdev(st: os.stat_result) -> str:
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def device_allowed(path: str, st: os.stat_result, allowed: Mapping[str, str]) -> bool:
    want = allowed.get(path)
    if want is not None and want in ("*", _rdev(st)):
        return True
    if _rdev(st) in allowed.values():
        return True  # /dev/null under another name (OCI maskedPaths binds it over files) is /dev/null
    return path.startswith("/dev/pts/") and os.major(st.st_rdev) in PTS_MAJORS


def held(pids: Sequence[int], mounts: Sequence[mountinfo.Mount], namespaces: Mapping[str, str],
         allowed: Mapping[str, str], proc: Path = Path("/proc"), *,
         task: int | None = None, members: Container[int] | None = None,
         unread: list[int] | None = None) -> list[dict[str, Any]]:
    """Every descriptor a process of the task holds that leads out of it: a file or directory on a mount
    outside the task's mount namespace (fdinfo's mnt_id, proc(5); mount ids are unique system-wide), a
    socket of another network namespace, a namespace the task is not in, a pidfd of a process outside
    it, an io_uring polled by a thread of a process outside it, a fanotify group marking mounts or
    filesystems outside its mount namespace, a device node off the allowlist. Pipes, FIFOs and other
    event descriptors are the task's channels.
    `task`: the process whose network namespace is the task's (default: the first of `pids`);
    `members`: the processes that are the task's (default: `pids`); `unread` gets the processes whose
    descriptors the harness may not list (EACCES: another user's, or not dumpable): cannot tell."""
    mount_ids = {m.mount_id for m in mounts}
    devs = {m.dev for m in mounts}
    net = task if task is not None else (pids[0] if pids else None)
    socks: Container[int] = SocketTables(proc / str(net) / "net") if net is not None else frozenset()
    own = set(namespaces.values())
    members = set(pids) if members is None else members
    out: list[dict[str, Any]] = []
    for p in pids:
        base = view(p, proc)
        try:
            names = sorted(os.listdir(base / "fd"), key=int)
        except OSError as e:
            if isinstance(e, PermissionError) and unread is not None:
                unread.append(p)
            continue
        for n in names:
            try:
                link = _link(base / "fd" / n)
                why = _why_out(link, base, n, mount_ids, socks, own, members, allowed, devs, proc)
            except OSError:
                continue  # closed since the listing
            if why:
                out.append({"pid": p, "fd": int(n), "link": link, "why": why})
    return out[:100]


def _link(path: Path) -> str:
    """A /proc magic link's text, or what kept it unread: the verdict rests on stat and fdinfo, which
    follow the link itself, so a path the kernel cannot spell (d_path's ENAMETOOLONG past a page: a
    directory nested deeper than 4096 bytes) is still judged. ENOENT: closed, or gone."""
    try:
        return procfs.readlink(path)
    except OSError as e:
        if isinstance(e, FileNotFoundError | ProcessLookupError):
            raise
        return f"(unreadable: {errname(e)})"


def _tgid(tid: int, proc: Path) -> int | None:
    """The process a thread belongs to (status's Tgid), or None once it is gone."""
    try:
        text = _read(proc / str(tid) / "status")
    except OSError:
        return None
    tgid = _status(text, ("Tgid",)).get("Tgid", "")
    return int(tgid) if tgid.isdigit() else None


def _fanotify_marks_outside(fdinfo: str, mount_ids: set[int], devs: set[str]) -> str:
    """What a fanotify group's marks watch that the task's mount namespace has none of: a mount mark
    ("mnt_id:1b", hex) on another mount, an inode or filesystem mark ("sdev:fe00000", the kernel's
    dev_t: major << 20 | minor) on a filesystem none of its mounts show (fs/notify/fdinfo.c)."""
    for line in fdinfo.splitlines():
        if not line.startswith("fanotify ") or "mask:" not in line:
            continue  # the group's own flags line
        fields = dict(f.split(":", 1) for f in line.split()[1:] if ":" in f)
        with contextlib.suppress(ValueError):
            if "mnt_id" in fields and int(fields["mnt_id"], 16) not in mount_ids:
                return f"mount {int(fields['mnt_id'], 16)}"
            if "sdev" in fields:
                dev = int(fields["sdev"], 16)
                if f"{dev >> 20}:{dev & 0xFFFFF}" not in devs:
                    return f"the filesystem {dev >> 20}:{dev & 0xFFFFF}"
    return ""


def _why_out(link: str, base: Path, n: str, mount_ids: set[int], socks: Container[int], own: set[str],
             members: Container[int], allowed: Mapping[str, str], devs: set[str], proc: Path) -> str | None:
    if link.startswith("socket:["):
        if int(link[8:-1]) not in socks:
            return "a socket of another network namespace (opened outside the sandbox and left open)"
        return None
    if link.startswith("pipe:["):
        return None
    if link.startswith("anon_inode:"):
        if "pidfd" in link:
            target = _fdinfo(base / "fdinfo" / n).get("Pid", "")
            if target.lstrip("-").isdigit() and int(target) > 0 and int(target) not in members:
                return f"a pidfd of host process {target}, outside the task"
        elif "io_uring" in link:
            # IORING_SETUP_SQPOLL: the ring's requests (an openat, a connect) are carried out by its
            # polling thread, a thread of the process that made the ring, with that process's files,
            # root and credentials (io_uring/sqpoll.c). SqThread is its host tid.
            sq = _fdinfo(base / "fdinfo" / n).get("SqThread", "")
            made_by = _tgid(int(sq), proc) if sq.isdigit() and int(sq) > 0 else None
            if made_by is not None and made_by not in members:
                return (f"an io_uring whose polling thread is of host process {made_by}, outside the task: "
                        "its requests act as that process")
        elif "fanotify" in link:
            outside = _fanotify_marks_outside(_read(base / "fdinfo" / n), mount_ids, devs)
            if outside:
                return (f"a fanotify group watching {outside}, outside the task's mount namespace: reading "
                        "its events opens the files they name")
        return None
    if _NS_LINK.match(link):
        return None if link in own else "a namespace the task is not in (setns(2) would enter it)"
    st = os.stat(base / "fd" / n)
    if stat.S_ISFIFO(st.st_mode):
        return None
    mnt = _fdinfo(base / "fdinfo" / n).get("mnt_id", "")
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        if _rdev(st) == PTMX and mnt.isdigit() and int(mnt) not in mount_ids:
            # A terminal's master end opened outside (the host's /dev/ptmx): what the task writes there
            # is typed into a terminal of the host's, whose shell reads it (pty(7)).
            return f"a pseudo-terminal master opened outside the task's mount namespace (mount {mnt})"
        ok = device_allowed(link, st, allowed) or os.major(st.st_rdev) in PTS_MAJORS
        return None if ok else f"the device node {_rdev(st)}, off the allowlist"

    if mnt.isdigit() and int(mnt) not in mount_ids:
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "file"
        return f"a {kind} on a mount outside the task's mount namespace (mount {mnt})"
    return None


def helpers(seen: Seen, proc: Path = Path("/proc")) -> dict[int, int]:
    """{pid: start time} of the processes in the task's pid namespace at the handshake that are not the
    task's own (neither the task nor its descendants): the sandbox's init and helpers, which can be
    handed a way out later (SCM_RIGHTS, a broker's open) where the task reaches it through /proc/PID/fd
    or by asking. The task's own descendants are its trials, judged from inside."""
    out: dict[int, int] = {}
    for p in seen.reached.get("pids", []):
        if p != seen.pid and not _descends(p, seen.pid, proc) and (start := host_task(p, proc)) is not None:
            out[p] = start
    return out


def still(started: Mapping[int, int], proc: Path = Path("/proc")) -> list[int]:
    """The processes of `started` ({pid: start time}) that still run (not a later one with a reused pid)."""
    return [p for p, start in started.items() if host_task(p, proc) == start]


def joined(seen: Seen, host_pidns: str, classified: dict[int, bool], proc: Path = Path("/proc")) -> list[int]:
    """The processes in the task's own pid namespace that were not there at the handshake and do not
    descend from the task: what entered it from outside since (`runc exec`, `docker exec`, nsenter).
    `classified` (pid -> joined), carried from look to look, starts as every host process at the
    handshake, and the task and every process the handshake reached (judged there): a process enters a
    pid namespace only by being forked into it (setns(2) moves the caller's children, never the
    caller), so only a pid not yet seen is read, once. A look then costs
    one pass over /proc's entries: a joined process lives no longer than the task's pid namespace."""
    pidns = seen.namespaces.get("pid", "")
    if not pidns or pidns.startswith("error") or pidns == host_pidns:
        return []  # no namespace of its own: nothing can join it
    now = set()
    for name in procfs.pids(proc):
        p = int(name)
        now.add(p)
        if p not in classified:
            try:
                classified[p] = procfs.readlink(f"{proc}/{name}/ns/pid") == pidns \
                    and not _descends(p, seen.pid, proc)
            except OSError:
                classified[p] = False  # gone already
    # A pid gone since is forgotten: its number, reused (by a joiner, after the pid space wrapped), is
    # read again. Reused between two looks (5-30 ms) it would need ~10^6 forks a second.
    for p in [p for p in classified if p not in now]:
        del classified[p]
    return sorted(p for p, entered in classified.items() if entered)


def _descends(pid: int, ancestor: int, proc: Path) -> bool:
    for _ in range(64):
        try:
            pid = int(stat_fields(procfs.read_small(f"{proc}/{pid}/stat"))["ppid"])
        except (OSError, ValueError):
            return False
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


def places_out(pids: Sequence[int], mounts: Sequence[mountinfo.Mount],
               proc: Path = Path("/proc"), unread: list[int] | None = None) -> list[dict[str, Any]]:
    """Each process's working directory and root that are on a mount outside the task's mount namespace
    (runc CVE-2024-21626: `runc exec --cwd /proc/self/fd/N` started a process in the container with its
    cwd on the host). An O_PATH open of /proc/PID/cwd is a descriptor of that very mount (the magic link
    is the process's path, mount and all, proc(5)), so its fdinfo names the mount."""
    mount_ids = {m.mount_id for m in mounts}
    out: list[dict[str, Any]] = []
    for p in pids:
        base = view(p, proc)
        for what in ("cwd", "root"):
            try:
                fd = os.open(base / what, os.O_PATH | os.O_CLOEXEC)
            except OSError as e:
                if isinstance(e, PermissionError) and unread is not None:
                    unread.append(p)  # not ours to read: cannot tell
                continue  # gone
            try:
                mnt = _fdinfo(Path(f"/proc/self/fdinfo/{fd}")).get("mnt_id", "")
                link = _link(base / what)
            except OSError:
                continue
            finally:
                os.close(fd)
            if mnt.isdigit() and int(mnt) not in mount_ids:
                why = f"its {what} is on a mount outside the task's mount namespace (mount {mnt})"
                out.append({"pid": p, "fd": what, "link": link, "why": why})
    return out


def host_sockets(proc: Path = Path("/proc")) -> tuple[str, ...]:
    """Paths of the listening unix sockets in this (the host's) network namespace: /proc/net/unix rows
    with __SO_ACCEPTCON (0x10000) in Flags and a path that is not abstract (net/unix/af_unix.c)."""
    out = []
    with contextlib.suppress(OSError):
        for line in _read(proc / "net" / "unix").splitlines()[1:]:
            parts = line.split(maxsplit=7)
            if len(parts) == 8 and int(parts[3], 16) & 0x10000 and parts[7].startswith("/"):
                out.append(parts[7])
    return tuple(sorted(set(out)))[:500]


def _permits(path: Path, st: os.stat_result, creds: Creds, want: int) -> bool:
    """The kernel's permission check for the task's fsuid and groups on `path`, its access ACL
    included (kernel/acl.py): mode bits alone refuse ids a named ACL entry lets through."""
    return acl.permits(st, acl.read(path), creds.fsuid, creds.groups | {creds.fsgid}, want)


def _may_write(path: Path, st: os.stat_result, creds: Creds) -> bool:
    # connect(2) to a path socket needs write permission on it (net/unix/af_unix.c unix_find_bsd).
    if creds.fsuid == 0 and creds.maps(0):
        return True
    try:
        return _permits(path, st, creds, acl.WRITE)
    except (OSError, ValueError):
        return True  # cannot tell: judged as usable, never as a pass


def exposed(paths: Sequence[str], root: Path, mounts: Sequence[mountinfo.Mount],
            host_mounts: Sequence[mountinfo.Mount], creds: Creds | None) -> list[dict[str, Any]]:
    """Host files (sockets, the secret file) reachable in the task: the task's mount table shows the same
    filesystem object under some name, and the kernel finds it there through the task's own root."""
    out: list[dict[str, Any]] = []
    for path in paths:
        try:
            host_st = os.stat(path)
        except OSError:
            continue
        where = mountinfo.locate(host_mounts, path)
        if where is None:
            continue
        for exp in mountinfo.exposures(mounts, where):
            seen = root / exp.path.lstrip("/")
            try:
                st = os.stat(seen)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) != (host_st.st_dev, host_st.st_ino):
                continue
            usable = creds is None or (
                (_may_write(seen, st, creds) if stat.S_ISSOCK(st.st_mode) else True)
                and not unreachable(root, os.path.dirname(exp.path), creds)
            )
            out.append(
                {"host_path": path, "path": exp.path, "mount_point": exp.mount.mount_point, "usable": usable}
            )
    return out


def _is_node(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)


# How deep under /dev (and every other devtmpfs) nodes are looked for: inside.DEVICE_DEPTH, which the
# task walks (the host asking for a node the task never reached would fail every run).
DEVICE_DEPTH = 6


def device_nodes(
    root: Path, mounts: Sequence[mountinfo.Mount], allowed: Mapping[str, str], looked_at: float | None = None
) -> list[dict[str, Any]]:
    """The device nodes off the allowlist the task's root shows: under /dev and every other devtmpfs
    mount (the host's /dev bound in at /host/dev), and any mount point that is one (a node bound next
    to a minimal /dev).

    `looked_at`: when the host began this reading (time.time()), after the task announced, so after its
    own trials. A pseudo-terminal whose inode changed later (its ctime: /dev/pts/N is made when someone
    opens /dev/ptmx, fs/devpts/inode.c devpts_pty_new) appeared after the task looked: marked `late`,
    which the witness cannot ask the task to have tried. Measured: with the host's / bound in, a
    terminal another run opened meanwhile showed up as an untried /hostroot/dev/pts/0, 1 run in 3."""
    found: dict[str, dict[str, Any]] = {}

    def entry(path: str, st: os.stat_result) -> dict[str, Any]:
        # Pseudo-terminal slaves only (Unix98 majors 136-143, Documentation/admin-guide/devices.txt): the
        # one kind of node made by an ordinary open on a running machine. A ctime any node's owner can
        # bump (chmod) must not excuse a device the sandbox keeps touching to blind this reading.
        pts = 136 <= os.major(st.st_rdev) <= 143
        late = looked_at is not None and pts and st.st_ctime > looked_at
        return {"path": path, "rdev": _rdev(st), **({"late": True} if late else {})}

    devfs = [Path(m.mount_point) for m in mounts if m.fstype == "devtmpfs" and m.mount_point != "/dev"]
    level, seen = [Path("/dev"), *devfs[:20]], 0
    for _ in range(DEVICE_DEPTH):
        nxt = []
        for d in level:
            try:
                entries = list(os.scandir(root / str(d).lstrip("/")))
            except OSError:
                continue
            for e in entries:
                seen += 1
                if seen > 3000:
                    break
                path = str(d / e.name)
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    nxt.append(d / e.name)
                elif _is_node(st) and not device_allowed(path, st, allowed):
                    found[path] = entry(path, st)
        level = nxt
    for m in mountinfo.on_top(mounts):
        with contextlib.suppress(OSError):
            st = os.stat(root / m.mount_point.lstrip("/"))
            if _is_node(st) and not device_allowed(m.mount_point, st, allowed):
                found.setdefault(m.mount_point, entry(m.mount_point, st))
    return sorted(found.values(), key=lambda x: str(x["path"]))[:200]


def secret_carriers(pids: Sequence[int], secret: str, proc: Path = Path("/proc")) -> list[str]:
    """The environ and cmdline files of `pids` that hold `secret` ("/proc/PID/environ (host pid)"):
    what a process of the same uid in their pid namespace reads there too (proc(5))."""
    found = []
    for p in pids:
        for what in ("environ", "cmdline"):
            with contextlib.suppress(OSError):
                if secret.encode() in (proc / str(p) / what).read_bytes():
                    found.append(f"/proc/{p}/{what} (host pid)")
    return found


def what_it_reaches(
    pid: int,
    asked: Reach,
    mounts: Sequence[mountinfo.Mount],
    visible: Sequence[mountinfo.Mount],
    host_mounts: Sequence[mountinfo.Mount],
    namespaces: Mapping[str, str],
    *,
    host_pidns: str,
    proc: Path = Path("/proc"),
) -> dict[str, Any]:
    """`mounts`: the task's whole mount namespace (a descriptor on none of them leads out of it);
    `visible`: the ones it reaches from its own root (where an exposure or a device node is judged)."""
    looked_at = time.time()  # after the task's announce: its own trials are over (device_nodes)
    base, root = proc / str(pid), proc / str(pid) / "root"
    status = _attempt(lambda: _status(_read(base / "status")))
    uid_map = _attempt(lambda: _read(base / "uid_map"))
    creds = Creds.of(status, uid_map) if not isinstance(status, str) else None
    pids = task_pids(pid, namespaces.get("pid", ""), host_pidns, proc)
    out: dict[str, Any] = {"pids": pids}
    # A process of the task's whose cwd or root is on a mount of another namespace is a way out too:
    # the task reaches it through /proc/PID/cwd (where ptrace access allows) or, as that process, by `..`.
    # The task's own network namespace judges sockets: `pids` is sorted, and its first is usually the
    # sandbox's init, which may stay in the host's while the task has one of its own.
    unread: list[int] = []
    out["descriptors"] = [*held(pids, mounts, namespaces, asked.devices, proc, task=pid, unread=unread),
                          *places_out(pids, mounts, proc, unread)]
    out["unread"] = sorted(set(unread))
    if asked.secret:
        out["secret_holders"] = secret_carriers(pids, asked.secret, proc)
        out["secret_file"] = exposed([asked.secret_file] if asked.secret_file else [], root, visible,
                                     host_mounts, creds)
    out["sockets"] = [e for e in exposed(asked.sockets, root, visible, host_mounts, creds) if e["usable"]]
    out["devices"] = device_nodes(root, visible, asked.devices, looked_at)
    sysfs = mountinfo.serving(visible, "/proc/sys")
    out["proc_sys"] = (
        {"fstype": sysfs.fstype, "mount_point": sysfs.mount_point, "ro": sysfs.read_only} if sysfs else None
    )
    out["cgroup_roots"] = cgroup_roots(visible, creds)
    out["binfmt_mounts"] = binfmt_mounts(visible, creds, functools.partial(binfmt_instance, host_mounts))
    return out


def cgroup_roots(visible: Sequence[mountinfo.Mount], creds: Creds | None) -> list[dict[str, Any]]:
    """The host's cgroup hierarchies the task's mount table shows from their very root, read-write, to a
    task that is root on the host: every cgroup of the host's is then the task's to write (a v1
    release_agent, a program the kernel runs as root; v2's cgroup.max.depth and every service's limits).
    The root field of a cgroup mount is shown relative to the READER's cgroup namespace
    (kernel/cgroup/cgroup.c cgroup_show_path): read from the host, "/" is the hierarchy's real root,
    whatever cgroup namespace the task is in. The files there are root's (0644): a task that is not
    root on the host is refused by their modes, and unknown credentials are never excused."""
    if creds is not None and not (creds.fsuid == 0 and creds.maps(0)):
        return []
    return [
        {"mount_point": m.mount_point, "fstype": m.fstype}
        for m in visible
        if m.fstype in ("cgroup", "cgroup2") and m.root == "/" and not m.read_only
    ][:64]


HOSTS, OWN = "the host's", "a user namespace's own"


def binfmt_mounts(
    visible: Sequence[mountinfo.Mount], creds: Creds | None, host_instance: Callable[[], str]
) -> list[dict[str, Any]]:
    """The binfmt_misc mounts the task sees read-write, for a task that is root on the host, each with
    whose instance it is. Its `register` (0200, root's) names an interpreter the kernel runs for every
    matching exec (Documentation/admin-guide/binfmt-misc.rst); with flag F the interpreter is opened at
    registration, in the registering task's mount namespace: a file of the sandbox's, run for the
    host's execs. Since Linux 6.7 a user namespace may mount an instance of its own, used only by the
    execs below it: harmless, and indistinguishable from inside. Two mounts of one instance share its
    superblock, so the host tells them apart by device (`instance`: HOSTS, OWN or "unknown: why")."""
    if creds is not None and not (creds.fsuid == 0 and creds.maps(0)):
        return []
    shown = [m for m in visible if m.fstype == "binfmt_misc" and not m.read_only][:16]
    if not shown:
        return []
    try:
        host = host_instance()
    except LookupError as e:
        return [{"mount_point": m.mount_point, "dev": m.dev, "instance": f"unknown: {e}"} for m in shown]
    return [{"mount_point": m.mount_point, "dev": m.dev, "instance": HOSTS if m.dev == host else OWN}
            for m in shown]


def binfmt_instance(host_mounts: Sequence[mountinfo.Mount]) -> str:
    """The device ("major:minor") of the initial user namespace's binfmt_misc instance: the host's own
    mount of it where it has one; else one made for the purpose in a throwaway private mount namespace
    (needs root; nothing reaches the host's table, and the namespace goes with the process). Mounted on
    /proc/sys/fs, not on the usual /proc/sys/fs/binfmt_misc, which is systemd's automount point. The
    superblock stays while any mount of it does (get_tree_keyed, fs/binfmt_misc.c), so while the task
    holds one of the host's instance this mount shows the same device. LookupError: no answer."""
    for m in host_mounts:
        if m.fstype == "binfmt_misc":
            return m.dev
    done = children.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         "mount -t binfmt_misc sbxc /proc/sys/fs && exec cat /proc/self/mountinfo"],
        timeout=BINFMT_TRIAL_SECONDS,
    )
    if done.returncode != 0:
        why = "timed out" if done.timed_out else (done.stderr.strip()[:200] or f"exit {done.returncode}")
        raise LookupError(f"the host's own instance could not be mounted for comparison: {why}")
    for m in mountinfo.parse(done.stdout):
        if m.fstype == "binfmt_misc" and m.mount_point == "/proc/sys/fs":
            return m.dev
    raise LookupError("the host's trial mount of its own instance did not show in its mount table")


def host_task(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The start time of a live process (a reused pid has another), or None once it is gone or a
    zombie (dead, unreaped; see `dead`)."""
    try:
        st = stat_fields(procfs.read_small(proc / str(pid) / "stat"))
    except (OSError, ValueError):
        return None
    if dead(pid, st["state"], proc):
        return None
    return int(st["starttime"])


def boot_ticks() -> int:
    """Now, in the unit of /proc/PID/stat's starttime: clock ticks since boot (proc(5))."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def become_subreaper() -> None:
    """Orphans of what we launch are reparented to us, not to init (PR_SET_CHILD_SUBREAPER,
    prctl(2)): a launcher that double-forks a daemon out of every session and group is still found,
    as a child of ours that started during the launch."""
    import prctl  # type: ignore[import-untyped]  # python-prctl ships no stubs and no py.typed

    if not prctl.get_child_subreaper():
        prctl.set_child_subreaper(True)


def survivors(
    seen: Seen,
    launcher_pgid: int,
    *,
    host_namespaces: Mapping[str, str],
    harness_sid: int,
    since: int | None = None,
    until: int | None = None,
    others: Claimed = NONE,
    proc: Path = Path("/proc"),
) -> list[dict[str, Any]]:
    """Processes still running that the launch started: in the task's pid namespace (when it is not
    the host's), in the task's session (when it is not the harness's), in the launcher's process
    group, or orphans reparented to us (see become_subreaper) that started at or after `since`.
    Zombies are dead (they only wait to be reaped), unless other threads of theirs still run (`dead`).

    `until` (ticks, as starttime): when the launcher had exited. A process started later is not the
    launch's by its namespace, session or group: a pid namespace's number is the lowest free one
    (the kernel's inode ida), so the next sandbox made, by a concurrent run, gets the number of the
    task's namespace the moment it is gone, and was SIGKILLed as a leftover of this launch (issue
    28: its launcher, under load, `exited 137; stderr: (empty)`); sessions and groups are numbered by
    pids, which come round again.

    `others`: what the session's other launches, running beside this one, claimed as theirs
    (conformance/claims.py): neither reported nor reaped here."""
    task_pidns = seen.namespaces.get("pid", "")
    task_sid = seen.proc_stat.get("sid") if not isinstance(seen.proc_stat, str) else None
    me = os.getpid()
    # Ours, never the launch's: this process and its guardian (processes/cancel.py). The guardian is a
    # child of ours, so one started less than two clock ticks before a launch's `since` (a `run`'s
    # forked witness on a fast machine) would pass for an orphan of it: reported as a leftover of
    # the sandbox, and killed.
    guardian = cancel.guardian_pid()
    ours = {str(me), *(str(p) for p in OWN_HELPERS)} | (set() if guardian is None else {str(guardian)})
    out = []
    for name in procfs.pids(proc):
        if name in ours:
            continue
        try:
            text = procfs.read_small(f"{proc}/{name}/stat")
            st = stat_fields(text)
            pidns = procfs.readlink(f"{proc}/{name}/ns/pid")
        except (OSError, ValueError):
            continue
        if others.holds(int(name), int(st["starttime"]), pidns, int(st["sid"])):
            continue  # another launch's, side by side with this one (conformance/claims.py)
        comm = text[text.index("(") + 1 : text.rindex(")")]  # stat's second field (proc(5))
        if dead(name, st["state"], proc):
            if since is not None and st["ppid"] == me and int(st["starttime"]) >= since:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(int(name), os.WNOHANG)  # an orphan of the launch that died: reap it
            continue
        why = []
        later = until is not None and int(st["starttime"]) > until
        if (
            since is not None
            and st["ppid"] == me
            and int(st["starttime"]) >= since
            and not later  # a child of ours started since (another thread's) is not the launch's
            and int(name) != launcher_pgid
        ):
            why.append("an orphan of the launch (reparented to the harness)")
        private = task_pidns != host_namespaces.get("pid") and not task_pidns.startswith("error")
        if pidns == task_pidns and private and not later:
            why.append("in the task's pid namespace")
        if task_sid is not None and st["sid"] == task_sid and task_sid != harness_sid and not later:
            why.append("in the task's session")
        if st["pgid"] == launcher_pgid and not later:
            why.append("in the launcher's process group")
        if why:
            out.append({"pid": int(name), "comm": comm, "starttime": st["starttime"], "why": why})
    return out


def kill(procs: Sequence[Mapping[str, Any]], proc: Path = Path("/proc")) -> None:
    killed = []
    for p in procs:
        with contextlib.suppress(OSError, ValueError):
            if stat_fields(procfs.read_small(proc / str(p["pid"]) / "stat"))["starttime"] == p["starttime"]:
                kills.kill(p["pid"], signal.SIGKILL, "the observer: a leftover of the launch")
                killed.append(p)
    # Ours since it was reparented: reaped, but only one we killed (a pid whose start time differs is
    # another child of ours now, whose status is its Popen's), and within a bound (one in D state
    # dies only when its sleep ends; survivors() reaps it then, or our exit does).
    orphans = [p["pid"] for p in killed if any("orphan" in w for w in p["why"])]
    deadline = time.monotonic() + REAP_SECONDS
    while orphans:
        for pid in list(orphans):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    orphans.remove(pid)
            except ChildProcessError:
                orphans.remove(pid)
        if not orphans or time.monotonic() >= deadline:
            break
        time.sleep(0.01)


# ---- more than one look, and a release only the process looked at receives ---------------------------

# What must not change while the task runs: the namespaces it is in, what it may do (capability sets,
# NoNewPrivs, its seccomp mode), its mount table, root and working directory.
SNAPSHOT_STATUS = ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp")
# The unannounced looks: at random intervals in this range (seconds), from the launch on.
LOOK_EVERY = (0.005, 0.03)
# How long kill() waits to reap the orphans it killed.
REAP_SECONDS = 5.0
# How long a task that still runs may stay unreadable at the looks before that is a change (Watch._unread).
UNREAD_SECONDS = 1.0
# lifecycle: how long the task may take to go once its launcher is SIGKILLed.
LIFECYCLE_SECONDS = 5.0


def snapshot(pid: int, proc: Path = Path("/proc")) -> dict[str, Any] | None:
    """A cheap reading of what must stay the same, or None once the process is gone."""
    base = proc / str(pid)
    try:
        out: dict[str, Any] = {f"ns/{ns}": procfs.readlink(base / "ns" / ns) for ns in NAMESPACES}
        status = _status(_read(base / "status"))
        out.update({k: status.get(k) for k in SNAPSHOT_STATUS})
        table = mountinfo.parse(_read(base / "mountinfo"))
        out["mounts"] = sorted((m.mount_id, m.mount_point, m.read_only) for m in table)
        # The mount too: a bind of the same directory has its device and inode, but not its `..`
        # (a helper sharing the task's fs_struct, CLONE_FS, can move it to the host's own mount).
        out["root"] = (*_dev_ino(os.stat(base / "root")), _mount_of(base / "root"))
        out["cwd"] = (*_dev_ino(os.stat(base / "cwd")), _mount_of(base / "cwd"))
    except OSError:
        # Gone, or going: an exiting process's /proc files answer ENOENT, ESRCH or EINVAL. No reading
        # is no look, never a change (the look at the handshake itself must succeed, see `read`), unless
        # the task still runs long after (Watch._unread).
        return None
    return out


def differences(first: Mapping[str, Any], then: Mapping[str, Any]) -> list[str]:
    out = []
    for k in sorted(set(first) | set(then)):
        if first.get(k) != then.get(k):
            a, b = first.get(k), then.get(k)
            if k == "mounts" and isinstance(a, list) and isinstance(b, list):
                sa, sb = set(map(tuple, a)), set(map(tuple, b))
                a, b = sorted(sa - sb), sorted(sb - sa)  # only what went and what came
            out.append(f"{k}: {a} then {b}")
    return out


def sigqueue(pid: int, sig: int, value: int) -> None:
    """sigqueue(3): the signal carries `value` as si_value, which only its receiver reads."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.sigqueue.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]  # union sigval: one word
    if libc.sigqueue(pid, sig, ctypes.c_void_p(value)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class Watch:
    """The harness's side of the handshake, fed the launcher's stdout line by line (processes.children.run's
    on_line) and called once the launcher has exited (after_exit), before its group is killed.

    From the launch on (on_start), it also looks for the task by its tag at moments the launcher cannot
    know, and keeps looking until the task is gone: every look must match the one made at the
    handshake. The release is a sigqueue(3) carrying a number drawn then, which the document must
    echo: the process the host read is the one that wrote the document, not a decoy that carries the
    tag. With `lifecycle`, the task is never released: its launcher is SIGKILLed instead, and the task
    must be gone within LIFECYCLE_SECONDS."""

    def __init__(
        self,
        task_tag: str,
        launch_nonce: str,
        *,
        protected: Sequence[Protected],
        host_namespaces: Mapping[str, str],
        find_seconds: float = 2.0,
        asked: Reach | None = None,
        lifecycle: bool = False,
        claims: Claims | None = None,
        key: str = "main",
        kill_wait: float = 30.0,
    ) -> None:
        self.tag, self.nonce, self.protected = task_tag, launch_nonce, tuple(protected)
        self.asked, self.lifecycle = asked, lifecycle
        # Side by side with the session's other launch: what this one claims, and how long its clean-up
        # waits for the other's judgement (conformance/claims.py).
        self.claims, self.key, self.kill_wait = claims, key, kill_wait
        self.release_value = secrets.randbelow(1 << 30) + 1
        self.launcher_pid: int | None = None
        self.lifecycle_result: dict[str, Any] = {
            "killed": False,
            "why": "the task never announced the handshake",
        }
        # The unannounced looks (see _look): the pid they follow, the first reading, what differed.
        self.looks = 0
        self.changes: list[str] = []
        # What processes of the task's pid namespace other than the task's own came to hold after the
        # handshake that leads out (see _look_later), each once.
        self.held_late: list[dict[str, Any]] = []
        # Where the launcher's secret showed up after the handshake (see _look_later).
        self.secret_late: list[str] = []
        self._classified: dict[int, bool] = {}
        self._helpers: dict[int, int] = {}
        self._followed: int | None = None
        self._followed_start: int | None = None
        self._unread_since: float | None = None
        self._unread_told = False
        self._early: list[dict[str, Any]] = []
        self._reference: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._looker: threading.Thread | None = None
        self.host_namespaces, self.find_seconds = host_namespaces, find_seconds
        self.seen: Seen | None = None
        self.why_not: str = "the task never announced the handshake"
        self.survivors: list[dict[str, Any]] | None = None
        self.host_devices: frozenset[str] = frozenset()
        self.signalled = threading.Event()
        self._lifecycle_kill = threading.Event()  # the lifecycle promise's SIGKILL was sent
        become_subreaper()
        self.since = boot_ticks() - 1

    def on_start(self, pid: int) -> None:
        self.launcher_pid = pid
        if self.claims is not None:
            started = host_task(pid)
            if started is not None:
                self.claims.add(self.key, pids=[(pid, started)])
        if self.tag:
            self._looker = threading.Thread(target=self._look, name="sbxc-looks", daemon=True)
            self._looker.start()

    def _look(self) -> None:
        """Look at the task at random moments from its start until it is gone (or after_exit)."""
        rng = secrets.SystemRandom()
        while not self._stop.wait(rng.uniform(*LOOK_EVERY)):
            if self._followed is None:
                pids = find(self.tag)
                if len(pids) != 1:
                    continue
                self._followed = pids[0]
            snap = snapshot(self._followed)
            if snap is None:
                if self.signalled.is_set() and not self._unread(self._followed):
                    return  # gone after the handshake: the task is over
                continue
            if self._unread_since is not None and not self._unread_told:
                # Unreadable while it ran, and readable again: no exit goes that way (an exiting task
                # never comes back), so something hid it between looks. Short gaps, repeated, would
                # otherwise each stay under UNREAD_SECONDS.
                self._unread_told = True
                self.changes.append(f"the host could not read the task (pid {self._followed}) at a look "
                                    "while it ran, and could again after: nothing was compared then")
            self._unread_since = None
            self.looks += 1
            if not self.signalled.is_set():
                self._early.append(snap)
            elif self._reference is not None:
                self._compare(snap, "after the handshake")
                self._look_later()

    def _unread(self, pid: int) -> bool:
        """A look after the handshake could not read the task: whether it still runs (then the looks go
        on). One that still runs UNREAD_SECONDS after the first such look is a change: what the host
        cannot read it cannot compare (a cwd on a FUSE mount that answers EIO would otherwise end the
        looks for good). Not at once: an exiting task's cwd and root go before it is a zombie."""
        started = host_task(pid)
        if started is None or started != self._followed_start:
            return False
        now = time.monotonic()
        if self._unread_since is None:
            self._unread_since = now
        elif now - self._unread_since >= UNREAD_SECONDS and not self._unread_told:
            self._unread_told = True
            self.changes.append(f"the host could not read the task (pid {pid}) for {UNREAD_SECONDS:g}s while "
                                "it still ran: nothing was compared then")
        return True

    def _look_later(self) -> None:
        """The handshake judged every process then in the task's pid namespace, once. Here, at every later
        look: what the sandbox's own processes there (its init, its helpers) hold now, and what a process
        that entered the namespace since holds (what `runc exec` starts: runc CVE-2024-21626 gave one a
        host directory, as a descriptor or as its cwd). The task's own descendants are its trials."""
        seen, asked = self.seen, self.asked
        if seen is None or asked is None or not seen.reached or isinstance(seen.mounts, str) \
                or len(self.held_late) >= 20:
            return
        late = joined(seen, self.host_namespaces.get("pid", ""), self._classified)
        helpers = still(self._helpers)
        if not late and not helpers:
            return
        if asked.secret:
            # The handshake read every process then in the namespace for the secret; one that entered
            # since (`docker exec -e TOKEN=...`, `kubectl exec` from a daemon that holds the key) or a
            # helper that exec'd again (environ is what the last execve got) is read here. The task, of
            # the same uid, reads their /proc/PID/environ as the host does.
            # One the handshake already found, or an earlier look, is said once.
            told = {*seen.reached.get("secret_holders", []), *self.secret_late}
            self.secret_late += [c for c in secret_carriers([*helpers, *late], asked.secret) if c not in told]
        members = {*seen.reached.get("pids", []), *late}
        pids = [*helpers, *late]
        found = [*held(pids, seen.mounts, seen.namespaces, asked.devices, task=seen.pid, members=members),
                 *places_out(pids, seen.mounts)]
        known = {(d["pid"], d["fd"], d["link"])
                 for d in [*seen.reached.get("descriptors", []), *self.held_late]}
        entered = set(late)
        self.held_late += [
            {**d, "who": "entered the task's pid namespace after the handshake" if d["pid"] in entered
             else "the sandbox's own, there at the handshake"}
            for d in found if (d["pid"], d["fd"], d["link"]) not in known
        ][:20]

    def _compare(self, snap: Mapping[str, Any], when: str) -> None:
        assert self._reference is not None
        diff = differences(self._reference, snap)
        if diff and len(self.changes) < 20:
            self.changes.append(f"{when}: {'; '.join(diff)}")

    def on_line(self, line: str) -> None:
        if READY_KEY not in line or self.signalled.is_set():
            return
        try:
            ready = json.loads(line)
        except json.JSONDecodeError:
            return
        if not isinstance(ready, dict) or ready.get(READY_KEY) != self.nonce:
            self.why_not = f"a handshake line with another launch's nonce: {line.strip()[:120]}"
            return
        deadline = time.monotonic() + self.find_seconds
        pids = find(self.tag)
        while not pids and time.monotonic() < deadline:
            time.sleep(0.01)
            pids = find(self.tag)
        if len(pids) != 1:
            self.why_not = (
                f"no process on this host has the task's tag {self.tag!r}: the host cannot see the task"
                if not pids
                else f"{len(pids)} processes carry the task's tag {self.tag!r} (pids {pids}): ambiguous"
            )
            self.signalled.set()
            return
        host_mounts = mountinfo.parse(Path("/proc/self/mountinfo").read_text())
        # Every process now: what is in the task's pid namespace among them is read at the handshake,
        # and what comes later is looked for among the rest (_look_later).
        self._classified = {int(p): False for p in procfs.pids()}
        self.seen = read(
            pids[0],
            protected=self.protected,
            host_mounts=host_mounts,
            asked=self.asked,
            host_pidns=self.host_namespaces.get("pid", ""),
        )
        self.host_devices = mountinfo.devices(host_mounts)
        # Judged here: never "joined" later, even one born between the listing above and the read.
        self._classified.update(dict.fromkeys((self.seen.pid, *self.seen.reached.get("pids", [])), False))
        self._helpers = helpers(self.seen)
        self._claim_task(self.seen)
        self._reference = snapshot(pids[0])
        if self._followed is not None and self._followed != pids[0]:
            self.changes.append(f"the looks followed pid {self._followed}, the handshake found pid {pids[0]}")
        self._followed = pids[0]
        self._followed_start = host_task(pids[0])
        if self._reference is None:
            self.changes.append("the host could not read the task again right after its handshake look")
        else:
            for early in self._early:
                self._compare(early, "before the handshake")
        if self.lifecycle:
            self._kill_launcher(pids[0])
            self.signalled.set()
            return
        try:
            sigqueue(pids[0], signal.SIGUSR1, self.release_value)
        except OSError as e:
            self.why_not = f"could not release the task (pid {pids[0]}): {errname(e)}"
        self.signalled.set()

    def _kill_launcher(self, task: int) -> None:
        """lifecycle: SIGKILL the launcher alone (not its group: a task that dies only with the group
        would hide the bug), then wait for the task to go."""
        if self.launcher_pid is None:
            self.lifecycle_result = {"killed": False, "why": "the launcher's pid was never known"}
            return
        first = host_task(task)
        if self.claims is not None:
            # Orphaned by the kill, reparented to us: claimed first, so the main launch beside this one
            # does not take them for its own leftovers (and kill the task this promise waits to see go).
            self.claims.add(self.key, pids=descendants(self.launcher_pid))
        self._lifecycle_kill.set()
        kills.kill(self.launcher_pid, signal.SIGKILL, "the lifecycle promise: its launcher, at the handshake")
        start = time.monotonic()
        while time.monotonic() - start < LIFECYCLE_SECONDS:
            now = host_task(task)
            if now is None or first is None or now != first:
                self.lifecycle_result = {"killed": True, "gone_after": round(time.monotonic() - start, 3)}
                return
            time.sleep(0.01)
        self.lifecycle_result = {
            "killed": True,
            "gone_after": None,
            "why": f"the task (host pid {task}) still ran {LIFECYCLE_SECONDS:.0f}s after its launcher "
            "was SIGKILLed",
        }

    def stop_looking(self) -> None:
        self._stop.set()
        if self._looker is not None and self._looker is not threading.current_thread():
            self._looker.join(timeout=2)

    def after_exit(self, launcher_pgid: int) -> None:
        self.stop_looking()
        if self._lifecycle_kill.is_set():
            # The task has LIFECYCLE_SECONDS to go after its launcher's SIGKILL (_kill_launcher, in the
            # reader thread, times it); run() gives its readers only a second once the launcher is
            # gone. Judged before that time is up, a task still going would be a leftover, and killed
            # by us: the promise is judged first.
            self.signalled.wait(LIFECYCLE_SECONDS + 1)
        if self.seen is None:
            # Nothing of the task was found; the launcher's group is still checked.
            seen = Seen(0, {}, "error: not found", "error: not found", "error: not found", "", "error")
        else:
            seen = self.seen
        harness_sid = os.getsid(0)
        until = boot_ticks()  # the launcher has exited (survivors: what starts later is not ours)

        claims = self.claims

        def left_now() -> list[dict[str, Any]]:
            return survivors(
                seen,
                launcher_pgid,
                host_namespaces=self.host_namespaces,
                harness_sid=harness_sid,
                since=self.since,
                until=until,
                others=claims.others(self.key) if claims is not None else NONE,
            )

        left = left_now()
        deadline = time.monotonic() + SURVIVOR_GRACE
        while left and time.monotonic() < deadline:
            time.sleep(0.02)
            left = left_now()
        self.survivors = left
        if claims is not None:
            claims.judged(self.key)
            if left:
                # What this launch found may be the other's evidence too (an orphan no claim places):
                # killed once both have looked.
                claims.wait_judged(self.kill_wait)
        kill(left)

    def _claim_task(self, seen: Seen) -> None:
        """The task's pid namespace (where it is not the host's) and session (where it is not ours):
        whatever is in them is this launch's."""
        if self.claims is None:
            return
        pidns = seen.namespaces.get("pid", "")
        private = pidns and pidns != self.host_namespaces.get("pid") and not pidns.startswith("error")
        sid = seen.proc_stat.get("sid") if not isinstance(seen.proc_stat, str) else None
        self.claims.add(self.key, pidns=pidns if private else None,
                        sid=int(sid) if sid is not None and int(sid) != os.getsid(0) else None)
