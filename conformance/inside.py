# The witness program: runs INSIDE the task as `python3 -I -S -`, its source fed on stdin, so the
# sandbox need not see any of our files. Stdlib only, imports nothing of ours, and no syntax newer
# than Python 3.6 (the task's interpreter is the sandbox's, not ours): no f-string `=`, no walrus, no
# `from __future__` (the harness runs it after the plan line and its loader, conformance/plan.py
# program: compiled there when the task's interpreter has our bytecode's magic number, from this
# source otherwise). Annotations are for mypy only. A def's annotations are evaluated when the def runs,
# so any that is not a plain builtin (`str`, `int`) is a string: "dict[str, Any]" subscripts a
# builtin, a TypeError before 3.9. A local variable's annotation is never evaluated (PEP 526), so it
# needs no quotes. `typing` is imported only under TYPE_CHECKING, never in the task.
#
# It reads PLAN (a JSON string the harness prepends as the first line), makes every observation the
# plan asks for, and prints ONE JSON document ending with "complete": true. One launch answers
# every witness of a task. Each observation is wrapped: an observation that raises is recorded as
# {"error": ...} instead of killing the document, and the witness that needs it fails saying so.
import ctypes
import errno
import functools
import os
import signal
import socket
import stat
import struct
import sys
import time

VERSION = 2  # 2: environment with values, nested_userns per door, launch_nonce, kernel, handshake, reach
CLONE_NEWUSER = 0x10000000  # <linux/sched.h>
SIGCHLD = 17
PR_SET_NAME, PR_GET_NO_NEW_PRIVS = 15, 39  # <linux/prctl.h>
SI_QUEUE = -1  # <asm-generic/siginfo.h>: sent by sigqueue(3)
PROC_SUPER_MAGIC = 0x9FA0  # <linux/magic.h>
LINUX_CAPABILITY_VERSION_3 = 0x20080522  # <linux/capability.h>
# clone3 has one number on every architecture (asm-generic/unistd.h); clone's differs.
SYS_CLONE3 = 435
SYS_CLONE = {"x86_64": 56, "aarch64": 220, "riscv64": 220, "s390x": 120, "ppc64le": 120}
STATUS_KEYS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Uid", "Gid")
NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "user", "uts")

TYPE_CHECKING = False  # mypy takes any name TYPE_CHECKING as true; the task never runs this block
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, NoReturn, TypeVar, TypeVarTuple, Unpack

    T = TypeVar("T")
    Ts = TypeVarTuple("Ts")
    PLAN: str  # the line the harness prepends (conformance/plan.py: program)


def _json_codec() -> "tuple[Callable[[str], Any], Callable[[object], str]]":
    """json.loads and json.dumps from json's C half, `_json`, which is what json itself runs: importing
    the json package imports re for its pure-Python fallback (~4.5 ms of CPU at every launch's start,
    three launches a run: bench/README.md, session 12). Any interpreter without it, or whose C half
    takes other arguments, gets the json package."""
    try:
        import _json

        class Context:  # what json.decoder.JSONDecoder hands the C scanner
            strict = True
            object_hook = None
            object_pairs_hook = None
            parse_float = float
            parse_int = int
            parse_constant = float  # NaN, Infinity, -Infinity, as json.loads reads them

        def unserializable(value: object) -> "NoReturn":
            raise TypeError("Object of type " + type(value).__name__ + " is not JSON serializable")

        # typeshed types the context as a scanner; the C scanner reads only these six attributes.
        scan = _json.make_scanner(Context())  # type: ignore[arg-type]
        # markers=None: no cycle check (a document is a tree); separators and allow_nan as json.dumps's.
        encode = _json.make_encoder(None, unserializable, _json.encode_basestring_ascii, None, ": ", ", ",
                                    False, False, True)
    except (ImportError, AttributeError, TypeError):
        import json

        return json.loads, json.dumps

    def loads(text: str) -> "Any":
        text = text.strip(" \t\n\r")
        try:
            value, end = scan(text, 0)  # a malformed document raises json.JSONDecodeError itself
        except StopIteration:
            raise ValueError("not a JSON document") from None
        if end != len(text):
            raise ValueError("extra data after a JSON document")
        return value

    def dumps(value: object) -> str:
        return "".join(encode(value, 0))

    return loads, dumps


json_loads, json_dumps = _json_codec()


# probes/errnos.errname, copied: this program runs as `python3 -I -S -` in the task, imports nothing of ours.
def errname(e: OSError) -> str:
    return errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__


def attempt(fn: "Callable[[], object]") -> "dict[str, object]":
    try:
        value = fn()
    except OSError as e:
        return {"ok": False, "errno": errname(e)}
    out: dict[str, object] = {"ok": True, "errno": None}
    if value is not None:
        out["value"] = value
    return out


def do_stat(path: str) -> "dict[str, object]":
    st = os.lstat(path)
    kind = (
        "dir"
        if os.path.isdir(path) and not os.path.islink(path)
        else ("file" if os.path.isfile(path) else ("link" if os.path.islink(path) else "other"))
    )
    return {"type": kind, "mode": oct(st.st_mode & 0o7777), "uid": st.st_uid}


def do_list(path: str) -> "list[str]":
    return sorted(os.listdir(path))[:200]


def do_read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read(4096).decode("utf-8", "replace")


def do_append(path: str, data: str) -> None:
    # O_APPEND without O_CREAT: an append must not be able to create the file it is refused on.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def do_create(path: str, data: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def do_op(op: "Mapping[str, Any]") -> "dict[str, object]":
    kind, path = op["op"], op["path"]
    if kind == "stat":
        return attempt(lambda: do_stat(path))
    if kind == "list":
        return attempt(lambda: do_list(path))
    if kind == "read":
        return attempt(lambda: do_read(path))
    if kind == "append":
        return attempt(lambda: do_append(path, op.get("data", "")))
    if kind == "create":
        return attempt(lambda: do_create(path, op.get("data", "")))
    if kind == "unlink":
        return attempt(lambda: os.unlink(path))
    return {"ok": False, "errno": None, "error": "unknown op " + kind}


def unescape(field: str) -> str:
    # mountinfo octal-escapes space, tab, newline and backslash (fs/proc_namespace.c: show_mountinfo).
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit() and len(field[i + 1 : i + 4]) == 3:
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mountinfo() -> "list[dict[str, object]]":
    entries = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.rstrip("\n").partition(" - ")
            a, b = left.split(), right.split()
            if len(a) < 6 or len(b) < 2:
                continue
            entries.append(
                {
                    "mount_point": unescape(a[4]),
                    "root": unescape(a[3]),
                    "options": a[5].split(","),
                    "fstype": b[0],
                    "source": unescape(b[1]),
                    "ro": "ro" in a[5].split(","),
                }
            )
    return entries[:1000]


def status() -> "dict[str, str]":
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in STATUS_KEYS:
                out[key] = value.strip()
    return out


def read_text(path: str, limit: int = 4096) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")


def namespaces() -> "dict[str, str]":
    out = {}
    for ns in NAMESPACES:
        try:
            out[ns] = os.readlink("/proc/self/ns/" + ns)
        except OSError as e:
            out[ns] = "error: " + errname(e)
    return out


PROCESS_LIMIT = 300  # processes listed, lowest pids first


def processes(look_for: "Sequence[int]" = ()) -> "list[dict[str, object]]":
    # The first 300 pids, and the ones the plan looks for wherever they are (the harness's host pid, on
    # a host with more than 300 processes below it, would otherwise never be listed).
    names = [n for n in sorted(os.listdir("/proc"), key=lambda n: (len(n), n)) if n.isdigit()]
    wanted = [str(p) for p in look_for if str(p) in names[PROCESS_LIMIT:]]
    procs = []
    for name in names[:PROCESS_LIMIT] + wanted:
        entry: dict[str, object] = {"pid": int(name)}
        try:
            entry["comm"] = read_text("/proc/" + name + "/comm").strip()
            # 512 bytes: conformance/witnesses/isolation.py CMDLINE_BYTES compares the host's the same way.
            cmdline = read_text("/proc/" + name + "/cmdline", 512).split("\0")
            while cmdline and cmdline[-1] == "":
                cmdline.pop()
            entry["cmdline"] = cmdline
            for line in read_text("/proc/" + name + "/status").splitlines():
                if line.startswith("PPid:"):
                    entry["ppid"] = int(line.split()[1])
        except OSError as e:
            entry["error"] = errname(e)  # exited meanwhile, or hidden by hidepid
        procs.append(entry)
    return procs


