# The witness program: runs INSIDE the task as `python3 -I -S -`, its source fed on stdin, so the
# sandbox need not see any of our files. Stdlib only, imports nothing of ours, and no syntax newer
# than Python 3.6 (the task's interpreter is the sandbox's, not ours): no annotations, no f-string
# `=`, no walrus, no `from __future__` (the harness prepends the plan line above this file).
#
# It reads PLAN (a JSON string the harness prepends as the first line), makes every observation the
# plan asks for, and prints ONE JSON document ending with "complete": true. One launch answers
# every witness of a task. Each observation is wrapped: an observation that raises is recorded as
# {"error": ...} instead of killing the document, and the witness that needs it fails saying so.
import ctypes
import errno
import json
import os
import socket
import sys

VERSION = 1
CLONE_NEWUSER = 0x10000000  # <linux/sched.h>
STATUS_KEYS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Uid", "Gid")
NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "user", "uts")


def errname(e):
    return errno.errorcode.get(e.errno, str(e.errno)) if getattr(e, "errno", None) else type(e).__name__


def attempt(fn):
    try:
        value = fn()
    except OSError as e:
        return {"ok": False, "errno": errname(e)}
    out = {"ok": True, "errno": None}
    if value is not None:
        out["value"] = value
    return out


def do_stat(path):
    st = os.lstat(path)
    kind = (
        "dir"
        if os.path.isdir(path) and not os.path.islink(path)
        else ("file" if os.path.isfile(path) else ("link" if os.path.islink(path) else "other"))
    )
    return {"type": kind, "mode": oct(st.st_mode & 0o7777), "uid": st.st_uid}


def do_list(path):
    return sorted(os.listdir(path))[:200]


def do_read(path):
    with open(path, "rb") as f:
        return f.read(4096).decode("utf-8", "replace")


def do_append(path, data):
    # O_APPEND without O_CREAT: an append must not be able to create the file it is refused on.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def do_create(path, data):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def do_op(op):
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


def unescape(field):
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


def mountinfo():
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


def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in STATUS_KEYS:
                out[key] = value.strip()
    return out


def read_text(path, limit=4096):
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")


def namespaces():
    out = {}
    for ns in NAMESPACES:
        try:
            out[ns] = os.readlink("/proc/self/ns/" + ns)
        except OSError as e:
            out[ns] = "error: " + errname(e)
    return out


def processes():
    procs = []
    for name in sorted(os.listdir("/proc"), key=lambda n: (len(n), n)):
        if not name.isdigit():
            continue
        entry = {"pid": int(name)}
        try:
            entry["comm"] = read_text("/proc/" + name + "/comm").strip()
            entry["cmdline"] = read_text("/proc/" + name + "/cmdline", 512).split("\0")
            while entry["cmdline"] and entry["cmdline"][-1] == "":
                entry["cmdline"].pop()
            for line in read_text("/proc/" + name + "/status").splitlines():
                if line.startswith("PPid:"):
                    entry["ppid"] = int(line.split()[1])
        except OSError as e:
            entry["error"] = errname(e)  # exited meanwhile, or hidden by hidepid
        procs.append(entry)
        if len(procs) >= 300:
            break
    return procs


def connect_tcp(target):
    host, port = target
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(1.0)  # refused or unreachable is immediate in an empty netns; a drop must not hang us
    try:
        s.connect((host, port))
    finally:
        s.close()


def connect_abstract(name):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect("\0" + name)  # abstract sockets live in the network namespace (unix(7))
    finally:
        s.close()


def environment_keys():
    # /proc/self/environ is the environment the task was exec'd with; os.environ is not: CPython's
    # locale coercion (PEP 538) adds LC_CTYPE to it after start-up, which the sandbox did not pass.
    with open("/proc/self/environ", "rb") as f:
        raw = f.read()
    return sorted(set(kv.split(b"=", 1)[0].decode("utf-8", "replace") for kv in raw.split(b"\0") if kv))


def nested_userns():
    # Last observation of all: on success it moves this process into a new user namespace.
    # unshare(2) fails with EINVAL in a multithreaded process; this program starts no threads.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER) != 0:
        return {"ok": False, "errno": errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))}
    return {"ok": True, "errno": None}


def observe(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # recorded, and the witness that needs it fails: never a silent pass
        return {"error": type(e).__name__ + ": " + str(e)}


def main(plan):
    doc = {"version": VERSION, "task_id": plan.get("task_id"), "complete": False}
    doc["ops"] = [dict(op, result=observe(do_op, op)) for op in plan.get("ops", [])]
    doc["mountinfo"] = observe(mountinfo)
    doc["status"] = observe(status)
    doc["ids"] = {"uid": os.getuid(), "gid": os.getgid(), "euid": os.geteuid()}
    doc["uid_map"] = observe(read_text, "/proc/self/uid_map")
    doc["gid_map"] = observe(read_text, "/proc/self/gid_map")
    doc["namespaces"] = observe(namespaces)
    doc["interfaces"] = observe(lambda: sorted(name for _, name in socket.if_nameindex()))
    doc["tcp"] = [
        {"target": t, "result": observe(attempt, lambda t=t: connect_tcp(t))} for t in plan.get("tcp", [])
    ]
    doc["unix_abstract"] = [
        {"target": n, "result": observe(attempt, lambda n=n: connect_abstract(n))}
        for n in plan.get("unix_abstract", [])
    ]
    doc["pid"] = os.getpid()
    doc["processes"] = observe(processes)
    doc["hostname"] = observe(socket.gethostname)
    doc["environment_keys"] = observe(environment_keys)
    doc["cwd"] = observe(os.getcwd)
    if plan.get("nested_userns", True):
        doc["nested_userns"] = observe(nested_userns)
    doc["complete"] = True
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(json.loads(PLAN))  # noqa: F821 - PLAN is the line the harness prepends
