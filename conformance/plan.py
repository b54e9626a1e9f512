"""What a task must observe (the plan the witness program runs) and what it saw (`Task`).

The plan is derived from the profile and the host side of the layout: for a masked or read-only
directory the harness lists the HOST side first, so the task is asked about real host content
(a missing path is never a pass for a read-only or masked promise)."""

from __future__ import annotations

import base64
import contextlib
import importlib.machinery
import importlib.util
import ipaddress
import json
import marshal
import os
import socket
import stat
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from types import CodeType
from typing import Any, NamedTuple

from sandbox_conformance.conformance.observer import Seen
from sandbox_conformance.conformance.profile import NetworkMode, Profile, expand

PLANT = ".sbxc-plant-"  # a file the task tries to create where it must not
WRITE = ".sbxc-write-"  # a file the task creates where it may
MAX_HOST_ENTRIES = 3


class HostView(NamedTuple):
    """What the harness knows about the host, for comparison with what the task saw."""

    namespaces: Mapping[str, str]  # ns name -> "pid:[4026531836]"
    harness_pid: int
    harness_cmdline: tuple[str, ...]
    pid1_cmdline: tuple[str, ...]
    hostname: str
    tcp_targets: tuple[tuple[str, int], ...]
    abstract_name: str
    secret_key: str
    secret_value: str = ""
    cgroup: str = ""  # the harness's own cgroup v2 path (its /proc/self/cgroup `0::` line)
    # A listening unix socket the harness serves beside the layout, where no profile path leads (a
    # platform's daemon socket), and a file in the launcher's working directory holding the secret
    # (a platform's .env): a task must reach neither.
    unix_path: str = ""
    secret_file: str = ""
    # A System V shared memory segment the harness holds (its key), which a task with an ipc namespace
    # of its own cannot find; 0: none could be made.
    shm_key: int = 0
    # The process outside the sandbox the task must not ptrace (conformance/ptrace_target.py): the
    # task's user's, open to any tracer; the harness where none could be started.
    ptrace_pid: int = 0
    ptrace_cmdline: tuple[str, ...] = ()


class Plan(NamedTuple):
    """What one task must try and report, derived from the profile by `build` and handed to the witness
    program (conformance/inside.py) as the JSON first line of its text (`program`)."""

    task_id: str
    ops: tuple[Mapping[str, Any], ...]
    tcp: tuple[tuple[str, int], ...]
    unix_abstract: tuple[str, ...]
    nested_userns: bool
    # paths the harness must check (and clean) on the host after the launch
    host_checks: tuple[str, ...] = ()
    # The cgroup trials (see cgroup_trials), or None when the task gets no leaf.
    cgroup: Mapping[str, Any] | None = None
    # One launch, one document: a fresh nonce the document must echo, and the comm the task takes so
    # the host-side observer (conformance/observer.py) can find it. No tag: no handshake (the host
    # was declared unable to see the task).
    launch_nonce: str = ""
    tag: str | None = None
    handshake_seconds: float = 10.0
    # What the task tries through any proxy its environment offers (see proxy_plan), or None when the
    # profile makes no network promise.
    proxy: Mapping[str, Any] | None = None
    # What the task holds and reaches (see reach_plan), or None when the profile claims none of it.
    reach: Mapping[str, Any] | None = None
    # The terminal launch: the task tries to inject input into the terminal it inherited.
    terminal: bool = False
    # The other syscall doors (conformance/inside.py doors): the process outside to ptrace, or None when
    # the profile makes no syscalls promise.
    doors: Mapping[str, Any] | None = None
    shm_key: int = 0  # HostView.shm_key, where the profile promises a private ipc namespace
    # Host pids the task's process listing looks for whatever its length (the harness's: the pid
    # witness's evidence would otherwise depend on how many processes the host runs below it).
    look_for: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "task_id": self.task_id,
            "ops": [dict(o) for o in self.ops],
            "tcp": [list(t) for t in self.tcp],
            "unix_abstract": list(self.unix_abstract),
            "nested_userns": self.nested_userns,
            "cgroup": dict(self.cgroup) if self.cgroup is not None else None,
            "launch_nonce": self.launch_nonce,
            "tag": self.tag,
            "handshake_seconds": self.handshake_seconds,
            "proxy": dict(self.proxy) if self.proxy is not None else None,
            "reach": dict(self.reach) if self.reach is not None else None,
            "terminal": self.terminal,
            "doors": dict(self.doors) if self.doors is not None else None,
            "shm_key": self.shm_key,
            "look_for": list(self.look_for),
        }