def connect_tcp(target: "Sequence[Any]") -> "dict[str, object]":
    # Which step refused matters: a seccomp filter that refuses socket(2) itself (EPERM) leaves the
    # task no network at all, which is more than an empty network namespace.
    host, port = target
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    except OSError as e:
        return {"ok": False, "errno": errname(e), "stage": "socket"}
    s.settimeout(1.0)  # refused or unreachable is immediate in an empty netns; a drop must not hang us
    try:
        s.connect((host, port))
    except OSError as e:
        return {"ok": False, "errno": errname(e), "stage": "connect"}
    finally:
        s.close()
    return {"ok": True, "errno": None, "stage": "connect"}


def connect_abstract(name: str) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect("\0" + name)  # abstract sockets live in the network namespace (unix(7))
    finally:
        s.close()


# ---- proxies the sandbox offers (plan["proxy"]) ------------------------------------------------------

PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
PROXY_TIMEOUT = 3.0


def offered_proxies() -> "list[dict[str, Any]]":
    # Every proxy the task's environment names, once each: what any program in the task would use.
    from urllib.parse import unquote, urlsplit

    found: dict[tuple[object, ...], dict[str, Any]] = {}
    for var in PROXY_VARS:
        value = os.environ.get(var)
        if not value:
            continue
        u = urlsplit(value if "://" in value else "http://" + value)
        try:
            port: int | None = u.port or (1080 if u.scheme.startswith("socks") else 80)
        except ValueError:
            port = None
        key = (u.scheme, u.hostname, port, u.username, u.password)
        if key not in found:
            found[key] = {
                "proxy": f"{u.scheme}://{u.hostname}:{port}",
                "scheme": u.scheme,
                "host": u.hostname,
                "port": port,
                "user": unquote(u.username) if u.username else None,
                "password": unquote(u.password) if u.password else "",
                "vars": [],
            }
        found[key]["vars"].append(var)
    return list(found.values())


def _recv_head(s: socket.socket) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 8192:
        chunk = s.recv(1024)
        if not chunk:
            break
        head += chunk
    return head


def _echoed(s: socket.socket, nonce: str) -> bool:
    # Through an established tunnel to the suite's echo listener, which answers once and closes: the
    # nonce sent, and read until it is back, or the end.
    s.sendall(nonce.encode())
    got = b""
    while nonce.encode() not in got and len(got) < 4096:
        chunk = s.recv(1024)
        if not chunk:
            break
        got += chunk
    return nonce.encode() in got


def tunnel(proxy: "Mapping[str, Any]", target: "Mapping[str, Any]", nonce: str) -> "dict[str, object]":
    # CONNECT host:port through an HTTP proxy (RFC 9110 9.3.6); when the target is the suite's echo
    # listener, send the nonce through the tunnel and read what comes back.
    import base64

    s = socket.create_connection((proxy["host"], proxy["port"]), timeout=PROXY_TIMEOUT)
    try:
        authority = "{}:{}".format(target["host"], target["port"])
        lines = ["CONNECT " + authority + " HTTP/1.1", "Host: " + authority]
        if proxy["user"] is not None:
            token = base64.b64encode((proxy["user"] + ":" + proxy["password"]).encode()).decode()
            lines.append("Proxy-Authorization: Basic " + token)
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = _recv_head(s)
        status = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = status.split()
        established = len(parts) >= 2 and parts[0].startswith("HTTP/") and parts[1].startswith("2")
        out: dict[str, object] = {"status": status[:200], "established": established, "echoed": None}
        if established and target.get("echo"):
            out["echoed"] = _echoed(s, nonce)
        return out
    finally:
        s.close()


