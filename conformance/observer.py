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
import signal
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from probes import cancel, mountinfo
from probes.cgroupfs import own_cgroup
from probes.errnos import errname
from probes.finding import EMPTY

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
# How long a found task's process group may take to go after the launcher exits: a pid namespace is
# emptied asynchronously once its init dies (zap_pid_ns_processes, kernel/pid_namespace.c).
SURVIVOR_GRACE = 1.0


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
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"{proc}/{name}/comm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # exited meanwhile
        try:
            # comm is at most TASK_COMM_LEN (16) bytes with its newline: one read (proc(5)).
            comm = os.read(fd, 64).decode(errors="replace").rstrip("\n")
        except OSError:
            continue
        finally:
            os.close(fd)
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


def _status(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_KEYS:
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
    )


def _dev_ino(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


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
        except OSError:
            return False  # cannot tell: judged as reachable, never as a pass
        if st.st_uid == creds.fsuid:
            ok = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid == creds.fsgid or st.st_gid in creds.groups:
            ok = bool(st.st_mode & stat.S_IXGRP)
        else:
            ok = bool(st.st_mode & stat.S_IXOTH)
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
    proc: Path = Path("/proc"),
) -> list[dict[str, Any]]:
    """Processes still running that the launch started: in the task's pid namespace (when it is not
    the host's), in the task's session (when it is not the harness's), in the launcher's process
    group, or orphans reparented to us (see become_subreaper) that started at or after `since`.
    Zombies are dead: they only wait to be reaped."""
    task_pidns = seen.namespaces.get("pid", "")
    task_sid = seen.proc_stat.get("sid") if not isinstance(seen.proc_stat, str) else None
    me = os.getpid()
    # Ours, never the launch's: this process and its guardian (probes/cancel.py). The guardian is a
    # child of ours, so one started less than two clock ticks before a launch's `since` (a `run`'s
    # forked witness on a fast machine) would pass for an orphan of it: reported as a leftover of
    # the sandbox, and killed.
    guardian = cancel.guardian_pid()
    ours = {str(me)} if guardian is None else {str(me), str(guardian)}
    out = []
    for name in os.listdir(proc):
        if not name.isdigit() or name in ours:
            continue
        try:
            text = _read(f"{proc}/{name}/stat")
            st = stat_fields(text)
            pidns = os.readlink(f"{proc}/{name}/ns/pid")
        except (OSError, ValueError):
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]  # stat's second field (proc(5))
        if st["state"] in ("Z", "X"):
            if since is not None and st["ppid"] == me and int(st["starttime"]) >= since:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(int(name), os.WNOHANG)  # an orphan of the launch that died: reap it
            continue
        why = []
        if (
            since is not None
            and st["ppid"] == me
            and int(st["starttime"]) >= since
            and int(name) != launcher_pgid
        ):
            why.append("an orphan of the launch (reparented to the harness)")
        private = task_pidns != host_namespaces.get("pid") and not task_pidns.startswith("error")
        if pidns == task_pidns and private:
            why.append("in the task's pid namespace")
        if task_sid is not None and st["sid"] == task_sid and task_sid != harness_sid:
            why.append("in the task's session")
        if st["pgid"] == launcher_pgid:
            why.append("in the launcher's process group")
        if why:
            out.append({"pid": int(name), "comm": comm, "starttime": st["starttime"], "why": why})
    return out


def kill(procs: Sequence[Mapping[str, Any]], proc: Path = Path("/proc")) -> None:
    for p in procs:
        with contextlib.suppress(OSError, ValueError):
            if stat_fields(_read(proc / str(p["pid"]) / "stat"))["starttime"] == p["starttime"]:
                os.kill(p["pid"], signal.SIGKILL)
    for p in procs:
        if any("orphan" in w for w in p["why"]):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p["pid"], 0)  # ours since it was reparented: reap it


class Watch:
    """The harness's side of the handshake, fed the launcher's stdout line by line (probes.run.run's
    on_line) and called once the launcher has exited (after_exit), before its group is killed."""

    def __init__(
        self,
        task_tag: str,
        launch_nonce: str,
        *,
        protected: Sequence[Protected],
        host_namespaces: Mapping[str, str],
        find_seconds: float = 2.0,
    ) -> None:
        self.tag, self.nonce, self.protected = task_tag, launch_nonce, tuple(protected)
        self.host_namespaces, self.find_seconds = host_namespaces, find_seconds
        self.seen: Seen | None = None
        self.why_not: str = "the task never announced the handshake"
        self.survivors: list[dict[str, Any]] | None = None
        self.host_devices: frozenset[str] = frozenset()
        self.signalled = threading.Event()
        become_subreaper()
        self.since = boot_ticks() - 1

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
        self.seen = read(pids[0], protected=self.protected, host_mounts=host_mounts)
        self.host_devices = mountinfo.devices(host_mounts)
        try:
            os.kill(pids[0], signal.SIGUSR1)
        except OSError as e:
            self.why_not = f"could not release the task (pid {pids[0]}): {errname(e)}"
        self.signalled.set()

    def after_exit(self, launcher_pgid: int) -> None:
        if self.seen is None:
            # Nothing of the task was found; the launcher's group is still checked.
            seen = Seen(0, {}, "error: not found", "error: not found", "error: not found", "", "error")
        else:
            seen = self.seen
        harness_sid = os.getsid(0)

        def left_now() -> list[dict[str, Any]]:
            return survivors(
                seen,
                launcher_pgid,
                host_namespaces=self.host_namespaces,
                harness_sid=harness_sid,
                since=self.since,
            )

        left = left_now()
        deadline = time.monotonic() + SURVIVOR_GRACE
        while left and time.monotonic() < deadline:
            time.sleep(0.02)
            left = left_now()
        self.survivors = left
        kill(left)