def _host_files(path: str, owner: int | None = None) -> list[str]:
    """Up to MAX_HOST_ENTRIES regular files directly in `path` on the host, sorted; only those owned
    by `owner` when given."""
    try:
        with os.scandir(path) as it:
            names = sorted(
                e.name
                for e in it
                if e.is_file(follow_symlinks=False)
                # Not another run's plant (a concurrent control may have one in /usr for a moment).
                and not e.name.startswith((PLANT, WRITE))
                and (owner is None or e.stat(follow_symlinks=False).st_uid == owner)
            )
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []
    return names[:MAX_HOST_ENTRIES]


def _world_readable(path: str) -> bool:
    try:
        return bool(os.stat(path).st_mode & stat.S_IROTH)
    except OSError:
        return False


# The allocation past memory.max: enough that no slack (kernel rounding to pages, the memcg charge
# batch of 64 pages per cpu, mm/memcontrol.c MEMCG_CHARGE_BATCH) can absorb it.
MEMORY_PAST = 64 << 20
# pids.max above this is not exhausted from inside a witness (each fork costs ~40x more under the VM
# mode's TCG emulation): the pids witness says so instead of forking for minutes.
PIDS_TRIAL_CAP = 4096
# How long the witness program holds its process tree for the harness's cgroup.kill; the harness
# kills within milliseconds of the marker (its poll is 20 ms), so this only bounds a task the kill
# cannot reach (one that is not in its leaf), at the cost of that long a launch.
HOLD_SECONDS = 5
TREE_MARKER = ".sbxc-tree-"


def cgroup_trials(
    profile: Profile, values: Mapping[str, str], nonce: str, neighbour: str | None
) -> dict[str, Any]:
    """What the witness program tries against its leaf. Sized from the PROFILE's limits, not from
    what the leaf holds: the promise is the profile's, and a launcher that wrote no limit must meet the
    same trial (and fail it). `neighbour`: a sibling leaf's directory the task must not write to."""
    lim = profile.limits
    pids = lim.pids_max
    return {
        "memory_alloc": lim.memory_max + MEMORY_PAST if lim.memory_max is not None else None,
        # Enough forks to pass the limit even if the launcher itself holds none of the leaf's pids.
        "pids_forks": pids + 16 if pids is not None and pids <= PIDS_TRIAL_CAP else None,
        "neighbour_writes": [
            {"path": f"{neighbour}/cgroup.procs", "data": "0"},  # "0": the writer itself (cgroup-v2.rst)
            {"path": f"{neighbour}/memory.max", "data": "max"},
        ]
        if neighbour
        else [],
        "tree_marker": f"{values['workdir']}/{TREE_MARKER}{nonce}",
        "hold_seconds": HOLD_SECONDS,
    }


# How deep, and how many directories, the read-only witnesses try to write beneath a read-only path:
# a read-write bind of a subdirectory under a read-only one is the mistake a write at the top misses.
DEPTH_DIRS, DEPTH = 8, 5


def _below(path: str, skip: tuple[str, ...]) -> list[str]:
    """Up to DEPTH_DIRS real directories beneath `path` on the host, breadth first, leaving out those
    at or under `skip` (paths with promises of their own: writable, masked, absent)."""
    found: list[str] = []
    level = [path]
    for _ in range(DEPTH):
        nxt = []
        for d in level:
            try:
                with os.scandir(d) as it:
                    subs = sorted(e.path for e in it if e.is_dir(follow_symlinks=False))
            except OSError:
                continue
            for sub in subs:
                if any(sub == s or sub.startswith(s.rstrip("/") + "/") for s in skip):
                    continue
                nxt.append(sub)
        found += nxt
        if len(found) >= DEPTH_DIRS:
            break
        level = nxt
    # Spread over the depths: the deepest directories are where a stray bind would sit.
    return sorted(found, key=lambda p: (-p.count("/"), p))[:DEPTH_DIRS]