def _recv_exact(s: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = s.recv(n - len(got))
        if not chunk:
            break
        got += chunk
    return got


def socks5_tunnel(proxy: "Mapping[str, Any]", target: "Mapping[str, Any]", nonce: str) -> "dict[str, object]":
    # CONNECT through a SOCKS5 proxy (RFC 1928; username/password, RFC 1929), the name sent for the proxy
    # to resolve (socks5h, what srt offers in ALL_PROXY); when the target is the suite's echo listener,
    # the nonce is sent through and read back, as for an HTTP proxy.
    import ipaddress
    import struct

    s = socket.create_connection((proxy["host"], proxy["port"]), timeout=PROXY_TIMEOUT)
    try:
        user = proxy.get("user")
        s.sendall(b"\x05\x02\x00\x02" if user is not None else b"\x05\x01\x00")
        method = _recv_exact(s, 2)
        if len(method) < 2 or method[0] != 5 or method[1] == 0xFF:
            refused = "SOCKS5 greeting refused: " + method.hex()
            return {"status": refused, "established": False, "echoed": None}
        if method[1] == 2:
            u, pw = (user or "").encode(), (proxy.get("password") or "").encode()
            s.sendall(b"\x01" + bytes([len(u)]) + u + bytes([len(pw)]) + pw)
            if _recv_exact(s, 2)[1:2] != b"\x00":
                return {"status": "SOCKS5 authentication refused", "established": False, "echoed": None}
        host = str(target["host"])
        try:
            ip = ipaddress.ip_address(host)
            addr = (b"\x01" if ip.version == 4 else b"\x04") + ip.packed
        except ValueError:
            addr = b"\x03" + bytes([len(host.encode())]) + host.encode()
        s.sendall(b"\x05\x01\x00" + addr + struct.pack(">H", int(target["port"])))
        head = _recv_exact(s, 4)
        if len(head) < 4 or head[0] != 5:
            return {"status": "SOCKS5 reply malformed: " + head.hex(), "established": False, "echoed": None}
        bound = {1: 4, 4: 16}.get(head[3])
        _recv_exact(s, (bound if bound is not None else _recv_exact(s, 1)[0]) + 2)  # BND.ADDR, BND.PORT
        out: dict[str, object] = {"status": "SOCKS5 reply " + str(head[1]), "established": head[1] == 0,
                                  "echoed": None}
        if head[1] == 0 and target.get("echo"):
            out["echoed"] = _echoed(s, nonce)
        return out
    finally:
        s.close()


# How each proxy scheme is asked to tunnel; a proxy of another scheme is listed with no tunnels, which
# the witness counts as a proxy it could not try (never as one that refused).
TUNNELS = {"http": "tunnel", "socks5": "socks5_tunnel", "socks5h": "socks5_tunnel"}


def proxy_trials(spec: "Mapping[str, Any]") -> "dict[str, list[dict[str, Any]]]":
    nonce = spec.get("nonce") or "sbxc"
    out: dict[str, list[dict[str, Any]]] = {"offered": [], "direct": []}
    for p in offered_proxies():
        entry = dict((k, v) for k, v in p.items() if k not in ("user", "password"))
        entry["connect"] = connect_tcp((p["host"], p["port"])) if p["port"] else {"ok": False, "errno": None}
        entry["tunnels"] = []
        how = globals()[TUNNELS[p["scheme"]]] if p["scheme"] in TUNNELS else None
        if entry["connect"]["ok"] and how is not None:
            for t in spec.get("targets", []):
                entry["tunnels"].append(dict(t, result=observe(how, p, t, nonce)))
        out["offered"].append(entry)
    for d in spec.get("direct", []):
        out["direct"].append(dict(d, result=observe(connect_tcp, (d["host"], d["port"]))))
    return out


def environment() -> "dict[str, str]":
    # /proc/self/environ is the environment the task was exec'd with; os.environ is not: CPython's
    # locale coercion (PEP 538) adds LC_CTYPE to it after start-up, which the sandbox did not pass.
    with open("/proc/self/environ", "rb") as f:
        raw = f.read()
    out = {}
    for kv in raw.split(b"\0"):
        if kv:
            k, _, v = kv.decode("utf-8", "replace").partition("=")
            out[k] = v
    return out


def kernel_view() -> "dict[str, object]":
    # What the task can learn from syscalls rather than from /proc files the sandbox may have forged:
    # capget(2), prctl(PR_GET_NO_NEW_PRIVS), getpid(2), and statfs(2) of /proc (a real procfs says
    # PROC_SUPER_MAGIC; a bind of some other tree at /proc does not).
    libc = ctypes.CDLL(None, use_errno=True)
    out: dict[str, object] = {"pid": os.getpid()}
    header = ctypes.create_string_buffer(struct.pack("Ii", LINUX_CAPABILITY_VERSION_3, 0))
    data = ctypes.create_string_buffer(24)
    if libc.capget(header, data) == 0:
        e0, p0, i0, e1, p1, i1 = struct.unpack("6I", data.raw)
        out["caps"] = {
            "CapEff": "%016x" % (e1 << 32 | e0),
            "CapPrm": "%016x" % (p1 << 32 | p0),
            "CapInh": "%016x" % (i1 << 32 | i0),
        }
    else:
        out["caps"] = {"error": errno.errorcode.get(ctypes.get_errno(), "?")}
    nnp = libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
    out["no_new_privs"] = nnp if nnp >= 0 else "error: " + errno.errorcode.get(ctypes.get_errno(), "?")
    buf = ctypes.create_string_buffer(256)  # struct statfs starts with f_type, a C long
    if libc.statfs(b"/proc", buf) == 0:
        out["proc_magic"] = "%x" % (ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF)
    else:
        out["proc_magic"] = "error: " + errno.errorcode.get(ctypes.get_errno(), "?")
    return out


def take_tag(tag: str) -> "str | None":
    # The first thing the program does: the host-side observer (conformance/observer.py) finds this
    # process by its comm from the moment it runs, and looks at it unannounced until it exits. SIGUSR1
    # (the release) is blocked now, so a release that comes early waits as pending (sigtimedwait(2)).
    libc = ctypes.CDLL(None, use_errno=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    if libc.prctl(PR_SET_NAME, ctypes.c_char_p(tag.encode()), 0, 0, 0) != 0:
        return "prctl(PR_SET_NAME): " + errno.errorcode.get(ctypes.get_errno(), "?")
    return None


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _release(seconds: float) -> "dict[str, object]":
    # sigtimedwait(2) through libc, for the siginfo Python's signal.sigtimedwait leaves out: the host
    # releases us with sigqueue(3), and si_value (a number drawn at release, that only the process it
    # signalled receives) goes into the document, binding the process the host read to this document.
    # siginfo_t on 64-bit Linux: si_signo, si_errno, si_code, then the union at offset 16, whose _rt
    # member is si_pid, si_uid, si_value (include/uapi/asm-generic/siginfo.h).
    libc = ctypes.CDLL(None, use_errno=True)
    mask = ctypes.create_string_buffer(128)  # sigset_t
    libc.sigemptyset(mask)
    libc.sigaddset(mask, signal.SIGUSR1)
    info = ctypes.create_string_buffer(128)
    ts = _Timespec(int(seconds), int((seconds - int(seconds)) * 1e9))
    while True:
        got = libc.sigtimedwait(mask, info, ctypes.byref(ts))
        if got >= 0 or ctypes.get_errno() != errno.EINTR:
            break
    if got < 0:
        return {"released": False, "errno": _errno()}
    code = struct.unpack_from("i", info.raw, 8)[0]
    value = struct.unpack_from("i", info.raw, 24)[0] if ctypes.sizeof(ctypes.c_void_p) == 8 else None
    return {"released": True, "si_code": code, "value": value if code == SI_QUEUE else None}


def announce(plan: "Mapping[str, Any]") -> float:
    # From here the observer reads this process's kernel state from the host's /proc, then releases it
    # (see _release), which `handshake` waits for.
    sys.stdout.write(json_dumps({"sbxc_ready": plan["launch_nonce"]}) + "\n")
    sys.stdout.flush()
    return time.monotonic()


def handshake(plan: "Mapping[str, Any]", announced: float) -> "dict[str, object]":
    out = _release(max(0.0, plan["handshake_seconds"] - (time.monotonic() - announced)))
    out["waited"] = round(time.monotonic() - announced, 3)
    return out


def after_release() -> "dict[str, object]":
    # The task's own view again, once the host has looked: a sandbox that is one thing at the handshake
    # and another after it is caught by comparing these with the readings made before it.
    return {
        "namespaces": observe(namespaces),
        "status": observe(status),
        "mounts": observe(lambda: sorted((str(m["mount_point"]), bool(m["ro"])) for m in mountinfo())),
    }


def _errno() -> str:
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


def _forked(libc: ctypes.CDLL, number: int, *args: object) -> "dict[str, object]":
    # clone(2)/clone3(2) without CLONE_VM and with no new stack behave like fork(2): the child returns
    # 0 on a copy of our stack. It must leave at once, touching nothing (os._exit skips every
    # handler); the parent reaps it.
    libc.syscall.restype = ctypes.c_long
    pid = libc.syscall(ctypes.c_long(number), *args)
    if pid == 0:
        os._exit(0)
    if pid < 0:
        return {"ok": False, "errno": _errno()}
    os.waitpid(pid, 0)
    return {"ok": True, "errno": None}


def door_clone(libc: ctypes.CDLL) -> "dict[str, object]":
    number = SYS_CLONE.get(os.uname().machine)
    if number is None:
        return {"ok": False, "errno": None, "error": "no clone(2) number known for " + os.uname().machine}
    return _forked(
        libc,
        number,
        ctypes.c_ulong(CLONE_NEWUSER | SIGCHLD),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )


def door_clone3(libc: ctypes.CDLL) -> "dict[str, object]":
    # struct clone_args (linux/sched.h, CLONE_ARGS_SIZE_VER0 = 64): flags, pidfd, child_tid,
    # parent_tid, exit_signal, stack, stack_size, tls.
    args = ctypes.create_string_buffer(struct.pack("8Q", CLONE_NEWUSER, 0, 0, 0, SIGCHLD, 0, 0, 0))
    return _forked(libc, SYS_CLONE3, args, ctypes.c_ulong(64))


def door_unshare(libc: ctypes.CDLL) -> "dict[str, object]":
    # On success it moves the calling process (a child: see nested_userns) into a new user namespace.
    # unshare(2) fails with EINVAL in a multithreaded process; this program starts no threads.
    if libc.unshare(CLONE_NEWUSER) != 0:
        return {"ok": False, "errno": _errno()}
    return {"ok": True, "errno": None}


def in_child(fn: "Callable[[], dict[str, object]]") -> "dict[str, object]":
    # A door tried in a forked child, which reports on a pipe and leaves: a door that opens moves the
    # child (not us) into the new namespace, and a missing entry point kills only it (SIGSEGV).
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.write(w, json_dumps(observe(fn)).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        # int 0x80 with no IA32 emulation in the kernel (CONFIG_IA32_EMULATION=n, ia32_emulation=0)
        return {"ok": False, "errno": None, "absent": True, "signal": os.WTERMSIG(status)}
    if not data:
        return {"ok": False, "errno": None, "error": "the child said nothing"}
    got: dict[str, object] = json_loads(data.decode())
    return got


def _i386_unshare() -> "dict[str, object]":
    # The 32-bit entry point (int 0x80) from this 64-bit process: a seccomp filter that matches x86_64
    # syscall numbers and never checks seccomp_data.arch lets i386's unshare (310) through. The code is
    # written to a mapping that is then made executable (never writable and executable at once):
    #   push rbx; mov eax, 310; mov ebx, CLONE_NEWUSER; int 0x80; pop rbx; ret
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    libc.mmap.argtypes += [ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    code = b"\x53\xb8" + struct.pack("<I", I386_UNSHARE) + b"\xbb" + struct.pack("<I", CLONE_NEWUSER)
    code += b"\xcd\x80\x5b\xc3"
    addr = libc.mmap(None, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        return {"ok": False, "errno": None, "error": "mmap: " + _errno()}
    ctypes.memmove(addr, code, len(code))
    if libc.mprotect(addr, 4096, PROT_READ | PROT_EXEC) != 0:
        return {"ok": False, "errno": None, "error": "mprotect: " + _errno()}
    got = ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
    if got == 0:
        return {"ok": True, "errno": None}
    return {"ok": False, "errno": errno.errorcode.get(-got, str(-got)), "absent": -got == errno.ENOSYS}


def _x32_unshare() -> "dict[str, object]":
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(X32_SYSCALL_BIT | X32_UNSHARE), ctypes.c_ulong(CLONE_NEWUSER)) == 0:
        return {"ok": True, "errno": None}
    e = _errno()
    return {"ok": False, "errno": e, "absent": e == "ENOSYS"}  # the kernel has no x32 ABI


def _setns(fd: int) -> "dict[str, object]":
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, 0) == 0:
        return {"ok": True, "errno": None}
    return {"ok": False, "errno": _errno()}


def nested_userns(fds: "Sequence[int]" = ()) -> "dict[str, object]":
    # Every door to a new user namespace, each on its own: a seccomp filter that refuses unshare(2)
    # alone leaves clone(2) and clone3(2) open; one that matches x86_64 numbers alone leaves the i386
    # and x32 entry points open; a namespace descriptor the task was handed is a door of its own.
    libc = ctypes.CDLL(None, use_errno=True)
    doors: dict[str, object] = {}
    for name, door in (("clone", door_clone), ("clone3", door_clone3)):
        doors[name] = observe(door, libc)
    if os.uname().machine == "x86_64":
        doors["i386 unshare"] = in_child(_i386_unshare)
        doors["x32 unshare"] = in_child(_x32_unshare)
    own = namespaces()
    for fd in fds:
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        kind = link.split(":", 1)[0]
        if kind in NAMESPACES and link.endswith("]") and link != own.get(kind):
            doors[f"setns fd {fd} ({link})"] = in_child(functools.partial(_setns, fd))
    # In a child too: a door that opens moves the child, never the task, so the host's looks at the
    # task see one sandbox all its life.
    doors["unshare"] = in_child(functools.partial(door_unshare, libc))
    return doors


def shm_trial(key: int) -> "dict[str, object]":
    # The harness's System V segment (key), looked up without creating: ENOENT in an ipc namespace of
    # the task's own (ipc_namespaces(7)); found, or refused by its 0600 mode (EACCES), in the host's.
    libc = ctypes.CDLL(None, use_errno=True)
    got = libc.shmget(ctypes.c_int(key), ctypes.c_size_t(0), ctypes.c_int(0))
    if got < 0:
        return {"ok": False, "errno": _errno()}
    return {"ok": True, "errno": None}


# ---- other syscall doors (plan["doors"]) ----------------------------------------------------------
# Each kernel interface a sandbox usually closes, tried once with arguments that change nothing: the
# answer (opened, or the errno) is what the profile's [syscalls] table judges. bubblewrap's and
# Flatpak's try-syscall tests are the anchor. Every success is undone at once (a descriptor closed).
# New syscalls share one number on every architecture since Linux 5.1 (asm-generic/unistd.h).
SYS_IO_URING_SETUP, SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_FSOPEN = 425, 428, 429, 430
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "s390x": 280, "ppc64le": 271}
KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING = 0, -3  # <linux/keyctl.h>
OPEN_TREE_CLONE, AT_FDCWD = 1, -100  # <linux/mount.h>, <linux/fcntl.h>
PTRACE_SEIZE = 0x4206  # <linux/ptrace.h>
TIOCLINUX, TIOCL_GETFGCONSOLE = 0x541C, 12  # <asm-generic/ioctls.h>, <linux/tiocl.h>: a read


def _syscall(number: int, *args: object) -> "dict[str, object]":
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    got = libc.syscall(ctypes.c_long(number), *args)
    if got < 0:
        return {"ok": False, "errno": _errno()}
    return {"ok": True, "errno": None, "returned": got}


def _closing(number: int, *args: object) -> "dict[str, object]":
    # A door whose success is a descriptor (an io_uring, a filesystem context, a detached mount tree):
    # closed at once, which frees what it stands for.
    r = _syscall(number, *args)
    if r["ok"]:
        os.close(int(r["returned"]))  # type: ignore[call-overload]
    return r


def door_io_uring() -> "dict[str, object]":
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    return _closing(SYS_IO_URING_SETUP, ctypes.c_uint(1), params)


def door_keyctl() -> "dict[str, object]":
    # The session keyring the task inherited from whoever started it (keyrings(7)): docker's and
    # systemd's filters refuse keyctl because a caller's keys live there.
    number = SYS_KEYCTL.get(os.uname().machine)
    if number is None:
        return {"ok": False, "errno": None, "error": "no keyctl(2) number known for " + os.uname().machine}
    return _syscall(number, ctypes.c_long(KEYCTL_GET_KEYRING_ID), ctypes.c_long(KEY_SPEC_SESSION_KEYRING),
                    ctypes.c_long(0))


def door_fsopen() -> "dict[str, object]":
    # The new mount API's checks come first: fsopen(2) needs CAP_SYS_ADMIN over the task's mount
    # namespace (fs/fsopen.c), open_tree(OPEN_TREE_CLONE) and move_mount(2) may_mount() (fs/namespace.c).
    return _closing(SYS_FSOPEN, ctypes.c_char_p(b"tmpfs"), ctypes.c_uint(0))


def door_open_tree() -> "dict[str, object]":
    root = ctypes.c_char_p(b"/")
    return _closing(SYS_OPEN_TREE, ctypes.c_int(AT_FDCWD), root, ctypes.c_uint(OPEN_TREE_CLONE))


def door_move_mount() -> "dict[str, object]":
    # From and to a path that does not exist: with the capability it fails on the lookup (ENOENT) and
    # moves nothing, so ENOENT here means the door was open.
    nowhere = ctypes.c_char_p(b"/.sbxc-no-such-mount")
    here = ctypes.c_int(AT_FDCWD)
    r = _syscall(SYS_MOVE_MOUNT, here, nowhere, here, nowhere, ctypes.c_uint(0))
    if r.get("errno") == "ENOENT":
        return {"ok": True, "errno": None, "returned": "ENOENT: past the permission check"}
    return r


def door_vsock() -> "dict[str, object]":
    # Only the socket: AF_VSOCK is not in any network namespace before Linux 6.19, so a task whose
    # network is "none" that can make one may reach the hypervisor's host (never connected here: on a VM
    # the host's vsock ports are its control channel).
    family = getattr(socket, "AF_VSOCK", 40)
    return attempt(lambda: socket.socket(family, socket.SOCK_STREAM).close())


def door_ptrace(pid: int, cmdline: "Sequence[str]") -> "dict[str, object]":
    # PTRACE_SEIZE on the harness (a process outside the sandbox), from a child that leaves at once: a
    # tracer's exit detaches its tracees and lets them run on (ptrace(2)). The harness's host pid means
    # another process inside a pid namespace that has one with that number: such a one is not tried.
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            seen = f.read().split(b"\0")[:-1]
        if [a.decode(errors="replace") for a in seen] != list(cmdline):
            return {"ok": False, "errno": None, "absent": True, "error": "another process has that pid here"}
    except OSError:
        pass
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    got = libc.ptrace(ctypes.c_long(PTRACE_SEIZE), ctypes.c_long(pid), ctypes.c_void_p(0), ctypes.c_void_p(0))
    if got < 0:
        err = _errno()
        try:
            scope = read_text("/proc/sys/kernel/yama/ptrace_scope").strip()
        except OSError:
            scope = ""
        if err == "EPERM" and scope in ("2", "3"):
            # Yama refuses every attach without CAP_SYS_PTRACE (2) or every attach (3), sandbox or
            # none (Documentation/admin-guide/LSM/Yama.rst): nothing a sandbox refused here.
            return {"ok": False, "errno": err, "absent": True, "error": "Yama ptrace_scope " + scope}
        return {"ok": False, "errno": err}
    return {"ok": True, "errno": None}


def door_tioclinux() -> "dict[str, object]":
    # A virtual console's own ioctl (its selection can be pasted as typed input, like TIOCSTI); tried on
    # the first of the task's standard descriptors that is a terminal.
    import fcntl

    ttys = [fd for fd in (0, 1, 2) if os.isatty(fd)]
    if not ttys:
        return {"ok": False, "errno": None, "absent": True, "error": "no terminal among fds 0-2"}
    def ask() -> None:
        fcntl.ioctl(ttys[0], TIOCLINUX, bytes([TIOCL_GETFGCONSOLE]))

    got = attempt(ask)
    if got.get("errno") == "ENOTTY":
        # Only a virtual console answers TIOCLINUX (drivers/tty/vt/vt_ioctl.c); a pseudo-terminal has
        # no such ioctl at all: no door to open here, which is not a refusal.
        return {"ok": False, "errno": "ENOTTY", "absent": True, "error": "the terminal is no virtual console"}
    return got


def doors(spec: "Mapping[str, Any]") -> "dict[str, object]":
    out: dict[str, object] = {
        "io_uring_setup": observe(door_io_uring),
        "keyctl": observe(door_keyctl),
        "fsopen": observe(door_fsopen),
        "open_tree": observe(door_open_tree),
        "move_mount": observe(door_move_mount),
        "vsock_socket": observe(door_vsock),
        "tioclinux": observe(door_tioclinux),
    }
    if spec.get("ptrace_pid"):
        out["ptrace_outside"] = in_child(
            functools.partial(door_ptrace, spec["ptrace_pid"], spec.get("ptrace_cmdline", []))
        )
    return out


# ---- what the task holds and reaches (plan["reach"]) ---------------------------------------------------
# A sandbox leaks through more than its mount table: a descriptor the launcher left open, a process
# whose environment still holds the launcher's secret, a host sysctl, a device node, a host unix
# socket. Each is tried here; the host reads the same from its side (conformance/observer.py).

I386_UNSHARE = 310  # arch/x86/entry/syscalls/syscall_32.tbl
X32_SYSCALL_BIT, X32_UNSHARE = 0x40000000, 272  # arch/x86/entry/syscalls/syscall_64.tbl (x32: 64's number)
PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20
SO_ACCEPTCONN, SO_DOMAIN = 30, 39  # asm-generic/socket.h
# Opening a watchdog device arms it: a close without the magic 'V' leaves the host to reboot
# (Documentation/watchdog/watchdog-api.rst). Such a node is judged by access(2), never opened.
NEVER_OPEN = ("watchdog",)
WALK_ENTRIES = 3000
READ_LIMIT = 262144


def inherited_fds() -> "list[int]":
    # Called first, before this program opens anything: every descriptor then is one the sandbox (or
    # its launcher) handed the task. The listing's own descriptor is closed again when it returns.
    try:
        names = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        names = list(range(256))  # no /proc: try the low descriptors one by one
    out = []
    for fd in names:
        try:
            os.fstat(fd)
        except OSError:
            continue
        out.append(fd)
    return sorted(out)


def _kind(mode: int) -> str:
    for name, test in (
        ("dir", stat.S_ISDIR),
        ("file", stat.S_ISREG),
        ("socket", stat.S_ISSOCK),
        ("fifo", stat.S_ISFIFO),
        ("char", stat.S_ISCHR),
        ("block", stat.S_ISBLK),
    ):
        if test(mode):
            return name
    return "other"


def describe_fd(fd: int, secret: bytes) -> "dict[str, object]":
    st = os.fstat(fd)
    out: dict[str, object] = {"fd": fd, "type": _kind(st.st_mode)}
    try:
        out["link"] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError as e:
        out["link"] = "error: " + errname(e)
    if stat.S_ISDIR(st.st_mode):
        # A directory descriptor from outside lets the task walk from it, `..` included, past every
        # mount the sandbox made (runc CVE-2024-21626).
        out["listing"] = observe(lambda: sorted(os.listdir(fd))[:20])
        try:
            up = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        except OSError as e:
            out["parent"] = {"ok": False, "errno": errname(e)}
        else:
            try:
                out["parent"] = {"ok": True, "listing": sorted(os.listdir(up))[:20]}
            finally:
                os.close(up)
    elif stat.S_ISREG(st.st_mode):
        out["secret"] = bool(secret) and secret in os.pread(fd, READ_LIMIT, 0)
    elif stat.S_ISSOCK(st.st_mode):
        s = socket.socket(fileno=os.dup(fd))
        try:
            out["family"] = s.getsockopt(socket.SOL_SOCKET, SO_DOMAIN)
            out["listening"] = bool(s.getsockopt(socket.SOL_SOCKET, SO_ACCEPTCONN))
            try:
                out["peer"] = str(s.getpeername())
            except OSError as e:
                out["peer"] = "error: " + errname(e)
        finally:
            s.close()
    return out


def descriptors(fds: "Sequence[int]", secret: bytes) -> "list[dict[str, object]]":
    return [dict(observe(describe_fd, fd, secret), fd=fd) for fd in fds]


def _walk(
    roots: "Sequence[str]", depth: int, want: "Callable[[str, os.stat_result], bool]", xdev: bool = False
) -> "list[str]":
    # Breadth first, never following a symlink, at most WALK_ENTRIES entries looked at in all; with
    # xdev, never into a directory of another filesystem than the first root's (find -xdev).
    found: list[str] = []
    seen, level = 0, [r for r in roots if os.path.isdir(r) and not os.path.islink(r)]
    dev = os.lstat(level[0]).st_dev if xdev and level else None
    visited = set()
    for _ in range(depth):
        nxt = []
        for d in level:
            if d in visited:
                continue
            visited.add(d)
            try:
                names = sorted(os.listdir(d))
            except OSError:
                continue
            for name in names:
                seen += 1
                if seen > WALK_ENTRIES:
                    return found
                path = d.rstrip("/") + "/" + name
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if want(path, st):
                    found.append(path)
                if stat.S_ISDIR(st.st_mode) and (dev is None or st.st_dev == dev):
                    nxt.append(path)
        level = nxt
    return found


# Filesystems that hold no files of the host's: never walked for aliases.
PSEUDO_FS = (
    "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "mqueue", "tracefs", "debugfs",
    "securityfs", "bpf", "pstore", "configfs", "fusectl", "binfmt_misc", "hugetlbfs", "autofs", "nsfs",
    "efivarfs",
)


def alias_scan(
    canaries: "Sequence[Mapping[str, Any]]", own: "Sequence[str]", table: object
) -> "dict[str, object]":
    # A protected file's content under any other name, whatever shows it there: a hardlink or a second
    # bind (the same device and inode), a copy, an overlay of the host's tree (the same bytes: each
    # canary carries this run's nonce). Every mount that can hold files is walked on its own (find
    # -xdev, WALK_ENTRIES each); only a file of a canary's size, or of its inode, is read. A hit under
    # the protected path itself is its own witness's (masked, absent, hidden), not an alias.
    sizes = {int(c["size"]) for c in canaries}
    inodes = {(int(c["dev"]), int(c["ino"])) for c in canaries}
    contents = {unmask(c["masked"], c["key"]) for c in canaries}
    if isinstance(table, list):
        points = sorted({str(m["mount_point"]) for m in table if m.get("fstype") not in PSEUDO_FS})
    else:  # no mount table to read (a /proc that is not one): the root, and each directory at its top
        tops = [n for n in os.listdir("/") if n not in ("proc", "sys", "dev")]
        points = ["/", *("/" + n for n in sorted(tops))]
    found: list[str] = []
    same_inode: list[str] = []

    def candidate(path: str, st: os.stat_result) -> bool:
        return stat.S_ISREG(st.st_mode) and (st.st_size in sizes or (st.st_dev, st.st_ino) in inodes)

    for point in points:
        for path in _walk([point], 8, candidate, xdev=True):
            if any(path == n or path.startswith(n.rstrip("/") + "/") for n in own):
                continue
            try:
                st = os.stat(path)
                with open(path, "rb") as f:
                    data = f.read(4096)
            except OSError:
                continue  # unreadable under this name: nothing leaks through it
            if data in contents:
                found.append(path)
            elif (st.st_dev, st.st_ino) in inodes:
                same_inode.append(path)
    return {"found": sorted(set(found)), "same_inode": sorted(set(same_inode)), "mounts": len(points)}


def unmask(masked: str, key: str) -> bytes:
    """Bytes the plan carries XORed with a one-time key (conformance/plan.py mask): never in clear in a
    program a launcher may stage as a file the task can read."""
    return bytes(a ^ b for a, b in zip(bytes.fromhex(masked), bytes.fromhex(key)))  # noqa: B905 (3.10+)


def secret_scan(secret: bytes, paths: "Sequence[str]", roots: "Sequence[str]",
                procfs: "Sequence[str]" = ("/proc",)) -> "dict[str, object]":
    # Where the launcher's secret can still be read: the environment and argv of every process the task
    # can see, in every procfs it reaches (bwrap's own PID 1 keeps the environment it was started with:
    # --clearenv clears only the task's; the host's /proc bound in at /host/proc lists the launcher),
    # and the files a launcher hands a task (a .env in its directory, /run/secrets).
    found = []
    pids = []
    for top in procfs:
        try:
            listed = [top + "/" + n for n in os.listdir(top) if n.isdigit()]
        except OSError:
            continue
        # The task's own /proc whole, as before; another procfs (the host's, bound in) to a bound.
        pids += listed if top == "/proc" else listed[:2000]
    for pid in pids:
        for what in ("environ", "cmdline"):
            try:
                with open(pid + "/" + what, "rb") as f:
                    data = f.read(READ_LIMIT)
            except OSError:
                continue
            if secret in data:
                found.append(pid + "/" + what)
    files = list(paths) + _walk(roots, 3, lambda p, st: stat.S_ISREG(st.st_mode) and st.st_size <= READ_LIMIT)
    read = 0
    for path in files[:400]:
        try:
            with open(path, "rb") as f:
                data = f.read(READ_LIMIT)
        except OSError:
            continue
        read += 1
        if secret in data:
            found.append(path)
    return {"found": found, "processes": len(pids), "files_read": read}


def kernel_writes(paths: "Sequence[str]", write_back: "Sequence[str]") -> "list[dict[str, object]]":
    # Opened for writing, never written with a value of ours: the kernel checks a sysctl's permission at
    # open (fs/proc/proc_sysctl.c, proc_sys_permission), so an open that succeeds is the broken promise.
    # Where it does and the path is harmless, the value it already holds is written back, to prove it.
    # Some files check again at write: a sysctl (proc_sys_call_handler), a cgroup v1 release_agent
    # (EPERM without CAP_SYS_ADMIN in the initial user namespace since the CVE-2022-0492 fix,
    # cgroup1_release_agent_write): a write-back refused (write_errno) is recorded for the witness.
    out: list[dict[str, object]] = []
    for path in paths:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as e:
            out.append({"path": path, "opened": False, "errno": errname(e)})
            continue
        entry: dict[str, object] = {"path": path, "opened": True, "errno": None}
        try:
            if path in write_back:
                with open(path, "rb") as f:
                    held = f.read(8192)  # whole: a release_agent holds up to PATH_MAX
                # An empty value is written as a newline, which every one of these strips (strstrip).
                os.write(fd, held or b"\n")
                entry["wrote_back"] = True
        except OSError as e:
            entry["write_errno"] = errname(e)
        finally:
            os.close(fd)
        out.append(entry)
    return out


def cgroup_settings(table: object) -> "list[str]":
    # The host's cgroup hierarchies, where the task's mount table shows one from its very root: a root
    # the host's services and every other sandbox live under. Only a hierarchy's real root holds a v1
    # release_agent (a program the kernel runs as root, the CVE-2022-0492 escape) and lacks cgroup.type
    # in v2 (both CFTYPE_ONLY_ON_ROOT / CFTYPE_NOT_ON_ROOT, kernel/cgroup/cgroup.c): a mount a cgroup
    # namespace made shows its own root, which has it. cgroup.max.depth there caps every cgroup the
    # host makes (0 stops systemd and every container engine); its own value is written back.
    if not isinstance(table, list):
        return []
    out: list[str] = []
    for m in table:
        if not isinstance(m, dict):
            continue
        top = str(m.get("mount_point", "")).rstrip("/")
        if m.get("fstype") == "cgroup" and os.path.exists(top + "/release_agent"):
            out.append(top + "/release_agent")
        elif m.get("fstype") == "cgroup2" and not os.path.exists(top + "/cgroup.type"):
            out.append(top + "/cgroup.max.depth")
    return sorted(set(out))[:64]


def binfmt_settings(table: object) -> "list[str]":
    # Every binfmt_misc mount in the task's own table: its register names an interpreter the kernel runs
    # for each matching exec, opened (flag F) in the registering task's mount namespace. Opened for
    # writing, never written: whatever parses registers a handler. Whose instance it is (a user
    # namespace may mount its own since Linux 6.7), only the host can tell (observer.binfmt_mounts).
    if not isinstance(table, list):
        return []
    points = {str(m.get("mount_point", "")).rstrip("/") for m in table
              if isinstance(m, dict) and m.get("fstype") == "binfmt_misc"}
    return sorted(p + "/register" for p in points)[:16]


def _rdev(st: os.stat_result) -> str:
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


# How deep under /dev (and every other devtmpfs) nodes are looked for; observer.DEVICE_DEPTH is the same.
# /dev/bus/usb/BUS/DEV is 4 levels down (a USB device handed in with `--device`): 3 missed it.
DEVICE_DEPTH = 6


def device_trials(allowed: "Mapping[str, Any]", extra: "Sequence[str]",
                  roots: "Sequence[str]" = ("/dev",)) -> "list[dict[str, object]]":
    # Every device node under /dev and the other device filesystems `roots` (the host's /dev bound in
    # at /host/dev), and at the paths the plan names, each not on the allowlist opened read-only and
    # non-blocking, then write-only: what the task could do with it.
    nodes = _walk(list(roots), DEVICE_DEPTH,
                  lambda p, st: stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode))
    for p in extra:
        if p not in nodes and os.path.exists(p):
            nodes.append(p)
    out: list[dict[str, object]] = []
    for path in nodes[:500]:
        try:
            st = os.lstat(path)
        except OSError as e:
            out.append({"path": path, "error": errname(e)})
            continue
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            continue  # a mount point the plan named that is no device node
        entry: dict[str, object] = {"path": path, "rdev": _rdev(st), "kind": _kind(st.st_mode)}
        want = allowed.get(path)
        pts = path.startswith("/dev/pts/") and 136 <= os.major(st.st_rdev) <= 143
        # An allowlisted device wherever it is: OCI's maskedPaths binds /dev/null over a file
        # (/proc/kcore, /proc/keys), and /dev/null under another name is still only /dev/null.
        harmless = entry["rdev"] in allowed.values()
        if pts or harmless or (want is not None and (want == "*" or want == entry["rdev"])):
            entry["allowed"] = True
            out.append(entry)
            continue
        entry["allowed"] = False
        if os.path.basename(path).startswith(NEVER_OPEN):
            entry["opened"] = os.access(path, os.R_OK) or os.access(path, os.W_OK)
            entry["how"] = "access(2)"
            out.append(entry)
            continue
        refused = []
        entry["opened"] = False
        for flags in (os.O_RDONLY, os.O_WRONLY):
            try:
                fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            except OSError as e:
                refused.append(errname(e))
                continue
            os.close(fd)
            entry["opened"] = True
            entry["how"] = "O_RDONLY" if flags == os.O_RDONLY else "O_WRONLY"
            break
        entry["refused"] = refused
        out.append(entry)
    return out


def unix_trials(paths: "Sequence[str]", roots: "Sequence[str]") -> "list[dict[str, object]]":
    # Every unix socket file the task can find where services keep them, and the ones the plan names:
    # connect(2) only, nothing sent. A path socket is reached through the filesystem, whatever network
    # namespace the task is in (unix(7)): --unshare-net does not close it.
    found = [p for p in paths if os.path.exists(p)]
    for p in _walk(roots, 4, lambda p, st: stat.S_ISSOCK(st.st_mode)):
        if p not in found:
            found.append(p)
    out: list[dict[str, object]] = []
    ring = None  # one io_uring, made at the first refusal of socket(2), for every path after it
    try:
        for path in found[:200]:
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            except OSError as e:
                # No unix socket by socket(2) (srt's seccomp filter refuses socket(AF_UNIX)): refused by
                # the first step, unless io_uring makes and connects one past the filter.
                ring = open_ring() if ring is None else ring
                uring = uring_unix_connect(path, ring)
                if uring.get("ok"):
                    out.append(dict(uring, path=path))
                else:
                    out.append({"path": path, "ok": False, "errno": errname(e), "stage": "socket",
                                "io_uring": uring})
                continue
            s.settimeout(0.5)
            try:
                _connect_long(s, path)
            except OSError as e:
                if e.errno == errno.EPROTOTYPE:  # a datagram socket: try it as one
                    out.append(dict(_dgram(path), path=path, type="dgram"))
                else:
                    out.append({"path": path, "ok": False, "errno": errname(e)})
                continue
            finally:
                s.close()
            out.append({"path": path, "ok": True, "errno": None})
    finally:
        if isinstance(ring, _Ring):
            ring.close()
    return out


# io_uring makes and connects sockets without socket(2) or connect(2) (IORING_OP_SOCKET, Linux 5.19;
# IORING_OP_CONNECT, 5.5): a seccomp filter that refuses those syscalls does not see its requests
# (<linux/io_uring.h>; io_uring/net.c). Where socket(AF_UNIX) is refused, the task tries this too.
IORING_OP_CONNECT, IORING_OP_SOCKET = 16, 45
SYS_IO_URING_ENTER, IORING_ENTER_GETEVENTS = 426, 1
IORING_OFF_SQ_RING, IORING_OFF_CQ_RING, IORING_OFF_SQES = 0, 0x8000000, 0x10000000


class _Ring:
    """A one-entry io_uring, each request submitted and waited for alone."""

    def __init__(self) -> None:
        import mmap

        params = ctypes.create_string_buffer(120)  # struct io_uring_params
        got = _syscall(SYS_IO_URING_SETUP, ctypes.c_uint(1), params)
        if not got["ok"]:
            raise _Refused(str(got["errno"]))
        self.fd = int(got["returned"])  # type: ignore[call-overload]
        raw = params.raw
        sq_entries, cq_entries = struct.unpack_from("II", raw, 0)
        # struct io_sqring_offsets at 40: head, tail, ring_mask, ring_entries, flags, dropped, array;
        # struct io_cqring_offsets at 80: head, tail, ring_mask, ring_entries, overflow, cqes.
        sq = struct.unpack_from("IIIIIIIIQ", raw, 40)
        cq = struct.unpack_from("IIIIIIIIQ", raw, 80)
        self.sq_tail, self.sq_mask, self.sq_array = sq[1], sq[2], sq[6]
        self.cq_head, self.cq_mask, self.cqes = cq[0], cq[2], cq[5]
        shared = mmap.MAP_SHARED
        rw = mmap.PROT_READ | mmap.PROT_WRITE
        self.maps: list[mmap.mmap] = []  # in a function: never evaluated (PEP 526)
        try:
            for size, offset in ((self.sq_array + sq_entries * 4, IORING_OFF_SQ_RING),
                                 (self.cqes + cq_entries * 16, IORING_OFF_CQ_RING),
                                 (sq_entries * 64, IORING_OFF_SQES)):
                self.maps.append(mmap.mmap(self.fd, size, shared, rw, offset=offset))
        except BaseException:
            self.close()  # the ring's descriptor too: a map refused must not leave it open
            raise
        self.sq, self.cq, self.sqes = self.maps

    def run(self, opcode: int, fd: int, addr: int = 0, length: int = 0, off: int = 0) -> int:
        """One request; its result (a descriptor, 0, or -errno)."""
        tail = struct.unpack_from("I", self.sq, self.sq_tail)[0]
        index = tail & struct.unpack_from("I", self.sq, self.sq_mask)[0]
        sqe = struct.pack("BBHiQQIIQHHiQQ", opcode, 0, 0, fd, off, addr, length, 0, 1, 0, 0, 0, 0, 0)
        self.sqes[index * 64:index * 64 + 64] = sqe
        struct.pack_into("I", self.sq, self.sq_array + index * 4, index)
        struct.pack_into("I", self.sq, self.sq_tail, tail + 1)
        got = _syscall(SYS_IO_URING_ENTER, ctypes.c_uint(self.fd), ctypes.c_uint(1), ctypes.c_uint(1),
                       ctypes.c_uint(IORING_ENTER_GETEVENTS), None, ctypes.c_size_t(0))
        if not got["ok"]:
            return -int(getattr(errno, str(got["errno"]), errno.EIO))
        head = struct.unpack_from("I", self.cq, self.cq_head)[0]
        at = self.cqes + (head & struct.unpack_from("I", self.cq, self.cq_mask)[0]) * 16
        res = struct.unpack_from("QiI", self.cq, at)[1]
        struct.pack_into("I", self.cq, self.cq_head, head + 1)
        return int(res)

    def close(self) -> None:
        for m in self.maps:
            m.close()
        os.close(self.fd)


def open_ring() -> "_Ring | dict[str, object]":
    """A ring, or why there is none (the trial's record: the stage that refused, and its errno)."""
    try:
        return _Ring()
    except _Refused as e:
        return {"ok": False, "errno": str(e), "stage": "io_uring_setup"}
    except (OSError, ValueError) as e:  # the rings would not map
        why = errname(e) if isinstance(e, OSError) else None
        return {"ok": False, "errno": why, "stage": "io_uring mmap"}


class _Refused(Exception):
    """io_uring_setup(2) refused, with the errno's name."""


def uring_unix_connect(path: str, ring: "_Ring | dict[str, object] | None" = None) -> "dict[str, object]":
    """socket(AF_UNIX) and connect(2) to `path` as io_uring requests: what a task refused the syscalls
    by a seccomp filter still reaches where io_uring is open to it. `ring`: one open_ring() made for
    every path (its refusal then stands for each); None: a ring of its own, closed after."""
    own = ring is None
    if ring is None:
        ring = open_ring()
    if isinstance(ring, dict):
        return dict(ring)
    dir_fd = -1
    try:
        encoded = path.encode()
        if len(encoded) >= 100:
            # As _connect_long: the directory by a magic link of /proc/self/fd, which the kernel
            # resolves at connect time whoever opened it (the ring's requests run as this task).
            try:
                dir_fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
            except OSError as e:
                return {"ok": False, "errno": errname(e), "stage": "path"}
            encoded = ("/proc/self/fd/" + str(dir_fd) + "/" + os.path.basename(path)).encode()
            if len(encoded) >= 108:
                return {"ok": False, "errno": None, "stage": "path", "error": "a name past sun_path"}
        addr = ctypes.create_string_buffer(struct.pack("H", socket.AF_UNIX) + encoded + b"\0")
        last: dict[str, object] = {}
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            fd = ring.run(IORING_OP_SOCKET, socket.AF_UNIX, off=kind | socket.SOCK_NONBLOCK)
            if fd < 0:
                return {"ok": False, "errno": errno.errorcode.get(-fd, str(-fd)), "stage": "io_uring socket"}
            try:
                res = ring.run(IORING_OP_CONNECT, fd, addr=ctypes.addressof(addr), off=len(addr.raw))
            finally:
                os.close(fd)
            if res == 0:
                kind_name = "dgram" if kind == socket.SOCK_DGRAM else "stream"
                return {"ok": True, "errno": None, "via": "io_uring", "type": kind_name}
            last = {"ok": False, "errno": errno.errorcode.get(-res, str(-res)), "stage": "io_uring connect"}
            if -res != errno.EPROTOTYPE:
                break
        return last
    finally:
        if dir_fd >= 0:
            os.close(dir_fd)
        if own:
            ring.close()


def _dgram(path: str) -> "dict[str, object]":
    # connect(2), then, where that is refused, an empty sendmsg(2) to the path: a filter that refuses
    # connect and sendto but not sendmsg (the Codex CLI's seccomp, measured) still lets a datagram out.
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    except OSError as e:
        return {"ok": False, "errno": errname(e), "stage": "socket"}
    try:
        try:
            _connect_long(s, path)
            return {"ok": True, "errno": None, "via": "connect"}
        except OSError as e:
            refused = errname(e)
        try:
            s.sendmsg([b""], [], 0, path)
        except OSError as e:
            return {"ok": False, "errno": refused, "sendmsg": errname(e)}
        return {"ok": True, "errno": None, "via": "sendmsg"}
    finally:
        s.close()


def _connect_long(s: socket.socket, path: str) -> None:
    # sun_path holds 108 bytes (unix(7)): a longer path is reached through /proc/self/fd/N/name, a
    # magic link the kernel resolves to the socket's directory.
    if len(path.encode()) < 100:
        s.connect(path)
        return
    fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    try:
        s.connect("/proc/self/fd/" + str(fd) + "/" + os.path.basename(path))
    finally:
        os.close(fd)


def terminal_trials() -> "dict[str, object]":
    # The launch's stderr is a terminal the harness holds, and the launcher's controlling terminal: the
    # way a user runs a sandbox from a shell. TIOCSTI pushes a byte into that terminal's input, where
    # the shell would read it as typed (bwrap CVE-2017-5226: no --new-session). The kernel allows it
    # on the caller's controlling terminal only (drivers/tty/tty_io.c tiocsti), unless the host
    # disabled it for everyone (dev.tty.legacy_tiocsti = 0, Linux 6.2).
    import fcntl
    import termios

    out: dict[str, object] = {"isatty": os.isatty(2), "session_leader": os.getsid(0) == os.getpid()}
    def push() -> None:
        fcntl.ioctl(2, termios.TIOCSTI, b"#")

    out["tiocsti"] = attempt(push)
    out["dev_tty"] = attempt(lambda: os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)))
    out["tioclinux"] = observe(door_tioclinux)  # the [syscalls] door, on a terminal at last
    return out


