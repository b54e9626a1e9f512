"""A profile: what a sandbox promises a task, read from TOML and validated key by key.

A bad profile is an input error (exit 2) with ONE line naming the file, the key and what was
expected. Unknown sections and keys are errors too: a typo such as `[netwrok]` must not silently
drop a promise, because a promise not made is a promise not tested."""

from __future__ import annotations

import enum
import errno as errno_mod
import os
import posixpath
import re
import string
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

from sandbox_conformance.probes.finding import EMPTY
from sandbox_conformance.processes import inputs

# The placeholders a profile path (and an external launcher prefix) may use; conformance/layout.py
# gives each one a value.
PLACEHOLDERS = (
    "state",
    "user",
    "task_id",
    "control",
    "workdir",
    "user_tmp",
    "neighbour_control",
    "other_user",
)
REFERENCE_NAME = "reference"
# The promises every profile makes without writing them down: what the task holds (descriptors) and
# reaches (the launcher's secret anywhere, the host's kernel settings, device nodes, host unix sockets).
# A sandbox that does not keep one says so, with the measured reason, in [promises] not_claimed.
DEFAULT_PROMISES = (
    "descriptors", "secrets", "kernel_interfaces", "devices", "host_sockets", "lifecycle", "terminal",
    "syscalls",
)
# [syscalls]: each door the witness program tries (conformance/inside.py doors) and how it must answer:
# "refused" (any errno), a list of the errnos it may fail with, or "allowed" (tried and reported, no
# promise). A door the profile does not name keeps its default (Profile.doors): a ptrace of a process
# outside is refused by every sandbox; the new mount API by every one that drops capabilities (it
# needs CAP_SYS_ADMIN over the task's mount namespace: fs/fsopen.c, fs/namespace.c may_mount), so it is
# promised wherever [process] capabilities is; io_uring, keyctl, AF_VSOCK and TIOCLINUX are closed only
# by a seccomp filter (docker's, systemd's), which a profile claims by naming the errno.
MOUNT_API_DOORS = ("fsopen", "open_tree", "move_mount")
SYSCALL_DOORS = (*MOUNT_API_DOORS, "ptrace_outside", "io_uring_setup", "keyctl", "vsock_socket", "tioclinux")


class InvalidProfile(Exception):
    """One line: `FILE: KEY: expected WHAT (got ...)`."""

    def __init__(self, file: str, key: str, expected: str) -> None:
        self.file, self.key, self.expected = file, key, expected
        super().__init__(f"{file}: {key}: expected {expected}")


class NetworkMode(enum.StrEnum):
    # No way out: no interface but lo (or no socket at all: a seccomp filter that refuses socket(2)
    # with EPERM is stronger, and counts), nothing of the host reachable, and no proxy offered. A
    # sandbox that lets anything out through a proxy keeps `proxy`, never `none`.
    none = enum.auto()
    host = enum.auto()  # no promise made
    # Out only through the proxy the sandbox offers the task (its *_proxy environment variables):
    # direct connects fail, the host's listeners stay unreachable, and through the proxy a name in
    # [network] allowed is reachable while other names, loopback and the host's addresses are not.
    proxy = enum.auto()


class Nested(enum.StrEnum):
    refused = enum.auto()
    allowed = enum.auto()  # no promise made


class Sharing(enum.StrEnum):
    private = enum.auto()
    shared = enum.auto()  # no promise made


class Caps(enum.StrEnum):
    none = enum.auto()  # every set empty, the bounding set too
    any = enum.auto()  # no promise made
    # CapPrm, CapEff and CapAmb empty: the task can use no capability now and gains none at execve
    # (P'(permitted) needs the file's capabilities, and no_new_privs ignores those); the bounding
    # set is not promised (capabilities(7)). What an unprivileged caller of a user-namespace sandbox
    # gets: bwrap drops every capability of a non-root task but leaves the bounding set full.
    none_effective = enum.auto()


class WriteSurface(enum.StrEnum):
    # Every read-write mount that reaches host storage is a declared writable path (or scratch).
    declared = enum.auto()
    any = enum.auto()  # no promise made: the sandbox confines no filesystem (unshare(1))


# How a write under a read-only or masked path must be refused, unless the profile says otherwise: a
# read-only mount answers EROFS before any other check (fs/namei.c, mnt_want_write).
STRICT_REFUSAL = ("EROFS",)