class _Ops:
    """The task's file operations, gathered in three phases (look, then try to write, then try to
    remove), each op once, and the host paths to check after the task for what it left."""

    def __init__(self, nonce: str) -> None:
        self.nonce = nonce
        self.look: list[dict[str, Any]] = []
        self.write: list[dict[str, Any]] = []
        self.remove: list[dict[str, Any]] = []
        self.checks: list[str] = []

    def add(self, kind: str, path: str, phase: list[dict[str, Any]], **extra: Any) -> None:
        op = {"op": kind, "path": path, **extra}
        if op not in phase:
            phase.append(op)

    def plant(self, directory: str, prefix: str = "", **extra: Any) -> None:
        """A file the task tries to leave in `directory`; the host looks for it afterwards."""
        path = f"{directory}/{prefix or PLANT}{self.nonce}"
        self.add("create", path, self.write, data=self.nonce, **extra)
        self.checks.append(path)

    def looked_at(self, path: str) -> None:
        self.add("stat", path, self.look)
        self.add("list", path, self.look)

    def all(self) -> tuple[dict[str, Any], ...]:
        return tuple(self.look + self.write + self.remove)


def build(
    profile: Profile,
    values: Mapping[str, str],
    nonce: str,
    host: HostView,
    task_uid: int | None = None,
    cgroup: Mapping[str, Any] | None = None,
    *,
    launch_nonce: str = "",
    tag: str | None = None,
    handshake_seconds: float = 10.0,
) -> Plan:
    """Ops in three phases (look, then try to write, then try to remove), so a broken sandbox that
    lets a write through cannot change what a later look sees."""
    fs, task = profile.filesystem, profile.task
    ops = _Ops(nonce)

    def each(templates: tuple[str, ...]) -> list[str]:
        return [expand(x, values) for x in templates]

    for p in each(fs.masked):
        ops.looked_at(p)
        for name in _host_files(p):
            ops.add("read", f"{p}/{name}", ops.look)
        ops.plant(p)
    _read_only_ops(ops, profile, values, task_uid)
    for p in each(fs.writable):
        ops.plant(p, WRITE)
    for p in each(fs.absent):
        ops.looked_at(p)
    if task.control is not None:
        _control_ops(ops, expand(task.control, values), task.control_files)
    for p in each(fs.hidden):
        # What the host holds there, read from inside (its content must not come back), and a file
        # the task tries to leave there (it must not reach the host, whatever the task was told).
        ops.looked_at(p)
        for f in hidden_files(p):
            if not any(o["op"] == "read" and o["path"] == f for o in ops.look):  # one read per path
                ops.add("read", f, ops.look)
        ops.plant(p)
    if task.user_tmp is not None:
        ops.plant(expand(task.user_tmp, values), WRITE)
    net = profile.network in (NetworkMode.none, NetworkMode.proxy)
    return Plan(
        task_id=values.get("task_id", "task"),
        ops=ops.all(),
        tcp=host.tcp_targets if net else (),
        unix_abstract=(host.abstract_name,) if net else (),
        nested_userns=profile.nested_userns.value == "refused",
        host_checks=tuple(ops.checks),
        cgroup=cgroup,
        launch_nonce=launch_nonce,
        tag=tag,
        handshake_seconds=handshake_seconds,
        proxy=proxy_plan(profile, values, host, launch_nonce) if net else None,
        reach=reach_plan(profile, host, values),
        # The process outside that the task must not ptrace: the session's target, else the harness.
        doors={"ptrace_pid": host.ptrace_pid or host.harness_pid,
               "ptrace_cmdline": list(host.ptrace_cmdline if host.ptrace_pid else host.harness_cmdline)}
        if "syscalls" in profile.promises()
        else None,
        shm_key=host.shm_key if "ipc" in profile.promises() else 0,
        look_for=(host.harness_pid,),
    )