def _mounts_of(table: object, fstype: str) -> "list[dict[str, object]]":
    return [m for m in table if isinstance(m, dict) and m.get("fstype") == fstype][:50] \
        if isinstance(table, list) else []


def elsewhere(paths: "Sequence[str]", table: object) -> "list[str]":
    # The kernel's files under another name: a procfs or sysfs mounted (or a sub-tree of one bound) at
    # a second place (the host's /proc at /host/proc, a monitoring agent's way) offers the same sysctls
    # there, whatever the task's own /proc and /sys do.
    out: list[str] = []
    for fstype, top in (("proc", "/proc"), ("sysfs", "/sys")):
        for m in _mounts_of(table, fstype):
            root, point = str(m.get("root", "/")), str(m.get("mount_point", ""))
            source = top + ("" if root == "/" else root)
            if point == top and root == "/":
                continue  # the usual place: the plan's paths already are these
            for path in paths:
                there = point.rstrip("/") + path[len(source):]
                if path.startswith(source + "/") and there != path and there not in out:
                    out.append(there)  # (nspawn binds /proc/sys over itself: the same path, tried once)
    return out[:100]


def reach(spec: "Mapping[str, Any]", fds: "Sequence[int]", doc: "dict[str, object]") -> None:
    secret = unmask(spec.get("secret_masked", ""), spec.get("secret_key", ""))
    doc["descriptors"] = observe(descriptors, fds, secret)
    roots = [r for r in (os.environ.get("HOME"), observe(os.getcwd)) if isinstance(r, str)]
    table = doc.get("mountinfo")
    procfs = ["/proc", *[str(m["mount_point"]) for m in _mounts_of(table, "proc")
                         if m.get("root") == "/" and m.get("mount_point") != "/proc"]]
    if secret:
        doc["secrets"] = observe(secret_scan, secret, spec.get("secret_paths", []), [*roots, "/run/secrets"],
                                 procfs)
    if spec.get("kernel_paths"):
        found = observe(cgroup_settings, table)
        cgroups = found if isinstance(found, list) else []
        found = observe(binfmt_settings, table)
        binfmt = found if isinstance(found, list) else []
        paths = [*spec["kernel_paths"], *elsewhere(spec["kernel_paths"], table)]
        doc["kernel_writes"] = observe(
            kernel_writes, [*paths, *cgroups, *binfmt], [*spec.get("write_back", []), *cgroups]
        )
    else:
        doc["kernel_writes"] = []
    # A node bound next to a minimal /dev (at /kvm, say) is a mount point: every one is tried too.
    points = [str(m["mount_point"]) for m in table if isinstance(m, dict)] if isinstance(table, list) else []
    devfs = ["/dev", *[str(m["mount_point"]) for m in _mounts_of(table, "devtmpfs")
                       if m.get("mount_point") != "/dev"]]
    sockets = [*spec.get("socket_roots", []), *roots]
    doc["unix_sockets"] = observe(unix_trials, spec.get("unix_paths", []), sockets)
    # The last trial before the announce: the host's reading of the same nodes follows it, and a node
    # made in between (a pseudo-terminal another program opened) is one the task never saw.
    doc["devices"] = observe(device_trials, spec.get("devices_allowed", {}), points, devfs)