class Filesystem(NamedTuple):
    """[filesystem]: what the task may read, write or see of each listed path, how a refused write there
    may be refused, and whether every writable mount of host storage must be declared. Paths are as the
    task sees them, with the layout's placeholders."""

    read_only: tuple[str, ...] = ()
    masked: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    # The weakest of the three: the host's content there is unreadable inside and nothing the task
    # writes there reaches the host. Whether the path exists, is empty or is writable inside is not
    # promised (an empty writable tmpfs, a mode-000 tmpfs and a missing path all keep it). `masked`
    # (an empty read-only tmpfs) and `absent` (no such path) are its stricter forms.
    hidden: tuple[str, ...] = ()
    # The errnos a refused write under `read_only` (and a create in `masked`) may carry. A Landlock
    # ruleset refuses with EACCES, a seccomp filter with EPERM; the proof that a refusal refused is
    # the host's own look afterwards: nothing landed.
    refuse: tuple[str, ...] = STRICT_REFUSAL
    # Read-write mounts the sandbox makes for this task alone on host storage (a container's
    # /etc/hosts, its /dev/shm): part of the declared write surface, listed so a reader sees them.
    scratch: tuple[str, ...] = ()
    write_surface: WriteSurface = WriteSurface.declared


class TaskSection(NamedTuple):
    """[task]: the directories the platform gives a task: its control directory (read-only, only this
    task's, seeded with the named files), its user's writable temp directory, the directory it starts in."""

    control: str | None = None
    control_files: tuple[str, ...] = ()
    user_tmp: str | None = None
    workdir: str | None = None


class Namespaces(NamedTuple):
    """[namespaces]: which of the pid, ipc and uts namespaces the task has to itself (shared: no promise
    made), and the hostname it sees in its own uts namespace."""

    pid: Sharing = Sharing.shared
    ipc: Sharing = Sharing.shared
    uts: Sharing = Sharing.shared
    hostname: str | None = None


class Process(NamedTuple):
    """[process]: which capabilities the task's process may hold, whether it runs with no_new_privs, and
    what its PID 1 is called."""

    capabilities: Caps = Caps.any
    no_new_privs: bool = False
    # PID 1's comm, when the profile names it; several when the sandbox's own init differs with the
    # caller (srt: bwrap as root, its apply-seccomp helper as an unprivileged user).
    init: tuple[str, ...] | None = None


class Environment(NamedTuple):
    """[environment]: which variables may reach the task at all, and the values some of them must have
    (placeholders expanded)."""

    allow: tuple[str, ...] | None = None  # None: no promise about the environment
    set: Mapping[str, str] = EMPTY


class Limits(NamedTuple):
    """[limits]: the cgroup v2 limits (memory.max, pids.max) the sandbox promises to hold each task to."""

    memory_max: int | None = None  # bytes; None: no limit promised ("max" too)
    pids_max: int | None = None


class LayoutNames(NamedTuple):
    """[layout]: the names the task's layout carries, so that a witness run looks like the platform's own
    tasks (issue 27): the root directory's name prefix (None: the suite's own, sbxc-witness-<owner>-),
    the user and the other user whose trees it holds, and the task ids' prefix."""

    root: str | None = None
    user: str = "alice"
    other_user: str = "bob"
    task_prefix: str = "task-"