def _read_only_ops(ops: _Ops, profile: Profile, values: Mapping[str, str], task_uid: int | None) -> None:
    """Each read-only path: looked at, a file planted in it and in every directory below it that no
    other promise owns, one world-readable file read, and one file opened for append."""
    fs, task = profile.filesystem, profile.task
    own_promises = tuple(
        expand(x, values)
        for x in (*fs.writable, *fs.masked, *fs.absent, *fs.hidden, task.workdir, task.user_tmp, task.control)
        if x is not None
    )
    for template, p in ((x, expand(x, values)) for x in fs.read_only):
        ops.add("stat", p, ops.look)
        if os.path.isdir(p):
            ops.add("list", p, ops.look)
            files = [f"{p}/{n}" for n in _host_files(p)]
            for d in [p, *_below(p, tuple(o for o in own_promises if o != p))]:
                if d != p:
                    ops.add("stat", d, ops.look)  # a directory hidden inside refuses with ENOENT: say so
                ops.plant(d, read_only=template)
        else:
            files = [p] if os.path.exists(p) else []
        # The read shows the host's content inside: only a file anyone may read (mode o+r), so the
        # answer depends on the sandbox and never on who the task runs as (a 0600 root file such as
        # /etc/.pwd.lock refuses an unprivileged task with EACCES whatever the sandbox does).
        for f in [f for f in files if _world_readable(f)][:1]:
            ops.add("read", f, ops.look)
        for f in files[:1]:
            # Zero bytes: the refusal is at open(O_WRONLY|O_APPEND); a broken sandbox must not be able
            # to make us damage a real host file. A file the task's user does not own is tried too:
            # file modes may answer first there (EACCES), which the witness accepts for that file only.
            owned = task_uid is None or os.stat(f).st_uid == task_uid
            ops.add("append", f, ops.write, data="", read_only=template, owned=owned)


def _control_ops(ops: _Ops, control: str, files: tuple[str, ...]) -> None:
    """The task's control directory: what the host seeded there is read (and must read the same),
    appended to and removed (both must be refused), and a file planted."""
    ops.looked_at(control)
    for name in files:
        # What the host seeded, read now: the task may be able to remove it (a broken sandbox).
        try:
            seeded: str | None = Path(f"{control}/{name}").read_text(errors="replace")[:4096]
        except OSError:
            seeded = None
        ops.add("read", f"{control}/{name}", ops.look, expect=seeded)
        ops.add("append", f"{control}/{name}", ops.write, data=f"appended {ops.nonce}\n")
        ops.add("unlink", f"{control}/{name}", ops.remove)
    ops.plant(control)


# ---- what the task holds and reaches --------------------------------------------------------------------

# Host-wide kernel settings a task must not be able to open for writing. core_pattern and modprobe name a
# program the kernel runs as root on the host, uevent_helper too (the classic container escapes); the
# others only tune the host, and show a sysctl tree the task can write at all.
KERNEL_INTERFACES = (
    "/proc/sys/kernel/core_pattern",
    "/proc/sys/kernel/modprobe",
    "/proc/sys/kernel/printk_ratelimit",
    "/proc/sys/vm/overcommit_ratio",
    "/proc/sysrq-trigger",
    "/sys/kernel/uevent_helper",
    "/sys/kernel/mm/transparent_hugepage/enabled",
)
# Where opening for writing succeeded, the value the file holds is written back to prove the write lands:
# only here, where the same value changes nothing.
WRITE_BACK = ("/proc/sys/kernel/printk_ratelimit",)
# The device nodes every task may open, by path and device number (Documentation/admin-guide/devices.txt):
# the ones bwrap's --dev, a container's /dev and systemd's PrivateDevices= all give. /dev/pts/N (136-143)
# is allowed by its major, in the witness program.
DEVICES = {
    "/dev/null": "1:3",
    "/dev/zero": "1:5",
    "/dev/full": "1:7",
    "/dev/random": "1:8",
    "/dev/urandom": "1:9",
    "/dev/tty": "5:0",
    "/dev/ptmx": "5:2",
    "/dev/pts/ptmx": "5:2",
}
# Where services keep their sockets, searched from inside for any the task can connect to.
SOCKET_ROOTS = ("/run", "/var/run", "/tmp", "/var/tmp", "/dev/shm", "/home", "/root", "/srv", "/mnt")


def mask(data: bytes) -> tuple[str, str]:
    """(masked, key) in hex: `data` XORed with a one-time key. Never in clear: the program may be written
    to a file the task can read (a launcher that stages it), where the task's own search would find it
    in its own plan (conformance/inside.py unmask)."""
    key = os.urandom(len(data))
    return bytes(a ^ b for a, b in zip(data, key, strict=True)).hex(), key.hex()