def aliases(spec: "Mapping[str, Any]", doc: "dict[str, object]") -> None:
    # The longest of the task's own checks (every file-holding mount walked), made while the host reads
    # the task at the handshake rather than before it: it opens only files on the task's own mounts,
    # which no host reading judges.
    if spec.get("canaries"):
        table = doc.get("mountinfo")
        doc["aliases"] = observe(alias_scan, spec["canaries"], spec.get("protected", []), table)


# ---- cgroup trials (plan["cgroup"], present only when the harness gave the task a leaf) ----------


def memory_trial(size: int) -> "dict[str, int | None]":
    # A forked child allocates `size` bytes in 16 MiB steps; bytes * n fills every page (a bytearray
    # would be calloc'd pages never touched, never charged). Past memory.max the memcg OOM killer
    # SIGKILLs the biggest task in the leaf: this child (mm/oom_kill.c, oom_badness: rss + page
    # tables). The parent only reports how the child ended.
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            held, got, step = [], 0, 16 << 20
            while got < size:
                held.append(b"x" * step)
                got += step
        except MemoryError:
            code = 3
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return {
        "size": size,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
    }


def pids_trial(tries: int) -> "dict[str, object]":
    # Fork until refused (at most `tries` times): each child blocks on a pipe so it holds its pid
    # until we are done counting, then every child is released and reaped. pids.max refuses fork(2)
    # with EAGAIN (kernel/cgroup/pids.c, pids_can_fork).
    r, w = os.pipe()
    children, refused = [], None
    try:
        for _ in range(tries):
            try:
                pid = os.fork()
            except OSError as e:
                refused = errname(e)
                break
            if pid == 0:
                try:
                    os.close(w)
                    os.read(r, 1)
                finally:
                    os._exit(0)
            children.append(pid)
    finally:
        os.close(w)  # EOF on every child's read: they all exit
        os.close(r)
        for pid in children:
            os.waitpid(pid, 0)
    return {"tries": tries, "forked": len(children), "refused": refused}


