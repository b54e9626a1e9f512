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
import time

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


# ---- cgroup trials (plan["cgroup"], present only when the harness gave the task a leaf) ----------


def memory_trial(size):
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


def pids_trial(tries):
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


def write_existing(path, data):
    # O_WRONLY without O_CREAT: a cgroup interface file is never created by a write.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def _sleeper(hold):
    # A member of the tree: holds nothing of ours (stdout would keep the harness's pipe open) and
    # sleeps until the harness's cgroup.kill, or `hold` seconds.
    try:
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        time.sleep(hold)
    finally:
        os._exit(0)


def spawn_tree(hold):
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


def open_marker(path):
    # Opened (created) now, written only after the document is out: creating a file after a
    # successful nested unshare(CLONE_NEWUSER) would fail (EOVERFLOW: our uid is unmapped there),
    # writing to an open descriptor does not.
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)


def cgroup_trials(cg, doc):
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
    cg = plan.get("cgroup")
    marker = cgroup_trials(cg, doc) if cg else None
    if plan.get("nested_userns", True):
        doc["nested_userns"] = observe(nested_userns)
    doc["complete"] = True
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()
    if marker is not None:
        # The document is out: tell the harness (on the host) that the tree is in place. It kills
        # the whole leaf (cgroup.kill), us included; the sleep only bounds a harness that never does.
        os.write(marker, (json.dumps({"pid": os.getpid(), "ready": True}) + "\n").encode())
        os.close(marker)
        time.sleep(cg.get("hold_seconds", 20))


if __name__ == "__main__":
    main(json.loads(PLAN))  # noqa: F821 - PLAN is the line the harness prepends