CANARY_MARK = b"SBXC-CANARY"  # conformance/layout.py: every canary carries it and this run's nonce


def canaries(paths: Sequence[str]) -> list[dict[str, Any]]:
    """The host files under each protected path (hidden_files), for the task's search by content and
    by (device, inode) under every other name (conformance/inside.py alias_scan). Only this run's
    canaries are searched by content: another file's bytes may well be anywhere."""
    out = []
    for top in paths:
        for f in hidden_files(top):
            with contextlib.suppress(OSError):
                st = os.stat(f)
                with open(f, "rb") as fh:
                    data = fh.read(4096)
                masked, key = mask(data if CANARY_MARK in data else b"")
                out.append({"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "masked": masked,
                            "key": key})
    return out


def reach_plan(
    profile: Profile, host: HostView, values: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    made = set(profile.promises())
    if not made & {"descriptors", "secrets", "kernel_interfaces", "devices", "host_sockets"}:
        return None
    secret = (host.secret_value if "secrets" in made else "").encode()
    secret_masked, key = mask(secret)
    fs = profile.filesystem
    protected = [expand(p, values) for p in (*fs.masked, *fs.absent)] if values and "aliases" in made else []
    return {
        "canaries": canaries(protected),
        "protected": protected,
        "secret_key": key,
        "secret_masked": secret_masked,
        "secret_paths": [host.secret_file] if host.secret_file else [],
        "kernel_paths": list(KERNEL_INTERFACES) if "kernel_interfaces" in made else [],
        "write_back": list(WRITE_BACK),
        "devices_allowed": {**DEVICES, **{p: "*" for p in profile.devices_allowed}},
        "unix_paths": [host.unix_path] if host.unix_path and "host_sockets" in made else [],
        "socket_roots": list(SOCKET_ROOTS) if "host_sockets" in made else [],
    }


def hidden_files(path: str, limit: int = MAX_HOST_ENTRIES) -> list[str]:
    """Up to `limit` regular files at or beneath `path` on the host, shallowest first: a hidden tree
    may hold its content only deep down (another user's tree: users/bob/tasks/.../control/...)."""
    found: list[str] = []
    level = [path]
    for _ in range(DEPTH):
        nxt: list[str] = []
        for d in level:
            try:
                with os.scandir(d) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError:
                continue
            for e in entries:
                if e.name.startswith((PLANT, WRITE)):
                    continue
                if e.is_file(follow_symlinks=False):
                    found.append(e.path)
                elif e.is_dir(follow_symlinks=False):
                    nxt.append(e.path)
        if len(found) >= limit or not nxt:
            break
        level = nxt
    return found[:limit]


# ---- the network through a proxy ------------------------------------------------------------------
#
# A sandbox may give its task a network that only reaches out through a proxy it runs (srt: an HTTP
# proxy on the host, relayed into the task's network namespace and named in HTTPS_PROXY and its
# kin). The task finds every proxy its environment names and asks each one, with CONNECT, for the
# targets below. For `none` a proxy the task can reach at all is a way out. For `proxy` the names
# in [network] allowed must come back through it and nothing else may: the suite serves each
# allowed name itself, on an echo listener of its own, so "reachable" is proved end to end (the
# launch nonce sent through the tunnel comes back) and needs no outside network.

NETWORK_FILE = "network.json"  # next to the task spec: what an adapter needs to allow a served name
ECHO_PREFIX = b"SBXC-ECHO "
ECHO_BYTES = 256


class _Echo:
    """A TCP listener on every local address that sends back what it reads, prefixed. One per
    harness process (daemon threads), made on first use: a proxy the sandbox runs must dial it."""

    _lock = threading.Lock()
    _port: int | None = None

    @classmethod
    def port(cls) -> int:
        with cls._lock:
            if cls._port is None:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("0.0.0.0", 0))
                sock.listen(16)
                cls._port = sock.getsockname()[1]
                threading.Thread(target=cls._serve, args=(sock,), name="sbxc-echo", daemon=True).start()
            return cls._port

    @staticmethod
    def _serve(sock: socket.socket) -> None:
        while True:
            conn, _ = sock.accept()
            threading.Thread(target=_Echo._answer, args=(conn,), daemon=True).start()

    @staticmethod
    def _answer(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(10)
            data = conn.recv(ECHO_BYTES)
            conn.sendall(ECHO_PREFIX + data)


def _local_addresses() -> set[str]:
    """Every IPv4 address of this host's interfaces, loopback included."""
    import psutil

    return {
        a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET
    }


def _served_at(name: str, local: set[str]) -> tuple[str | None, str]:
    """The local address `name` resolves to on this host (where the echo listener answers), or
    (None, why not). Only a name that resolves here can be served: the suite uses no outside network."""
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as e:
        return None, f"{name} does not resolve on this host ({e.strerror})"
    addrs = [str(i[4][0]) for i in infos]
    for a in addrs:
        if ipaddress.ip_address(a).is_loopback or a in local:
            return a, ""
    return None, f"{name} resolves to {', '.join(addrs)}, no address of this host: the suite cannot serve it"


def proxy_plan(
    profile: Profile, values: Mapping[str, str], host: HostView, launch_nonce: str
) -> dict[str, Any]:
    """What the task tries through each proxy it is offered (none is the usual case), and, for a
    `proxy` profile, the names the suite serves, written to NETWORK_FILE next to the task spec."""
    listener = host.tcp_targets[0][1] if host.tcp_targets else 0
    targets: list[dict[str, Any]] = []

    def target(name: str, port: int, kind: str, *, echo: bool) -> None:
        targets.append({"host": name, "port": port, "kind": kind, "echo": echo})

    hostname = socket.gethostname()
    served: list[dict[str, Any]] = []
    unserved: dict[str, str] = {}
    if profile.network is NetworkMode.proxy:
        echo = _Echo.port()
        local = _local_addresses()
        for name in profile.network_allowed:
            address, why = _served_at(name, local)
            if address is None:
                unserved[name] = why
                continue
            served.append({"name": name, "address": address, "port": echo})
            target(name, echo, "listed", echo=True)
        # An unlisted name that does lead to the echo listener: a proxy that lets it through is seen
        # doing so (a name that resolves nowhere would be refused by any proxy, and prove nothing).
        if hostname not in profile.network_allowed and _served_at(hostname, local)[0] is not None:
            target(hostname, echo, "unlisted", echo=True)
        for addr in sorted(a for a in local if not ipaddress.ip_address(a).is_loopback):
            target(addr, echo, "host", echo=True)
        write_network_file(
            values, {"mode": "proxy", "allowed": list(profile.network_allowed), "served": served}
        )
    else:
        # No name is allowed: the one name every host resolves, at the host's own listener.
        target("localhost", listener, "unlisted", echo=False)
    for addr, port in host.tcp_targets:
        target(addr, port, "loopback" if ipaddress.ip_address(addr).is_loopback else "host", echo=False)
    return {
        "mode": str(profile.network),
        "targets": targets,
        # The served names, dialled directly: only the proxy may reach them.
        "direct": [{"host": s["name"], "port": s["port"]} for s in served],
        "nonce": launch_nonce,
        "unserved": unserved,
    }


def write_network_file(values: Mapping[str, str], doc: Mapping[str, Any]) -> None:
    """NETWORK_FILE in the layout's root, beside the task spec (conformance/layout.py: ROOT/state)."""
    path = Path(values["state"]).parent / NETWORK_FILE
    path.write_text(json.dumps(doc, indent=2, sort_keys=True))
    path.chmod(0o644)


def program(plan: Plan) -> str:
    """The witness program's text: the plan as its first line, then conformance/inside.py. The plan is
    compressed and base64-encoded: what the program will look at is not a list of paths, ports and
    tags for a launcher to grep (it can still decode it: docs/threat-model.md)."""
    return f"{_plan_line(plan.to_json())}\n{_body()}"


# The body ships conformance/inside.py twice, both compressed: compiled (marshal) and as source. A
# task interpreter with our bytecode's magic number (the reference sandbox binds the host's /usr, so
# its python3 is ours) runs the compiled form; any other (an image's older Python) compiles the source.
# Compiling the 56 KB source is ~12 ms of CPU per launch, three launches a run (bench/README.md,
# session 12); unmarshalling it is 0.2 ms. The magic number is what CPython itself compares before it
# trusts a .pyc (importlib._bootstrap_external._classify_pyc): marshal's format is one per magic.
_LOADER = """import base64 as _b, marshal as _m, sys as _s, zlib as _z
_c = "{code}"
_t = "{source}"
def _code():
    _e = _s.modules.get("_frozen_importlib_external")
    if _e is not None and getattr(_e, "MAGIC_NUMBER", None) == _b.b64decode("{magic}"):
        try:
            return _m.loads(_z.decompress(_b.b64decode(_c)))
        except (EOFError, ValueError, TypeError):
            pass
    return compile(_z.decompress(_b.b64decode(_t)).decode(), "<stdin>", "exec", dont_inherit=True)
exec(_code())
"""


_packed: list[str] = []  # the body, packed once per process (conformance/harness.py launches in threads)
_packing = threading.Lock()


def prepare() -> None:
    """Pack the program's body now (once per process), before the first launch needs it."""
    _body()


def _body() -> str:
    with _packing:
        if not _packed:
            path = resources.files("sandbox_conformance.conformance").joinpath("inside.py")
            source = path.read_text()
            code = None
            with contextlib.suppress(OSError, TypeError, ValueError, EOFError, ImportError):
                # The interpreter's own bytecode cache: __pycache__/inside.*.pyc, checked against
                # the source's mtime and size as any import is, and written if missing (pip compiles
                # it at install). Only a file on disk has one; anything else is compiled here.
                code = importlib.machinery.SourceFileLoader("inside", str(path)).get_code("inside")
            _packed.append(_pack(source, code))
        return _packed[0]


def _pack(source: str, code: CodeType | None = None) -> str:
    if code is None:
        code = compile(source, "<stdin>", "exec", dont_inherit=True)

    def b64(data: bytes) -> str:
        # Level 1: 2 ms where 9 takes 20, for a body 10% bigger (a pipe's worth either way).
        return base64.b64encode(zlib.compress(data, 1)).decode()

    return _LOADER.format(code=b64(marshal.dumps(code)), source=b64(source.encode()),
                          magic=base64.b64encode(importlib.util.MAGIC_NUMBER).decode())


def source_of(program_text: str) -> str:
    """inside.py's source back from a program (the negative controls that rewrite the program)."""
    blob = program_text.split('\n_t = "', 1)[1].split('"', 1)[0]
    return zlib.decompress(base64.b64decode(blob)).decode()


def with_source(program_text: str, source: str) -> str:
    """The program with another body (a control's rewritten inside.py), its plan line kept."""
    return f"{program_text.partition(chr(10))[0]}\n{_pack(source)}"


def _plan_line(doc: Mapping[str, Any]) -> str:
    blob = base64.b64encode(zlib.compress(json.dumps(dict(doc)).encode())).decode()
    return f'PLAN = __import__("zlib").decompress(__import__("base64").b64decode("{blob}")).decode()'


def plan_of(program_text: str) -> dict[str, Any]:
    """The plan back from a program's first line (the negative controls that rewrite the program)."""
    first = program_text.partition("\n")[0]
    blob = first.split('b64decode("', 1)[1].split('"', 1)[0]
    got: dict[str, Any] = json.loads(zlib.decompress(base64.b64decode(blob)))
    return got


def with_plan(program_text: str, plan: Mapping[str, Any]) -> str:
    return f"{_plan_line(plan)}\n{program_text.partition(chr(10))[2]}"


def write_script(path: str, text: str) -> None:
    """The program as a script the task can read (0644), written anew."""
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o644)


