"""Runs INSIDE a ladder trial: `python3 -I -S -c <this file's text> MODE`. Stdlib only, imports nothing
of ours (it runs as another user, inside bwrap, with / read-only), and prints ONE JSON line.

Modes:
  userns  before anything: the process signals this user really has (CapEff, Seccomp, NoNewPrivs,
          AppArmor label, RLIMIT_NPROC); then unshare(CLONE_NEWUSER) and the setgroups/uid_map/gid_map
          writes, each reported as an errno name (null: it worked).
  netns   inside `bwrap --unshare-net`: interfaces and whether lo is IFF_UP (SIOCGIFFLAGS).
  pidns   inside `bwrap --unshare-pid --proc /proc`: our pid and what /proc/self points at (a fresh procfs
          for this pid namespace resolves /proc/self to our own, small, pid).
  nested  inside `bwrap --unshare-user --disable-userns`: the errno of a nested unshare(CLONE_NEWUSER)
          (ENOSPC expected) and the local user.max_user_namespaces.
  all     the fast path, inside ONE `bwrap --unshare-user --unshare-net --unshare-pid --proc /proc
          --disable-userns`: what the userns, netns, pidns and nested modes each see, plus what bwrap's
          own setgroups/uid_map/gid_map writes left (read back), so one launch answers every rung.

Start-up is most of a trial's cost, so this imports only C modules: no json (it pulls in re, ~8 ms),
_socket instead of socket (enum, ~7 ms), posix instead of os, ctypes only in the modes that call
unshare.
"""

import errno
import posix  # os without its Python layer (posixpath, stat, _collections_abc: ~2 ms here)
import sys

CLONE_NEWUSER = 0x10000000  # <linux/sched.h>
SIOCGIFFLAGS = 0x8913  # <linux/sockios.h>
IFF_UP = 0x1  # <linux/if.h>

# Annotations are for mypy only (the convention of conformance/inside.py): a def's annotations are
# evaluated when the def runs, under whatever python3 the trial has, so any that is not a plain
# builtin is a string ("dict[str, str]" is a TypeError before 3.9), and nothing imports `typing`.


# probes/errnos.errname, copied: this runs under `python3 -I -S` in a trial and imports nothing of ours.
def errname(number: "int | None") -> str:
    return errno.errorcode.get(number, str(number)) if number is not None else str(number)


def dumps(value: object) -> str:
    """Enough JSON for what we report: None, bool, int, str, list, dict."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + "".join(_ESCAPE.get(c) or (c if c >= " " else f"\\u{ord(c):04x}") for c in value) + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(dumps(str(k)) + ":" + dumps(v) for k, v in value.items()) + "}"
    raise TypeError(type(value).__name__)


_ESCAPE = {'"': '\\"', "\\": "\\\\"}


def unshare(flags: int) -> "str | None":
    # Python 3.11 has no os.unshare (3.12 does); go through libc.
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(ctypes.c_int(flags)) != 0:
        return errname(ctypes.get_errno())
    return None


def write(path: str, text: str) -> "str | None":
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        return errname(e.errno)
    return None


def read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read().strip()
    except OSError as e:
        return "!" + errname(e.errno)


def status_fields() -> "dict[str, str]":
    out: dict[str, str] = {}
    text = read("/proc/self/status")
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("CapEff", "Seccomp", "NoNewPrivs", "Uid"):
            out[key] = value.strip()
    return out


def apparmor_label() -> "str | None":
    # /proc/self/attr/apparmor/current (5.8+, stacking-aware) before the legacy shared attr/current.
    for path in ("/proc/self/attr/apparmor/current", "/proc/self/attr/current"):
        value = read(path)
        if not value.startswith("!"):
            return value
    return None


def nproc_limit() -> "int | None":
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    return None if soft == resource.RLIM_INFINITY else soft


def mode_userns() -> "dict[str, object]":
    out: dict[str, object] = {"uid": posix.getuid(), "gid": posix.getgid(), "status": status_fields(),
           "apparmor": apparmor_label(), "nproc_limit": nproc_limit(),
           "userns_before": _ns("user")}
    uid, gid = posix.getuid(), posix.getgid()
    out["unshare"] = unshare(CLONE_NEWUSER)
    if out["unshare"] is None:
        out["userns_after"] = _ns("user")
        # setgroups must be denied before an unprivileged gid_map write (user_namespaces(7), 3.19+).
        out["setgroups"] = write("/proc/self/setgroups", "deny")
        if out["setgroups"] == "ENOENT":
            out["setgroups"] = None  # kernel older than 3.19: no such file, nothing to deny
        out["uid_map"] = write("/proc/self/uid_map", f"{uid} {uid} 1\n")
        out["gid_map"] = write("/proc/self/gid_map", f"{gid} {gid} 1\n")
        out["uid_map_read"] = read("/proc/self/uid_map")
    return out


def _ns(name: str) -> str:
    try:
        return posix.readlink("/proc/self/ns/" + name)
    except OSError as e:
        return "!" + errname(e.errno)


def mode_netns() -> "dict[str, object]":
    import _socket
    import _struct
    import fcntl

    out: dict[str, object] = {"net": _ns("net"), "interfaces": [name for _, name in _socket.if_nameindex()]}
    try:
        # struct ifreq: char ifr_name[IFNAMSIZ=16]; short ifr_flags; padded to 40 bytes (<linux/if.h>).
        s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
        try:
            raw = fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, _struct.pack("16sH22x", b"lo", 0))
        finally:
            s.close()
        flags = _struct.unpack("16sH22x", raw)[1]
        out["lo_flags"] = flags
        out["lo_up"] = bool(flags & IFF_UP)
    except OSError as e:
        out["lo_error"] = errname(e.errno)
        out["lo_up"] = False
    return out


def mode_pidns() -> "dict[str, object]":
    try:
        self_link = posix.readlink("/proc/self")
    except OSError as e:
        self_link = "!" + errname(e.errno)
    try:
        pids = [d for d in posix.listdir("/proc") if d.isdigit()]
    except OSError:
        pids = []
    return {"pid": posix.getpid(), "proc_self": self_link, "proc_pids": len(pids), "pid_ns": _ns("pid"),
            "fresh_proc": self_link == str(posix.getpid())}


def mode_nested() -> "dict[str, object]":
    return {"userns": _ns("user"), "max_user_namespaces": read("/proc/sys/user/max_user_namespaces"),
            "nested_unshare": unshare(CLONE_NEWUSER)}


def mode_all() -> "dict[str, object]":
    # An unprivileged bwrap makes the same writes as mode_userns (setgroups "deny", then uid_map and
    # gid_map, from the child: bubblewrap.c write_uid_gid_map), so reading them back answers
    # userns.map. An unmapped uid would read as the overflow uid (user_namespaces(7)).
    out: dict[str, object] = {
        "uid": posix.getuid(), "gid": posix.getgid(), "status": status_fields(),
        "setgroups_read": read("/proc/self/setgroups"), "uid_map_read": read("/proc/self/uid_map"),
        "gid_map_read": read("/proc/self/gid_map"), "overflowuid": read("/proc/sys/kernel/overflowuid")}
    out.update(mode_netns())
    out.update(mode_pidns())
    # Last: a nested unshare that wrongly succeeds moves us into yet another user namespace.
    out.update(mode_nested())
    return out


MODES = {"userns": mode_userns, "netns": mode_netns, "pidns": mode_pidns, "nested": mode_nested,
         "all": mode_all}

if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in MODES:
        print(dumps({"error": f"unknown mode {mode!r}"}))
        sys.exit(2)
    print(dumps(MODES[mode]()))