class Profile(NamedTuple):
    """What a sandbox promises a task: one profile file, parsed and validated (`parse`, `load`), a field per
    section. `promises` names the witness families it makes; a promise not made is not tested."""

    name: str
    source: str  # the file it came from, for messages
    description: str = ""
    filesystem: Filesystem = Filesystem()
    task: TaskSection = TaskSection()
    network: NetworkMode = NetworkMode.host
    # [network] allowed: the names a `proxy` lets through (the suite serves each one locally).
    network_allowed: tuple[str, ...] = ()
    nested_userns: Nested = Nested.allowed
    # How every door to a nested user namespace must be refused; empty: any errno.
    nested_errno: tuple[str, ...] = ()
    namespaces: Namespaces = Namespaces()
    process: Process = Process()
    environment: Environment = Environment()
    limits: Limits = Limits()
    # [devices] allow: device nodes the task may open beyond the default allowlist (conformance/plan.py
    # DEVICES); [network] unix_allowed: unix sockets it may connect to; [promises] not_claimed: the
    # default promises this sandbox does not keep, each with why.
    devices_allowed: tuple[str, ...] = ()
    unix_allowed: tuple[str, ...] = ()
    not_claimed: Mapping[str, str] = EMPTY
    layout: LayoutNames = LayoutNames()
    # [syscalls]: door -> "refused", "allowed" or a tuple of errno names, as the profile declares them
    # (`doors` adds the defaults).
    syscalls: Mapping[str, str | tuple[str, ...]] = EMPTY
    # Made, but left out of this run (`witness --only/--skip`, conformance/promises.py): not tested.
    unselected: frozenset[str] = frozenset()

    def doors(self) -> dict[str, str | tuple[str, ...]]:
        """How each syscall door must answer: the profile's [syscalls], over the defaults."""
        no_caps = self.process.capabilities in (Caps.none, Caps.none_effective)
        made: dict[str, str | tuple[str, ...]] = {door: "allowed" for door in SYSCALL_DOORS}
        made["ptrace_outside"] = "refused"
        made.update({door: "refused" for door in MOUNT_API_DOORS if no_caps})
        return {**made, **self.syscalls}

    def promises(self) -> tuple[str, ...]:
        """The promise families this profile makes, in display order. A witness whose family is not
        here is not generated: a promise not made is not tested (and not a skip either)."""
        fs, t, ns, pr = self.filesystem, self.task, self.namespaces, self.process
        made = {
            "masked": bool(fs.masked),
            "read_only": bool(fs.read_only),
            "writable": bool(fs.writable),
            "absent": bool(fs.absent),
            "hidden": bool(fs.hidden),
            # A masked path's content and an absent path are reachable under no other name either.
            "aliases": bool(fs.masked or fs.absent),
            "control": t.control is not None,
            "user_tmp": t.user_tmp is not None,
            # The task starts in its working directory: that host directory, not a copy of it.
            "workdir": t.workdir is not None,
            "network": self.network in (NetworkMode.none, NetworkMode.proxy),
            # What only a proxy promises: the allowlist holds in both directions.
            "network_proxy": self.network is NetworkMode.proxy,
            # Every profile, unless it says it confines no filesystem: the host reads the task's real
            # mount table for read-write mounts of host storage nobody declared.
            "write_surface": fs.write_surface is WriteSurface.declared,
            # Kernel state seen from inside agrees with the host's reading, and nothing the launch
            # started outlives the task: every profile.
            "kernel_view": True,
            "leftovers": True,
            # The host's every look at the task shows the same sandbox, from its start to its end.
            "unchanged": True,
            "nested_userns": self.nested_userns is Nested.refused,
            "pid": ns.pid is Sharing.private,
            "ipc": ns.ipc is Sharing.private,
            "uts": ns.uts is Sharing.private,
            "capabilities": pr.capabilities in (Caps.none, Caps.none_effective),
            "no_new_privs": pr.no_new_privs,
            "environment": self.environment.allow is not None,
            "environment_set": bool(self.environment.set),
            # A profile with a [limits] section promises a cgroup leaf per task; each limit its own
            # family, so a profile that sets only one of them is not asked about the other.
            "cgroup": self.limits.memory_max is not None or self.limits.pids_max is not None,
            "memory_max": self.limits.memory_max is not None,
            "pids_max": self.limits.pids_max is not None,
            **{k: True for k in DEFAULT_PROMISES},
        }
        left_out = {*self.not_claimed, *self.unselected}
        return tuple(k for k, v in made.items() if v and k not in left_out)


# ---- placeholders -------------------------------------------------------------------------------


def placeholders_in(text: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]


def expand(text: str, values: Mapping[str, str]) -> str:
    """Expand {placeholder}s. Only the known names, and only plain `{name}` (no attribute access or
    format specs: a profile is data, not a format-string program)."""

    def sub(m: re.Match[str]) -> str:
        return values[m.group(1)]

    return re.sub(r"\{([a-z_]+)\}", sub, text)


# ---- loading and validation ----------------------------------------------------------------------