class Task(NamedTuple):
    """One live task's observations, plus what the harness saw on the host around it."""

    doc: Mapping[str, Any]
    plan: Plan
    values: Mapping[str, str]
    host: HostView
    host_after: Mapping[str, str | None]  # host_checks path -> its content after the launch, or None
    launcher: str
    argv: Sequence[str] = ()
    # The task's cgroup leaf as the host saw it after the launch (cgroup_leaf.summary: path,
    # memory_events, pids_events, oom_kill, cgroup_path), or None when no usable root exists.
    cgroup: Mapping[str, Any] | None = None
    # The host-side observer (conformance/observer.py): the task's process as the host's kernel showed
    # it while the task waited, or None with `unobserved` saying why; what the launch left running.
    seen: Seen | None = None
    unobserved: str | None = None
    unseen: str | None = None
    survivors: tuple[Mapping[str, Any], ...] = ()
    host_devices: frozenset[str] = frozenset()
    # Connections made to the planted daemon socket during the launch, and files under the task's
    # writable directories holding the launcher's secret after it.
    knocks: int = 0
    secret_files: tuple[str, ...] = ()
    # What differed between the host's looks at the task (conformance/observer.py Watch), and how many
    # unannounced looks it made.
    changes: tuple[str, ...] = ()
    looks: int = 0
    # What processes of the task's pid namespace other than the task's own (the sandbox's helpers, and
    # any that entered it) came to hold after the handshake that leads out of it
    # (observer.Watch._look_later): descriptors, a cwd or root outside.
    held_late: tuple[Mapping[str, Any], ...] = ()
    # Where the launcher's secret showed up after the handshake: a process that entered the task's pid
    # namespace since, or a helper there, carrying it in its environment or argv (observer.Watch).
    secret_late: tuple[str, ...] = ()

    def result(self, op: str, path: str) -> Mapping[str, Any]:
        # By index, not a scan of the ops: every witness asks for a few, and a profile of 2,000
        # read-only paths makes ~20,000 ops for ~6,000 witnesses (issue 28).
        found = _index(self.doc, "ops", lambda o: (o.get("op"), o.get("path")), first=True).get((op, path))
        if found is None:
            raise KeyError(f"the plan made no {op} of {path}")
        result: Mapping[str, Any] = found.get("result", {})
        return result

    def observed(self, op: str, path: str) -> str:
        """'ok', an errno name ('EROFS'), or 'error: ...' when the observation itself raised."""
        r = self.result(op, path)
        if "error" in r:
            return f"error: {r['error']}"
        return "ok" if r.get("ok") else str(r.get("errno"))

    def value(self, op: str, path: str) -> Any:
        return self.result(op, path).get("value")

    def mount_at(self, path: str) -> Mapping[str, Any] | None:
        """The mountinfo entry visible at `path` (the last one mounted there shadows the others)."""
        if not isinstance(self.doc.get("mountinfo"), list):
            return None
        return _index(self.doc, "mountinfo", lambda e: e.get("mount_point"), first=False).get(path)

    def get(self, key: str) -> Any:
        return self.doc.get(key)