def write_existing(path: str, data: str) -> None:
    # O_WRONLY without O_CREAT: a cgroup interface file is never created by a write.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def _sleeper(hold: float) -> "NoReturn":
    # A member of the tree: holds nothing of ours (stdout would keep the harness's pipe open) and
    # sleeps until the harness's cgroup.kill, or `hold` seconds.
    try:
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        time.sleep(hold)
    finally:
        os._exit(0)


def spawn_tree(hold: float) -> "list[dict[str, object]]":
    # A child, and a child that left our session (setsid) with a grandchild: a kill of our process
    # group or session would miss the last two; cgroup.kill must not.
    r, w = os.pipe()
    first = os.fork()
    if first == 0:
        _sleeper(hold)
    second = os.fork()
    if second == 0:
        try:
            os.close(r)
            os.setsid()
            grand = os.fork()
            if grand == 0:
                _sleeper(hold)
            os.write(w, (str(grand) + "\n").encode())
            os.close(w)
        finally:
            _sleeper(hold)
    os.close(w)
    got = b""
    while not got.endswith(b"\n"):
        chunk = os.read(r, 64)
        if not chunk:
            break
        got += chunk
    os.close(r)
    return [
        {"pid": first, "role": "child"},
        {"pid": second, "role": "setsid child"},
        {"pid": int(got.strip() or 0), "role": "setsid grandchild"},
    ]