_SCHEMA: dict[str, frozenset[str]] = {
    "profile": frozenset({"name", "description"}),
    "filesystem": frozenset(
        {"read_only", "masked", "writable", "absent", "hidden", "scratch", "write_surface", "refuse"}
    ),
    "task": frozenset({"control", "control_files", "user_tmp", "workdir"}),
    "network": frozenset({"mode", "allowed", "unix_allowed"}),
    "userns": frozenset({"nested", "errno"}),
    "namespaces": frozenset({"pid", "ipc", "uts", "hostname"}),
    "process": frozenset({"capabilities", "no_new_privs", "init"}),
    "environment": frozenset({"allow", "set"}),
    "limits": frozenset({"memory_max", "pids_max"}),
    "devices": frozenset({"allow"}),
    "promises": frozenset({"not_claimed"}),
    "syscalls": frozenset(SYSCALL_DOORS),
    "layout": frozenset(LayoutNames._fields),
}
# Anchored with \Z, never $: `$` also matches before a trailing newline, so "EROFS\n" or "PATH\n" would
# pass (issue 28).
_SIZE = re.compile(r"^(\d+)([KMGT]?)\Z")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_ERRNO = re.compile(r"^E[A-Z0-9]+\Z")
# A name in the layout's paths: one path component, nothing a shell or a placeholder would read.
_LAYOUT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# A name a proxy allowlist can hold: DNS labels (RFC 1123), or an IPv4 literal. No port and no
# wildcard: the suite must serve, and then reach, exactly this name.
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}\Z){_LABEL}(\.{_LABEL})*\Z")
# A known placeholder, as expand() replaces it; any other brace in a path or a value is an error.
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
# sethostname(2): at most HOST_NAME_MAX (64) bytes; a file name at most NAME_MAX (255) bytes.
HOST_NAME_MAX = 64
NAME_MAX = 255


# `fail`'s "no value to show": any value given, a falsy one too, is shown.
_NOTHING = object()


class _Reader:
    def __init__(self, file: str, doc: Mapping[str, Any]) -> None:
        self.file, self.doc = file, doc

    def fail(self, key: str, expected: str, got: Any = _NOTHING) -> InvalidProfile:
        if got is not _NOTHING:
            expected = f"{expected} (got {got!r})"
        return InvalidProfile(self.file, key, expected)

    def section(self, name: str) -> Mapping[str, Any]:
        sec = self.doc.get(name, {})
        if not isinstance(sec, Mapping):
            raise self.fail(name, "a table", sec)
        for key in sec:
            if key not in _SCHEMA[name]:
                raise self.fail(f"{name}.{key}", f"one of {', '.join(sorted(_SCHEMA[name]))} (unknown key)")
        return sec

    def placeholders(self, key: str, value: str) -> None:
        """Only known `{name}`s; a `{` or `}` anywhere else is an error (string.Formatter's parse raised
        ValueError on a lone `}`: a traceback, issue 28)."""
        unknown = [m.group(1) for m in _PLACEHOLDER.finditer(value) if m.group(1) not in PLACEHOLDERS]
        if unknown or re.search(r"[{}]", _PLACEHOLDER.sub("", value)):
            raise self.fail(key, f"placeholders among {{{'}, {'.join(PLACEHOLDERS)}}} (and no other brace)",
                            value)

    def path(self, key: str, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(key, "a non-empty path string", value)
        if "\0" in value or "\n" in value:
            raise self.fail(key, "a path without NUL or newline", value)
        self.placeholders(key, value)
        if not value.startswith(("/", "{")):
            raise self.fail(key, "an absolute path (or one starting with a placeholder)", value)
        if ".." in Path(value).parts:
            raise self.fail(key, "a path without '..'", value)
        return value

    def paths(self, key: str, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise self.fail(key, "a list of paths", value)
        return tuple(self.path(f"{key}[{i}]", v) for i, v in enumerate(value))

    def choice(self, key: str, value: Any, enum_: type[enum.StrEnum]) -> Any:
        names = [m.value for m in enum_]
        if value not in names:
            raise self.fail(key, f"one of {', '.join(repr(n) for n in names)}", value)
        return enum_(value)

    def boolean(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, "true or false", value)
        return value

    def text(self, key: str, value: Any) -> str:
        if not isinstance(value, str) or not value or "\n" in value or "\0" in value:
            raise self.fail(key, "a non-empty one-line string", value)
        return value

    def errnos(self, key: str, value: Any, example: str) -> tuple[str, ...]:
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(x, str) and _ERRNO.match(x) for x in value)
        ):
            raise self.fail(key, f"a non-empty list of errno names {example}", value)
        # A name errno(3) does not know can never be what a refusal carries: the promise could never
        # be kept.
        unknown = [x for x in value if not isinstance(getattr(errno_mod, x, None), int)]
        if unknown:
            raise self.fail(key, f"errno names this system knows {example}", unknown[0])
        return tuple(value)

    def inits(self, key: str, value: Any) -> tuple[str, ...]:
        """PID 1's comm: one name, or a list of the names it may have."""
        if isinstance(value, list) and value:
            return tuple(self.text(f"{key}[{i}]", v) for i, v in enumerate(value))
        if isinstance(value, str):
            return (self.text(key, value),)
        raise self.fail(key, "a name, or a non-empty list of names", value)

    def limit(self, key: str, value: Any, *, size: bool) -> int | None:
        if value == "max":
            return None
        if isinstance(value, bool):
            raise self.fail(key, 'a positive integer or "max"', value)
        if isinstance(value, int) and value > 0:
            return value
        if size and isinstance(value, str) and (m := _SIZE.match(value)) and int(m.group(1)) > 0:
            return int(m.group(1)) << (10 * " KMGT".index(m.group(2) or " "))  # K = 2**10, M = 2**20, ...
        what = (
            'bytes as a positive integer or a string like "512M", or "max"'
            if size
            else 'a positive integer or "max"'
        )
        raise self.fail(key, what, value)