# (document, key) -> its list's entries by `by`: for the last few documents, known by identity (a
# Task's document is one dict, read by every witness of the run).
_INDEXES: list[tuple[Mapping[str, Any], str, dict[Any, Mapping[str, Any]]]] = []


def _index(doc: Mapping[str, Any], key: str, by: Callable[[Mapping[str, Any]], Any], *,
           first: bool) -> dict[Any, Mapping[str, Any]]:
    """doc[key]'s entries (dicts) by by(entry): the first of equal keys, or the last (first=False)."""
    for d, k, index in _INDEXES:
        if d is doc and k == key:
            return index
    index = {}
    entries = doc.get(key)
    for e in entries if isinstance(entries, list) else ():
        if not isinstance(e, Mapping):
            continue
        with contextlib.suppress(TypeError):  # a value no key can be (a list: a forged document)
            k = by(e)
            if not first or k not in index:
                index[k] = e
    _INDEXES.insert(0, (doc, key, index))
    del _INDEXES[8:]
    return index


def files_holding(needle: str, roots: Sequence[str], limit: int = 500) -> list[str]:
    """Regular files at or beneath `roots` on the host (at most `limit` looked at, each up to 256 KiB)
    whose bytes hold `needle`."""
    found: list[str] = []
    looked, level = 0, list(roots)
    data = needle.encode()
    for _ in range(DEPTH):
        nxt = []
        for d in level:
            try:
                with os.scandir(d) as it:
                    entries = list(it)
            except OSError:
                continue
            for e in entries:
                looked += 1
                if looked > limit:
                    return found
                if e.is_dir(follow_symlinks=False):
                    nxt.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError), open(e.path, "rb") as f:
                        if data in f.read(1 << 18):
                            found.append(e.path)
        level = nxt
    return found


def host_after(paths: Sequence[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for p in paths:
        try:
            out[p] = Path(p).read_text(errors="replace")
        except (FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError):
            out[p] = None
    return out