def open_marker(path: str) -> int:
    # Opened (created) now, written only after the document is out: creating a file after a
    # successful nested unshare(CLONE_NEWUSER) would fail (EOVERFLOW: our uid is unmapped there),
    # writing to an open descriptor does not.
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)


def cgroup_trials(cg: "Mapping[str, Any]", doc: "dict[str, object]") -> "int | None":
    doc["cgroup_self"] = observe(read_text, "/proc/self/cgroup")
    if cg.get("memory_alloc"):
        doc["memory_trial"] = observe(memory_trial, cg["memory_alloc"])
    if cg.get("pids_forks"):
        doc["pids_trial"] = observe(pids_trial, cg["pids_forks"])
    doc["neighbour_writes"] = [
        dict(w, result=observe(attempt, lambda w=w: write_existing(w["path"], w["data"])))
        for w in cg.get("neighbour_writes", [])
    ]
    doc["tree"] = observe(spawn_tree, cg.get("hold_seconds", 20))
    try:
        return open_marker(cg["tree_marker"])
    except OSError as e:
        doc["tree_marker"] = {"error": errname(e)}
        return None


def observe(fn: "Callable[[Unpack[Ts]], T]", *args: "Unpack[Ts]") -> "T | dict[str, str]":
    try:
        return fn(*args)
    except Exception as e:  # recorded, and the witness that needs it fails: never a silent pass
        out = {"error": type(e).__name__ + ": " + str(e)}
        if isinstance(e, OSError) and e.errno:
            out["errno"] = errname(e)
        return out