def parse(doc: Mapping[str, Any], file: str) -> Profile:
    """The profile a TOML document promises, every key checked (InvalidProfile names the first bad
    one): one reader per section below, in the order a profile is written."""
    r = _Reader(file, doc)
    for name in doc:
        if name not in _SCHEMA:
            raise r.fail(name, f"a section among {', '.join(_SCHEMA)} (unknown section)")
    meta = r.section("profile")
    if "name" not in meta:
        raise r.fail("profile.name", "a profile name")
    # Read in the order a profile is written, so the first mistake named is the first one there.
    name = r.text("profile.name", meta["name"])
    description = r.text("profile.description", meta["description"]) if "description" in meta else ""
    filesystem, task = _filesystem(r), _task(r)
    network, allowed, unix_allowed = _network(r)
    devices_allowed, not_claimed, layout, syscalls = _devices(r), _not_claimed(r), _layout(r), _syscalls(r)
    nested, nested_errno = _userns(r)
    namespaces = _namespaces(r)
    process, environment, limits = _process(r, namespaces), _environment(r), _limits(r)
    return Profile(name=name, source=file, description=description, filesystem=filesystem, task=task,
                   network=network, network_allowed=allowed, nested_userns=nested, nested_errno=nested_errno,
                   syscalls=syscalls, layout=layout, namespaces=namespaces, process=process,
                   environment=environment, limits=limits, devices_allowed=devices_allowed,
                   unix_allowed=unix_allowed, not_claimed=not_claimed)


def _filesystem(r: _Reader) -> Filesystem:
    fs = r.section("filesystem")
    filesystem = Filesystem(
        **{k: r.paths(f"filesystem.{k}", fs[k]) for k in fs if k not in ("write_surface", "refuse")},
        write_surface=r.choice("filesystem.write_surface", fs["write_surface"], WriteSurface)
        if "write_surface" in fs
        else WriteSurface.declared,
        refuse=r.errnos("filesystem.refuse", fs["refuse"], 'such as ["EROFS", "EACCES"]')
        if "refuse" in fs
        else STRICT_REFUSAL,
    )
    if filesystem.refuse != STRICT_REFUSAL and not (filesystem.read_only or filesystem.masked):
        raise r.fail("filesystem.refuse", "filesystem.read_only or filesystem.masked (the writes it judges)")
    # One promise per path, compared normalised: `{state}/db`, `{state}/db/` and `{state}//db` are one
    # path, and read_only beside writable (or masked, absent, hidden) promises two things at once.
    claimed: dict[str, tuple[str, str]] = {}
    for kind in ("masked", "absent", "hidden", "writable", "read_only"):
        for path in getattr(filesystem, kind):
            norm = posixpath.normpath(path)
            if norm in claimed:
                other_kind, other = claimed[norm]
                raise r.fail(
                    f"filesystem.{kind}",
                    f"one promise per path ({path} is already filesystem.{other_kind} as {other})",
                )
            claimed[norm] = (kind, path)
    return filesystem


def _task(r: _Reader) -> TaskSection:
    t = r.section("task")
    control_files: tuple[str, ...] = ()
    if "control_files" in t:
        cf = t["control_files"]
        if (
            not isinstance(cf, list)
            or not cf
            or not all(isinstance(f, str) and f and "/" not in f and "\0" not in f and f not in (".", "..")
                       and len(os.fsencode(f)) <= NAME_MAX for f in cf)
        ):
            raise r.fail("task.control_files",
                         f"a non-empty list of plain file names (no NUL, at most {NAME_MAX} bytes each)", cf)
        if "control" not in t:
            raise r.fail("task.control_files", "task.control to be set too")
        control_files = tuple(cf)
    elif "control" in t:
        raise r.fail(
            "task.control_files",
            "at least one file the suite seeds in task.control "
            "(a read-only promise on an empty directory proves nothing)",
        )
    return TaskSection(
        control=r.path("task.control", t["control"]) if "control" in t else None,
        control_files=control_files,
        user_tmp=r.path("task.user_tmp", t["user_tmp"]) if "user_tmp" in t else None,
        workdir=r.path("task.workdir", t["workdir"]) if "workdir" in t else None,
    )


def _network(r: _Reader) -> tuple[NetworkMode, tuple[str, ...], tuple[str, ...]]:
    """(the mode, the names a proxy lets through, the host unix sockets bound in)."""
    net = r.section("network")
    network = r.choice("network.mode", net["mode"], NetworkMode) if "mode" in net else NetworkMode.host
    allowed: tuple[str, ...] = ()
    if "allowed" in net:
        v = net["allowed"]
        if not isinstance(v, list) or not all(isinstance(x, str) and _HOSTNAME.match(x) for x in v):
            raise r.fail(
                "network.allowed", 'a list of host names such as ["localhost"] (no port, no wildcard)', v
            )
        if network is not NetworkMode.proxy:
            raise r.fail("network.allowed", 'network.mode = "proxy" (only a proxy lets names through)')
        allowed = tuple(v)
    unix_allowed = r.paths("network.unix_allowed", net["unix_allowed"]) if "unix_allowed" in net else ()
    return network, allowed, unix_allowed


def _devices(r: _Reader) -> tuple[str, ...]:
    dev = r.section("devices")
    devices_allowed = r.paths("devices.allow", dev["allow"]) if "allow" in dev else ()
    bad_dev = [d for d in devices_allowed if not d.startswith("/dev/")]
    if bad_dev:
        raise r.fail("devices.allow", "device node paths under /dev/", bad_dev[0])
    return devices_allowed


def _not_claimed(r: _Reader) -> dict[str, str]:
    prom = r.section("promises")
    not_claimed: dict[str, str] = {}
    if "not_claimed" in prom:
        nc = prom["not_claimed"]
        if not isinstance(nc, Mapping):
            raise r.fail("promises.not_claimed", 'a table of promise = "why this sandbox does not keep it"',
                         nc)
        for k, v in nc.items():
            if k not in DEFAULT_PROMISES:
                raise r.fail(f"promises.not_claimed.{k}", f"one of {', '.join(DEFAULT_PROMISES)}")
            not_claimed[k] = r.text(f"promises.not_claimed.{k}", v)
    return not_claimed


def _layout(r: _Reader) -> LayoutNames:
    lay = r.section("layout")
    for k, v in lay.items():
        if not isinstance(v, str) or not _LAYOUT_NAME.match(v):
            raise r.fail(f"layout.{k}", "a plain name (letters, digits, '.', '_', '-'; at most 64)", v)
    layout_names = LayoutNames(**lay)
    if layout_names.user == layout_names.other_user:
        raise r.fail("layout.other_user", f"a name other than layout.user ({layout_names.user})")
    return layout_names


def _syscalls(r: _Reader) -> dict[str, str | tuple[str, ...]]:
    sc = r.section("syscalls")
    syscalls: dict[str, str | tuple[str, ...]] = {}
    for door, v in sc.items():
        if isinstance(v, list):
            syscalls[door] = r.errnos(f"syscalls.{door}", v, 'such as ["EPERM", "ENOSYS"]')
        elif v in ("refused", "allowed"):
            syscalls[door] = v
        else:
            raise r.fail(f"syscalls.{door}", '"refused", "allowed" or a list of errno names', v)
    return syscalls