def main(plan: "Mapping[str, Any]") -> None:
    fds = inherited_fds()
    tagged = take_tag(plan["tag"]) if plan.get("tag") else None
    doc: dict[str, object] = {
        "version": VERSION,
        "task_id": plan.get("task_id"),
        "complete": False,
        "launch_nonce": plan.get("launch_nonce"),
    }
    if tagged:
        doc["handshake"] = {"error": tagged}
    if plan.get("terminal"):
        doc["terminal"] = observe(terminal_trials)
    doc["ops"] = [dict(op, result=observe(do_op, op)) for op in plan.get("ops", [])]
    doc["mountinfo"] = observe(mountinfo)
    doc["status"] = observe(status)
    doc["ids"] = {"uid": os.getuid(), "gid": os.getgid(), "euid": os.geteuid()}
    doc["uid_map"] = observe(read_text, "/proc/self/uid_map")
    doc["gid_map"] = observe(read_text, "/proc/self/gid_map")
    doc["namespaces"] = observe(namespaces)
    doc["interfaces"] = observe(lambda: sorted(name for _, name in socket.if_nameindex()))
    doc["tcp"] = [{"target": t, "result": observe(connect_tcp, t)} for t in plan.get("tcp", [])]
    doc["unix_abstract"] = [
        {"target": n, "result": observe(attempt, lambda n=n: connect_abstract(n))}
        for n in plan.get("unix_abstract", [])
    ]
    if plan.get("proxy"):
        doc["proxies"] = observe(proxy_trials, plan["proxy"])
    doc["pid"] = os.getpid()
    doc["processes"] = observe(processes, plan.get("look_for", []))
    doc["hostname"] = observe(socket.gethostname)
    doc["environment"] = observe(environment)
    doc["cwd"] = observe(os.getcwd)
    doc["kernel"] = observe(kernel_view)
    if plan.get("reach"):
        reach(plan["reach"], fds, doc)
    announced = observe(announce, plan) if plan.get("tag") and not tagged else None
    if plan.get("reach"):
        aliases(plan["reach"], doc)
    if isinstance(announced, float):
        doc["handshake"] = observe(handshake, plan, announced)
        doc["after_release"] = observe(after_release)
    elif announced is not None:
        doc["handshake"] = announced
    cg: Mapping[str, Any] = plan.get("cgroup") or {}
    marker = cgroup_trials(cg, doc) if cg else None
    if plan.get("nested_userns", True):
        doc["nested_userns"] = observe(nested_userns, fds)
    if plan.get("doors"):
        doc["doors"] = observe(doors, plan["doors"])
    if plan.get("shm_key"):
        doc["shm"] = observe(shm_trial, plan["shm_key"])
    doc["complete"] = True
    sys.stdout.write(json_dumps(doc) + "\n")
    sys.stdout.flush()
    if marker is not None:
        # The document is out: tell the harness (on the host) that the tree is in place. It kills
        # the whole leaf (cgroup.kill), us included; the sleep only bounds a harness that never does.
        os.write(marker, (json_dumps({"pid": os.getpid(), "ready": True}) + "\n").encode())
        os.close(marker)
        time.sleep(cg.get("hold_seconds", 20))


if __name__ == "__main__":
    main(json_loads(PLAN))  # noqa: F821 - PLAN is the line the harness prepends