def _userns(r: _Reader) -> tuple[Nested, tuple[str, ...]]:
    """(whether a nested user namespace is allowed, the errnos a refusal may give)."""
    uns = r.section("userns")
    nested = r.choice("userns.nested", uns["nested"], Nested) if "nested" in uns else Nested.allowed
    nested_errno: tuple[str, ...] = ()
    if "errno" in uns:
        v = r.errnos("userns.errno", uns["errno"], 'such as ["ENOSPC", "EPERM"]')
        if nested is not Nested.refused:
            raise r.fail("userns.errno", 'userns.nested = "refused" (an errno says how it is refused)')
        nested_errno = v
    return nested, nested_errno


def _namespaces(r: _Reader) -> Namespaces:
    ns = r.section("namespaces")
    namespaces = Namespaces(
        **{k: r.choice(f"namespaces.{k}", ns[k], Sharing) for k in ("pid", "ipc", "uts") if k in ns},
        hostname=r.text("namespaces.hostname", ns["hostname"]) if "hostname" in ns else None,
    )
    if namespaces.hostname and len(namespaces.hostname.encode()) > HOST_NAME_MAX:
        raise r.fail("namespaces.hostname", f"at most {HOST_NAME_MAX} bytes (sethostname(2))",
                     namespaces.hostname)
    if namespaces.hostname and namespaces.uts is not Sharing.private:
        raise r.fail(
            "namespaces.hostname", 'namespaces.uts = "private" (a hostname needs its own uts namespace)'
        )
    return namespaces


def _process(r: _Reader, namespaces: Namespaces) -> Process:
    p = r.section("process")
    process = Process(
        capabilities=r.choice("process.capabilities", p["capabilities"], Caps)
        if "capabilities" in p
        else Caps.any,
        no_new_privs=r.boolean("process.no_new_privs", p["no_new_privs"]) if "no_new_privs" in p else False,
        init=r.inits("process.init", p["init"]) if "init" in p else None,
    )
    if process.init and namespaces.pid is not Sharing.private:
        raise r.fail(
            "process.init", 'namespaces.pid = "private" (PID 1 is only the sandbox\'s own in a pid namespace)'
        )
    return process


def _environment(r: _Reader) -> Environment:
    e = r.section("environment")
    allow: tuple[str, ...] | None = None
    if "allow" in e:
        if not isinstance(e["allow"], list) or not all(
            isinstance(k, str) and _ENV_NAME.match(k) for k in e["allow"]
        ):
            raise r.fail("environment.allow", "a list of environment variable names", e["allow"])
        allow = tuple(e["allow"])
    env_set: dict[str, str] = {}
    if "set" in e:
        if not isinstance(e["set"], Mapping):
            raise r.fail("environment.set", 'a table of NAME = "value"', e["set"])
        for k, v in e["set"].items():
            if not _ENV_NAME.match(k) or not isinstance(v, str):
                raise r.fail(f"environment.set.{k}", "a variable name with a string value", v)
            if allow is not None and k not in allow:
                raise r.fail(f"environment.set.{k}", "a key listed in environment.allow")
            if "\0" in v:
                raise r.fail(f"environment.set.{k}", "a value without NUL (no environment holds one)", v)
            r.placeholders(f"environment.set.{k}", v)
            env_set[k] = v
    return Environment(allow=allow, set=env_set)


def _limits(r: _Reader) -> Limits:
    lim = r.section("limits")
    return Limits(
        memory_max=r.limit("limits.memory_max", lim["memory_max"], size=True)
        if "memory_max" in lim
        else None,
        pids_max=r.limit("limits.pids_max", lim["pids_max"], size=False) if "pids_max" in lim else None,
    )


def load(path: str | Path | None = None) -> Profile:
    """The profile at `path`, or the embedded reference profile when None."""
    if path is None:
        ref = resources.files("sandbox_conformance.conformance") / "profiles" / f"{REFERENCE_NAME}.toml"
        return parse(tomllib.loads(ref.read_text()), f"<embedded {REFERENCE_NAME}.toml>")
    file = str(path)
    try:
        # A regular file, read up to a bound: a FIFO, /dev/zero or a symlink loop is one line, never a
        # hang or a traceback (processes/inputs.py).
        text = inputs.read_text(path)
    except inputs.UnusableInput as e:
        raise InvalidProfile(file, "(file)", f"a readable profile file ({e})") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InvalidProfile(file, "(syntax)", f"valid TOML: {e}") from None
    except RecursionError:  # nesting deep enough to exhaust the parser's stack
        raise InvalidProfile(file, "(syntax)", "TOML nested less deeply") from None
    return parse(doc, file)
