"""A negative control's launcher: the reference sandbox (conformance/bwrap_argv.py, embedded profile)
with ONE thing changed, for promises the reference launcher cannot perturb itself.

    python -m sandbox_conformance.conformance.control_launchers.reference [--disable-userns] \
        [--append=WORD]... [--join] [--mask-copy] [--offer-proxy] [--landlock-refuse=DIR] -- CMD...

Run by the witness suite as an external launcher (`--launcher 'PREFIX'`): the layout values come
from the task spec named by $SANDBOX_CONFORMANCE_TASK_SPEC, CMD is `python3 -I -S -` with the witness
program on stdin.

--append=WORD  extra bwrap words after the reference argv. bwrap applies its setup operations in
               command-line order, so an appended mount or --remount-ro wins over the reference's.
--join         NoNewPrivs control. bwrap calls prctl(PR_SET_NO_NEW_PRIVS) unconditionally before it
               execs the command (bubblewrap.c), and the bit can never be cleared, so no bwrap argv
               can run a task without it. Instead the reference sandbox runs a holder process, and
               CMD enters the holder's namespaces, root and working directory from outside with
               setns(2) (what nsenter(1) does), drops every capability (including the bounding set,
               as bwrap does) and gets the profile's environment: the same sandbox, minus the bit.

--mask-copy        over each masked path, a read-only tmpfs of the sandbox's own holding a COPY of the
                   host's files there: no host storage mounted, the content readable all the same.
--offer-proxy      what srt adds: an HTTP proxy on the host (here one that tunnels to any name),
                   relayed into the task's network namespace at 127.0.0.1:3128 and named in
                   HTTP(S)_PROXY. The launcher serves it while bwrap runs, as a child.
--landlock-refuse=DIR  a Landlock ruleset, made in the sandbox before the task, that refuses every
                   write beneath DIR with EACCES (landlock(7)); with DIR bound read-write, nothing
                   lands, but the refusal is not EROFS.
--seccomp-refuse=SYSCALL  a seccomp filter that refuses one thing with EPERM: `unshare` (and forgets
                   clone(2)), or `socket-unix`, socket(2) of AF_UNIX (and forgets io_uring).

What the task holds and reaches (issue 26), each the mistake of a real sandbox:
--secret-file      a .env holding the launcher's secret, written into the task's working directory.
--leak-dir         a directory descriptor of the layout's root left open into the task (runc
                   CVE-2024-21626: openat(fd, "..") walks the host's tree past every mount).
--leak-socket      a TCP connection of the launcher's, on the host's loopback, left open.
--leak-netns       a descriptor of the host's network namespace left open.
--bind-daemon-socket  the harness's planted daemon socket bound in at /run/agentd.sock.
--seccomp-x86-64-only  a filter that refuses user namespaces by x86_64 syscall numbers and never checks
                   the architecture, so the i386 entry point (int 0x80) creates one.
--exec-late        what `runc exec` did in CVE-2024-21626: once the host has released the task from its
                   handshake, a process enters the sandbox's namespaces and root from outside holding a
                   descriptor of the layout's root (a host directory), with its cwd there, and sleeps.
--exec-late-env    as --exec-late, but the entering process holds no host directory: it carries the
                   launcher's environment, the planted secret with it (`docker exec -e TOKEN=...`).
--helper-late      a helper of the sandbox's, started in its pid namespace and root before the host's
                   handshake look and holding nothing that leads out, is handed a descriptor of the
                   layout's root over a unix socket (SCM_RIGHTS, a broker's way) once the task is released.
--binfmt-bound     the host's binfmt_misc instance (the initial user namespace's, mounted in a private
                   mount namespace of the launcher's) bound in read-write at /proc/sys/fs/binfmt_misc,
                   as `-v /proc/sys/fs/binfmt_misc:...` gives a container that registers qemu handlers.

Built to fool an observer (issue 27); both rewrite the witness program they get on stdin:
--decoy            a decoy in the honest reference sandbox carries the task's tag and waits to be
                   looked at, while the real task (another tag) runs with the host's ipc namespace and
                   every capability, and prints the document.
--late-seccomp     the task applies a seccomp filter just before it announces the handshake: the
                   sandbox the host reads then is not the one the task ran in until that moment.
--defeat=SIGNAL    a defeat device: the honest reference sandbox only when the launch looks like a
                   witness run by SIGNAL (spec: $SANDBOX_CONFORMANCE_TASK_SPEC is set; argv: the command
                   is `python3 -I -S -`; stdin: it starts with the witness's PLAN line; names: a
                   SANDBOX_CONFORMANCE_* variable is set), and the host's network shared otherwise.

--disable-userns is passed by the `controls` command when the disable_userns probe says it works
(the reference launcher's own rule). Exit status: CMD's; 70 (EX_SOFTWARE) when the sandbox could
not be set up, with one line on stderr."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

EX_SOFTWARE = 70
# linux/nsfs.h: _IO(0xb7, 0x1): an fd for the user namespace that owns a namespace.
NS_GET_USERNS = 0xB701
# linux/sched.h
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
# linux/prctl.h
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
# Joined after the owning user namespace, before the task's own (nested) one. pid last: it only
# applies to children, which is why the task is forked after the joins.
NAMESPACES = (
    ("mnt", CLONE_NEWNS),
    ("net", CLONE_NEWNET),
    ("ipc", CLONE_NEWIPC),
    ("uts", CLONE_NEWUTS),
    ("cgroup", CLONE_NEWCGROUP),
    ("pid", CLONE_NEWPID),
)
HOLDER = "import sys; sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()"
BWRAP_EXIT_TIMEOUT = 20.0


class SandboxNotSetUp(Exception):
    """The perturbed sandbox could not be set up: the witness run reports a harness error."""


def _parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    if "--" not in argv:
        raise SandboxNotSetUp("expected `-- CMD...` after the options")
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="sandbox_conformance.conformance.control_launchers.reference")
    p.add_argument("--disable-userns", action="store_true")
    p.add_argument("--append", action="append", default=[])
    p.add_argument("--join", action="store_true")
    p.add_argument("--drop", action="append", default=[], help="a word to remove from the reference argv")
    p.add_argument("--forge-proc", action="store_true")
    p.add_argument("--seccomp-refuse", action="append", default=[], metavar="SYSCALL")
    p.add_argument("--leak-secret-as", metavar="KEY")
    p.add_argument("--stale-control", action="store_true")
    p.add_argument("--leave-daemon", action="store_true")
    p.add_argument("--forge-document", action="store_true")
    p.add_argument("--mask-copy", action="store_true")
    p.add_argument("--offer-proxy", action="store_true")
    p.add_argument("--landlock-refuse", metavar="DIR")
    p.add_argument("--secret-file", action="store_true")
    p.add_argument("--canary-hardlink", action="store_true")
    p.add_argument("--canary-copy", action="store_true")
    p.add_argument("--leak-dir", action="store_true")
    p.add_argument("--leak-socket", action="store_true")
    p.add_argument("--leak-netns", action="store_true")
    p.add_argument("--bind-daemon-socket", action="store_true")
    p.add_argument("--seccomp-x86-64-only", action="store_true")
    p.add_argument("--binfmt-bound", action="store_true")
    p.add_argument("--exec-late", action="store_true")
    p.add_argument("--exec-late-env", action="store_true")
    p.add_argument("--helper-late", action="store_true")
    p.add_argument("--task", metavar="TASK_ID")
    p.add_argument("--user", metavar="NAME", help="the layout's user ([layout] user; default alice)")
    p.add_argument("--defeat", choices=("spec", "argv", "stdin", "names"))
    p.add_argument("--decoy", action="store_true")
    p.add_argument("--late-seccomp", action="store_true")
    args = p.parse_args(argv[:cut])
    if args.task:
        _LAYOUT.update(_layout_here(args.task, args.user))
    cmd = argv[cut + 1 :]
    if not cmd:
        raise SandboxNotSetUp("no command after --")
    return args, cmd


_LAYOUT: dict[str, str] = {}  # the placeholders' values: see _layout_here


def _layout_here(task_id: str, user: str | None = None) -> dict[str, str]:
    """The layout's values from where the launcher runs (the layout's root, conformance/layout.py) and
    the task id (and user) in its argv: a platform's sandbox knows its own paths, and the witness run
    gives this one no task spec. The other user is whoever else has a tree there."""
    from sandbox_conformance.conformance.layout import USER, Layout

    root, user = Path.cwd(), user or USER
    users = root / "state" / "users"
    tasks = users / user / "tasks"
    others = [d.name for d in tasks.iterdir() if d.name != task_id] if tasks.is_dir() else []
    other_users = [d.name for d in users.iterdir() if d.name != user] if users.is_dir() else []
    if not (tasks / task_id).is_dir() or len(others) != 1 or len(other_users) != 1:
        raise SandboxNotSetUp(f"{root}: not a witness layout for task {task_id} of {user}")
    lay = Layout(root, "", task_id, others[0], user, os.getuid(), os.getgid(), other_users[0])
    return lay.values()


def _spec() -> dict[str, object]:
    """What this launcher needs of the task: the layout's values (see _layout_here) and what the
    reference profile sets from them; the task spec itself where it is named instead."""
    from sandbox_conformance.conformance import profile
    from sandbox_conformance.conformance.launch import SPEC_ENV

    if _LAYOUT:
        values = dict(_LAYOUT)
        env_set = {k: profile.expand(v, values) for k, v in profile.load(None).environment.set.items()}
        return {**values, "task": {"workdir": values.get("workdir")}, "environment_set": env_set}
    name = os.environ.get(SPEC_ENV)
    if not name:
        raise SandboxNotSetUp(
            f"no --task and ${SPEC_ENV} is not set: run me as the witness suite's --launcher"
        )
    try:
        spec = json.loads(Path(name).read_text())
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise SandboxNotSetUp(f"${SPEC_ENV} {name}: not a task spec: {e}") from None
    if not isinstance(spec, dict):
        raise SandboxNotSetUp(f"${SPEC_ENV} {name}: not a task spec: a JSON {type(spec).__name__}")
    return spec


def reference_body(spec: Mapping[str, object], *, disable_userns: bool) -> tuple[str, ...]:
    """The reference bwrap argv without its command."""
    from sandbox_conformance.conformance import bwrap_argv, profile
    from sandbox_conformance.conformance.harness import system_links

    values = {k: str(spec[k]) for k in profile.PLACEHOLDERS if k in spec}
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxNotSetUp("no bwrap on PATH")
    python = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
    facts = bwrap_argv.Facts(
        bwrap=bwrap, python=python, disable_userns=disable_userns, system_links=system_links()
    )
    argv = bwrap_argv.reference_argv(profile.load(None), values, facts)
    tail = (python, "-I", "-S", "-")
    if argv[-len(tail) :] != tail:
        raise SandboxNotSetUp(f"the reference argv no longer ends with {' '.join(tail)}: {argv[-4:]}")
    return argv[: -len(tail)]


# ---- --join ------------------------------------------------------------------------------------------

# What python-prctl and the os module lack, through libc: setns(2) (os.setns is Python >= 3.12) and the
# prctl(2) options python-prctl 1.8 has no binding for (see _drop_capabilities). Loaded here, in our own
# process: the forked child that calls it has chrooted into the sandbox, where no library can be found.
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int, nstype: int, what: str) -> None:
    if _libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise SandboxNotSetUp(f"setns({what}): {os.strerror(err)}")


def _libc_prctl(option: int, arg: int, arg2: int = 0) -> None:
    if _libc.prctl(option, arg, arg2, 0, 0) != 0:
        err = ctypes.get_errno()
        raise SandboxNotSetUp(f"prctl({option}, {arg}): {os.strerror(err)}")


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _holder_pid(bwrap_pid: int, holder_argv: Sequence[str]) -> int:
    import psutil

    for child in psutil.Process(bwrap_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if tuple(child.cmdline()) == tuple(holder_argv):
                return child.pid
    raise SandboxNotSetUp(f"no holder process {' '.join(holder_argv)} under bwrap (pid {bwrap_pid})")


def _enter(holder: int) -> None:
    """Join the holder's namespaces, root and cwd (this process: forked, single-threaded)."""
    proc = f"/proc/{holder}"
    fds = {name: os.open(f"{proc}/ns/{name}", os.O_RDONLY) for name in ("user", *(n for n, _ in NAMESPACES))}
    root = os.open(f"{proc}/root", os.O_RDONLY | os.O_DIRECTORY)
    cwd = os.open(f"{proc}/cwd", os.O_RDONLY | os.O_DIRECTORY)
    # The user namespace that OWNS the sandbox's mount, pid, net... namespaces (bwrap's first one).
    # Entering it first gives us CAP_SYS_ADMIN over them (setns(2): the caller needs it in the owning
    # namespace), also as an unprivileged user who owns it. With --disable-userns the task itself runs
    # in a nested user namespace (bubblewrap.c), entered last.
    owner = fcntl.ioctl(fds["mnt"], NS_GET_USERNS)
    if _ident(os.fstat(owner)) != _ident(os.stat("/proc/self/ns/user")):
        _setns(owner, CLONE_NEWUSER, "the sandbox's user namespace")
    for name, nstype in NAMESPACES:
        _setns(fds[name], nstype, name)
    # (/proc/self is gone once the mount namespace is entered: compare the fds we hold.)
    if _ident(os.fstat(fds["user"])) != _ident(os.fstat(owner)):
        _setns(fds["user"], CLONE_NEWUSER, "the task's user namespace")
    os.fchdir(root)
    os.chroot(".")
    os.fchdir(cwd)


def _drop_capabilities(prctl: ModuleType) -> None:
    """`prctl` is python-prctl, imported by the caller before it forked (see join)."""
    # setns(CLONE_NEWUSER) grants a full permitted, effective AND bounding set in the new namespace
    # (kernel/user_namespace.c, set_cred_user_ns). An empty bounding set makes execve leave uid 0
    # with no capabilities (capabilities(7): P'(permitted) = (P(inh) & F(inh)) | (F(perm) & P(bset))),
    # which is what bwrap does for its task too (drop_cap_bounding_set).
    last = 40
    with contextlib.suppress(OSError, ValueError):
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        if cap <= prctl.CAP_LAST_CAP:
            prctl.capbset_drop(cap)  # OSError on failure: the child reports it and exits EX_SOFTWARE
        else:
            # python-prctl refuses a capability newer than the libcap it was built against
            # (ValueError "Unknown capability"); the kernel still has it, so drop it through libc.
            _libc_prctl(PR_CAPBSET_DROP, cap)
    # python-prctl 1.8 has no PR_CAP_AMBIENT binding (its _prctl module knows no such option).
    _libc_prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)


def _task_env(spec: Mapping[str, object]) -> dict[str, str]:
    """What the reference launcher gives the task: --clearenv, the profile's --setenv, and PWD (bwrap
    sets it for --chdir)."""
    raw = spec.get("environment_set")
    env = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}
    if spec.get("workdir"):
        env["PWD"] = str(spec["workdir"])
    return env


def join(body: Sequence[str], cmd: Sequence[str], spec: Mapping[str, object]) -> int:
    # Imported now, in our own process with the venv: the forked child that uses it enters the
    # sandbox's mount namespace and root first, where the venv is not there to import from.
    import prctl  # type: ignore[import-untyped]  # python-prctl ships no stubs and no py.typed

    python = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
    holder_argv = (python, "-I", "-S", "-c", HOLDER)
    bwrap = subprocess.Popen(
        [*body, *holder_argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={}, text=True
    )
    holder_in, holder_out = bwrap.stdin, bwrap.stdout
    assert holder_in is not None and holder_out is not None
    try:
        line = holder_out.readline()  # bwrap's --die-with-parent and our group kill bound this
        if line.strip() != "ready":
            raise SandboxNotSetUp(
                f"the reference sandbox's holder did not start (bwrap exit {bwrap.poll()})")
        holder = _holder_pid(bwrap.pid, holder_argv)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            code = EX_SOFTWARE
            try:
                _enter(holder)
                task = os.fork()
                if task == 0:
                    _drop_capabilities(prctl)
                    os.execvpe(cmd[0], list(cmd), _task_env(spec))
                code = os.waitstatus_to_exitcode(os.waitpid(task, 0)[1])
            except (SandboxNotSetUp, OSError) as e:
                print(f"control launcher --join: {e}", file=sys.stderr)
            finally:
                os._exit(code if code >= 0 else 128 - code)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        return code if code >= 0 else 128 - code
    finally:
        with contextlib.suppress(OSError):
            holder_in.close()  # the holder's read returns, it exits, and so does bwrap
        try:
            bwrap.wait(timeout=BWRAP_EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            bwrap.kill()
            bwrap.wait()


# ---- --exec-late ---------------------------------------------------------------------------------------

# Where the task waits for the host's release: sigtimedwait(2) (conformance/inside.py _release).
RELEASE_WCHAN = "do_sigtimedwait"
EXEC_LATE_WAIT = 60.0
# How long the task stays stopped once the entered process is there: the host looks every 5-30 ms.
EXEC_LATE_SHOWN = 1.0


def _task_pid(bwrap: subprocess.Popen[bytes], cmd: Sequence[str]) -> int | None:
    import psutil

    with contextlib.suppress(psutil.Error):
        return next((c.pid for c in psutil.Process(bwrap.pid).children(recursive=True)
                     if c.cmdline() == list(cmd)), None)
    return None


def _waiting(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/wchan").read_text().startswith(RELEASE_WCHAN)
    except OSError:
        return False


def _poll(until: Callable[[], bool], bwrap: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + EXEC_LATE_WAIT
    while time.monotonic() < deadline and bwrap.poll() is None:
        if until():
            return True
        time.sleep(0.001)
    return False


def _waiting_task(bwrap: subprocess.Popen[bytes], cmd: Sequence[str]) -> int | None:
    """The task's pid once it waits in sigtimedwait, or None (bwrap ended, or EXEC_LATE_WAIT passed)."""
    found: list[int] = []

    def waits() -> bool:
        if not found:
            found.extend(p for p in [_task_pid(bwrap, cmd)] if p is not None)
        return bool(found) and _waiting(found[0])

    return found[0] if _poll(waits, bwrap) else None


def _forward(bwrap: subprocess.Popen[bytes], cmd: Sequence[str], waiting: list[int],
             before_handshake: Callable[[int], None] | None = None) -> None:
    """The task's stdout, line by line, to ours (the harness's pipe). The handshake line is held back
    until the task waits in sigtimedwait for its release: the harness cannot release it before it
    reads the line, so the wait is always seen, and its end is the release (`waiting` gets the pid).
    `before_handshake(task)` runs then, before the line goes on: what it starts is there at the
    host's handshake look."""
    out = sys.stdout.buffer
    assert bwrap.stdout is not None
    for line in bwrap.stdout:
        if b'"sbxc_ready"' in line and not waiting:
            waiting.extend(p for p in [_waiting_task(bwrap, cmd)] if p is not None)
            if waiting and before_handshake is not None:
                before_handshake(waiting[0])
        out.write(line)
        out.flush()


def _join(task: int, host_dir: int | None, prctl: ModuleType, report: int,  # pragma: no cover - child
          env: Mapping[str, str]) -> NoReturn:
    """In a forked child (single-threaded: setns(CLONE_NEWUSER) needs it): enter the task's namespaces
    and root, fork the process that holds `host_dir` (if any) as a descriptor and as its cwd and sleeps
    with `env` as its environment, and write its (host) pid to `report`."""
    try:
        _enter(task)
        sleeper = os.fork()
        if sleeper == 0:  # a child: only it is in the pid namespace setns entered
            if host_dir is not None:
                os.fchdir(host_dir)
                os.set_inheritable(host_dir, True)
            _drop_capabilities(prctl)
            os.execve("/bin/sleep", ["sleep", "600"], dict(env))
        os.write(report, f"{sleeper}\n".encode())
        os.wait()
    except (SandboxNotSetUp, OSError) as e:
        print(f"control launcher --exec-late: {e}", file=sys.stderr)
    finally:
        os._exit(0)


# The helper's program (run inside the sandbox by its python3, with an empty environment): take the
# descriptor handed over the socket on fd argv[1], hold it as a descriptor and as the cwd, say so, sleep.
HELPER = """\
import os, socket, sys, time
s = socket.socket(fileno=int(sys.argv[1]))
s.send(b"r")
_, fds, _, _ = socket.recv_fds(s, 1, 1)
for fd in fds:
    try:
        os.fchdir(fd)
    except OSError:
        pass
s.send(b"1")
time.sleep(600)
"""


def _helper(task: int, host_dir: int, prctl: ModuleType, report: int,  # pragma: no cover - child
            go: int) -> NoReturn:
    """In a forked child, before the handshake (single-threaded: setns(CLONE_NEWUSER) needs it): enter the
    task's namespaces and root, start the helper (forked into the task's pid namespace, holding nothing
    that leads out: one end of a unix socket made in the task's network namespace, /dev/null), write its
    (host) pid to `report`; once `go` says the task is released, hand it `host_dir` over the socket
    (SCM_RIGHTS, what a broker does), and write `held` once the helper has it."""
    import socket  # imported by exec_late before the fork: a no-op here

    try:
        _enter(task)
        ours, its = socket.socketpair()
        helper = os.fork()
        if helper == 0:
            keep = its.fileno()
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, keep)
            os.closerange(keep + 1, 1 << 16)
            os.set_inheritable(keep, True)
            _drop_capabilities(prctl)
            # exec'd, with an empty environment: /proc/PID/environ shows what the last exec got, and the
            # launcher's carries the planted secret, which only the descriptors promise is about here.
            os.execve("/usr/bin/python3", ["python3", "-I", "-S", "-c", HELPER, str(keep)], {})
        its.close()
        if ours.recv(1):  # exec'd: it holds nothing of ours any more (host_dir went at its closerange)
            os.write(report, f"{helper}\n".encode())
        if os.read(go, 1):
            socket.send_fds(ours, [b"1"], [host_dir])
            if ours.recv(1):
                os.write(report, b"held\n")
        ours.close()
        os.wait()  # the helper goes with the sandbox's pid namespace
    except (SandboxNotSetUp, OSError) as e:
        print(f"control launcher --helper-late: {e}", file=sys.stderr)
    finally:
        os._exit(0)


def _exited(pid: int) -> bool:
    """Whether our child `pid` has ended, leaving it to be reaped (waitid(2) WNOWAIT)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _read_line(fd: int, writer: int | None = None) -> bytes:
    """One line from a pipe, waiting at most EXEC_LATE_WAIT (empty: nothing came). `writer`: the child
    that is to write it, while we still hold the write end ourselves (no EOF comes when it fails): the
    wait ends once it has ended."""
    import select

    got = b""
    deadline = time.monotonic() + EXEC_LATE_WAIT
    while not got.endswith(b"\n") and (left := deadline - time.monotonic()) > 0:
        ended = writer is not None and _exited(writer)  # before the select: what it wrote is there
        if not select.select([fd], [], [], 0 if ended else min(left, 0.05))[0]:
            if ended:
                break
            continue
        chunk = os.read(fd, 1)
        if not chunk:
            break
        got += chunk
    return got.strip()


def exec_late(body: Sequence[str], cmd: Sequence[str], spec: Mapping[str, object], *,
              helper: bool = False, with_env: bool = False) -> int:
    """The reference sandbox, and after the handshake a process that enters it from outside holding a
    host directory (as a descriptor and as its cwd), then sleeps in the task's pid namespace: it goes
    when the sandbox's init does (zap_pid_ns_processes). Its environment is empty: the launcher's
    carries the planted secret, which only the descriptors promise is about here. The task is stopped
    (SIGSTOP) from its release until EXEC_LATE_SHOWN after the entry: the way out is there while the task
    lives, which a task that ends a few milliseconds after its release would otherwise not guarantee
    (measured: one such control run in a loaded CI run ended before the host's next look).

    `helper` (--helper-late): the process is started in the sandbox BEFORE the host's handshake look,
    holding nothing that leads out, and is handed the host directory over a unix socket after the
    release: the sandbox's own helper comes to hold a way out the handshake judged clean.

    `with_env` (--exec-late-env): the entering process holds no host directory, but carries the
    launcher's environment, the planted secret with it (`docker exec -e TOKEN=...`)."""
    import signal
    import socket  # noqa: F401  # before the fork, for _helper (the child cannot import once inside)

    import prctl  # before the fork: the child cannot import once inside (untyped: see join)

    bwrap = subprocess.Popen([*body, *cmd], stdout=subprocess.PIPE)
    waiting: list[int] = []
    joiners: list[int] = []
    report, report_w = os.pipe()
    go_r, go = os.pipe()

    def start_helper(task: int) -> None:
        host_dir = os.open(_layout_root(spec), os.O_RDONLY | os.O_DIRECTORY)
        sys.stderr.flush()
        child = os.fork()
        if child == 0:  # pragma: no cover - child
            os.close(go)
            os.close(report)
            _helper(task, host_dir, prctl, report_w, go_r)
        joiners.append(child)
        os.close(host_dir)
        _read_line(report, child)  # its pid: it is there before the line goes on

    forwarder = threading.Thread(
        target=_forward, args=(bwrap, cmd, waiting, start_helper if helper else None), daemon=True)
    forwarder.start()
    try:
        # Released: the task was seen waiting for the host's release and is no longer (the lifecycle
        # launch is never released: its launcher is SIGKILLed while this waits).
        released = _poll(lambda: bool(waiting) and not _waiting(waiting[0]), bwrap)
        task = waiting[0] if released else None
        try:
            if task is not None:
                os.kill(task, signal.SIGSTOP)
        except ProcessLookupError:
            task = None  # over already: nothing to hand a way out to
        if task is not None:
            try:
                if helper:
                    os.write(go, b"1")
                else:
                    host_dir = None if with_env else os.open(_layout_root(spec), os.O_RDONLY | os.O_DIRECTORY)
                    sys.stderr.flush()
                    joiners.append(os.fork())
                    if joiners[-1] == 0:  # pragma: no cover - child
                        _join(task, host_dir, prctl, report_w, os.environ if with_env else {})
                    if host_dir is not None:
                        os.close(host_dir)
                os.close(report_w)
                if _read_line(report):  # the sleeper's pid, or the helper's "held"
                    time.sleep(EXEC_LATE_SHOWN)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(task, signal.SIGCONT)
        code = bwrap.wait()
        forwarder.join(BWRAP_EXIT_TIMEOUT)  # the rest of the document
        return code if code >= 0 else 128 - code
    finally:
        if bwrap.poll() is None:
            bwrap.kill()
            bwrap.wait()
        for fd in (report, report_w, go_r, go):
            with contextlib.suppress(OSError):
                os.close(fd)  # the go pipe's end: a helper never handed anything stops waiting
        for joiner in joiners:
            os.waitpid(joiner, 0)  # its process went with the sandbox's pid namespace


# ---- adversaries: a sandbox author who wants a green run (issue 11) ---------------------------------

# unshare(2) by architecture (asm-generic/unistd.h for aarch64; arch/x86/entry/syscalls for x86_64).
SYS_UNSHARE = {"x86_64": 272, "aarch64": 97}
SYS_SOCKET = {"x86_64": 41, "aarch64": 198}


def _scratch(spec: Mapping[str, object], name: str) -> Path:
    """A directory for the adversary's props, in the task's per-user temp: the launcher's user can
    write there (also under --as-user), and the harness removes it with the layout. A fresh one per
    launch: a session launches more than once (the lifecycle launch)."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix=f".sbxc-control-{name}-", dir=str(spec["user_tmp"])))


def _forged_proc(spec: Mapping[str, object]) -> tuple[str, ...]:
    """A /proc that shows what a checker of files wants to see: no capabilities, NoNewPrivs, private
    namespaces, a clean environment. Bound read-only over the real one."""
    root = _scratch(spec, "forged-proc")
    me = root / "self"
    (me / "ns").mkdir(parents=True)
    (me / "status").write_text(
        "Name:\tpython3\nNSpid:\t2\nNoNewPrivs:\t1\nSeccomp:\t0\nCapInh:\t0000000000000000\n"
        "CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\n"
        "CapAmb:\t0000000000000000\n"
    )
    for i, ns in enumerate(("cgroup", "ipc", "mnt", "net", "pid", "user", "uts")):
        (me / "ns" / ns).symlink_to(f"{ns}:[{4100000000 + i}]")
    (me / "environ").write_bytes(b"PATH=/usr/bin:/bin\0LANG=C.UTF-8\0")
    return ("--ro-bind", str(root), "/proc")


def _seccomp_fd(names: Sequence[str]) -> int:
    """A classic BPF program (bwrap --seccomp FD takes one compiled, seccomp(2)) that refuses only the
    named syscalls with EPERM and allows everything else: "unshare", the filter that blocks unshare(2)
    and forgets clone(2) and clone3(2); "socket-unix", socket(2) of AF_UNIX (srt's filter), which
    forgets io_uring's IORING_OP_SOCKET."""
    import socket
    import struct

    unknown = sorted(set(names) - {"unshare", "socket-unix"})
    if unknown:  # a control whose filter refused nothing would prove nothing
        raise SandboxNotSetUp(f"--seccomp-refuse: unknown {', '.join(unknown)} (unshare, socket-unix)")
    machine = os.uname().machine
    numbers = [SYS_UNSHARE[machine] for n in names if n == "unshare"]
    ld, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
    errno_eperm, allow = 0x00050000 | 1, 0x7FFF0000  # SECCOMP_RET_ERRNO | EPERM, SECCOMP_RET_ALLOW
    # (code, true target, false target, k): targets are labels, "next", "allow" or "refuse", made
    # relative jumps below.
    body: list[tuple[int, str, str, int]] = [(ld, "next", "next", 0)]  # seccomp_data.nr is at offset 0
    body += [(jeq, "refuse", "next", nr) for nr in numbers]
    if "socket-unix" in names:
        body += [
            (jeq, "next", "allow", SYS_SOCKET[machine]),
            (ld, "next", "next", 16),  # seccomp_data.args[0], its low word (little-endian)
            (jeq, "refuse", "allow", socket.AF_UNIX),
        ]
    at = {"allow": len(body), "refuse": len(body) + 1}
    prog = [(code, 0 if t == "next" else at[t] - i - 1, 0 if f == "next" else at[f] - i - 1, k)
            for i, (code, t, f, k) in enumerate(body)]
    prog += [(ret, 0, 0, allow), (ret, 0, 0, errno_eperm)]
    r, w = os.pipe()
    os.write(w, b"".join(struct.pack("HBBI", *ins) for ins in prog))
    os.close(w)
    os.set_inheritable(r, True)
    return r


def _seccomp_x86_64_only_fd() -> int:
    """A filter that refuses every x86_64 door to a user namespace (unshare, clone3, clone with
    CLONE_NEWUSER) and never checks seccomp_data.arch: the i386 entry point (int 0x80, where unshare is
    310) goes through untouched, the mistake seccomp(2) warns about ("the architecture ... must be
    checked")."""
    import struct

    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JSET|K, BPF_RET|K
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    prog = [
        (ld, 0, 0, 0),  # 0: seccomp_data.nr
        (jeq, 5, 0, 272),  # 1: unshare -> 7
        (jeq, 5, 0, 435),  # 2: clone3 -> 8 (glibc falls back to clone on ENOSYS)
        (jeq, 0, 2, 56),  # 3: clone -> 4, anything else -> 6
        (ld, 0, 0, 16),  # 4: args[0], its low 32 bits (x86_64 is little-endian)
        (jset, 1, 0, 0x10000000),  # 5: CLONE_NEWUSER -> 7, else -> 6
        (ret, 0, 0, allow),  # 6
        (ret, 0, 0, eperm),  # 7
        (ret, 0, 0, enosys),  # 8
    ]
    r, w = os.pipe()
    os.write(w, b"".join(struct.pack("HBBI", *ins) for ins in prog))
    os.close(w)
    os.set_inheritable(r, True)
    return r


# linux/mount.h
MS_REC, MS_PRIVATE = 0x4000, 1 << 18


def _binfmt_bound(spec: Mapping[str, object]) -> tuple[str, ...]:
    """The host's binfmt_misc instance, bound in read-write. Mounted by this launcher, as root in the
    initial user namespace (so the instance is that namespace's: the host's, fs/binfmt_misc.c keys it
    by the mounter's user namespace), in a mount namespace of its own made private first: the host's
    table never shows it, and it goes when bwrap and the task do."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        raise SandboxNotSetUp(f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}")
    if _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise SandboxNotSetUp(f"making / private: {os.strerror(ctypes.get_errno())}")
    # Beside the layout, not in the task's per-user temp: a bind of that would carry this mount in too.
    import tempfile

    point = tempfile.mkdtemp(prefix=".sbxc-control-binfmt-", dir=str(_layout_root(spec)))
    if _libc.mount(b"binfmt_misc", point.encode(), b"binfmt_misc", 0, None) != 0:
        raise SandboxNotSetUp(f"mount -t binfmt_misc: {os.strerror(ctypes.get_errno())}")
    return ("--bind", point, "/proc/sys/fs/binfmt_misc")


def _layout_root(spec: Mapping[str, object]) -> Path:
    # conformance/layout.py: ROOT/state is {state}; the launcher's working directory is ROOT.
    return Path(str(spec["state"])).parent


def _canary_hardlink(spec: Mapping[str, object]) -> None:
    """A second name for the masked database, on the same filesystem: a hardlink in the task's working
    directory. The workdir's bind shows it; no mount's root is an ancestor of the database's path."""
    workdir = Path(str(spec["task"]["workdir"]))  # type: ignore[index]
    if not (workdir / "notes.db").exists():  # the run's later launches share the workdir
        os.link(Path(str(spec["state"])) / "db" / "canary.sqlite", workdir / "notes.db")


def _canary_copy(spec: Mapping[str, object]) -> tuple[str, ...]:
    """A copy of the masked database in the sandbox's own tmpfs (bwrap --file FD DEST): no host storage
    is mounted there, yet the content the mask keeps out is readable under another name."""
    fd = os.open(Path(str(spec["state"])) / "db" / "canary.sqlite", os.O_RDONLY)
    os.set_inheritable(fd, True)
    return ("--file", str(fd), "/tmp/cache.db")


def _secret_file(spec: Mapping[str, object]) -> None:
    """What a platform does to hand a task its credentials: a .env in the task's working directory."""
    from sandbox_conformance.conformance.launch import SECRET_ENV

    env = Path(str(spec["task"]["workdir"])) / ".env"  # type: ignore[index]
    env.write_text(f"{SECRET_ENV}={os.environ.get(SECRET_ENV, '')}\n")


def _leaked_socket() -> int:
    """A TCP connection of the launcher's (to a listener of its own, on the host's loopback), left open:
    the launcher's listener and its end go at execve (close-on-exec), the task keeps the other."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname(), timeout=5)
    client.set_inheritable(True)
    server.accept()  # dropped at exec with the listener
    return client.detach()


DECOY = """
import ctypes, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(sys.argv[1].encode()), 0, 0, 0)
signal.sigtimedwait([signal.SIGUSR1], float(sys.argv[2]))
"""
READY_LINE = '    sys.stdout.write(json_dumps({"sbxc_ready": plan["launch_nonce"]}) + "\\n")\n'
# PR_SET_SECCOMP (22), SECCOMP_MODE_FILTER (2), a filter of one instruction: SECCOMP_RET_ALLOW. It changes
# nothing the task may do, only what the host reads in /proc/PID/status (Seccomp: 0 -> 2).
LATE_SECCOMP = """    import ctypes as _c, struct as _s
    _f = _c.create_string_buffer(_s.pack("HBBI", 6, 0, 0, 0x7FFF0000))
    _p = _c.create_string_buffer(_s.pack("HxxxxxxQ", 1, _c.addressof(_f)))
    _c.CDLL(None).prctl(22, 2, _p, 0, 0)
"""


F_SETPIPE_SZ = 1031  # fcntl(2), Linux


def _feed(program: str) -> None:
    """The (rewritten) witness program becomes the command's stdin: a pipe, as the harness's own is (a
    file would be a descriptor of host storage the task holds), sized to take it whole at once."""
    data = program.encode()
    r, w = os.pipe()
    fcntl.fcntl(w, F_SETPIPE_SZ, max(len(data) + 4096, 65536))
    os.write(w, data)
    os.close(w)
    os.dup2(r, 0)
    os.close(r)


def _decoy(spec: Mapping[str, object], body: list[str], python: str) -> list[str]:
    """Start the decoy; return the body for the real task (the host's ipc namespace, every capability)
    and feed it the program with another tag and a short wait at the handshake."""
    program = sys.stdin.read()
    from sandbox_conformance.conformance.plan import plan_of, with_plan

    plan = plan_of(program)
    subprocess.Popen(
        [*body, python, "-I", "-S", "-c", DECOY, str(plan["tag"]), str(plan["handshake_seconds"])],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    real = dict(plan, tag="x" + str(plan["tag"])[1:], handshake_seconds=0.2)
    _feed(with_plan(program, real))
    drop = {"--unshare-ipc", "--cap-drop", "ALL"}
    return [w for w in body if w not in drop] + ["--cap-add", "ALL"]


def _late_seccomp() -> None:
    from sandbox_conformance.conformance.plan import source_of, with_source

    program = sys.stdin.read()
    source = source_of(program)
    if READY_LINE not in source:
        raise SandboxNotSetUp("the witness program has no handshake line to put the filter before")
    _feed(with_source(program, source.replace(READY_LINE, LATE_SECCOMP + READY_LINE, 1)))


def _looks_like_a_witness_run(signal_: str, cmd: Sequence[str]) -> bool:
    if signal_ == "spec":
        return "SANDBOX_CONFORMANCE_TASK_SPEC" in os.environ
    if signal_ == "names":
        return any(k.startswith("SANDBOX_CONFORMANCE_") for k in os.environ)
    if signal_ == "argv":
        return list(cmd[1:]) == ["-I", "-S", "-"]
    # stdin: peek at it, and hand it on whole either way
    try:
        data = sys.stdin.read()
    except (OSError, ValueError):
        return False
    _feed(data)
    return data.startswith("PLAN = ")


def _stale_control(spec: Mapping[str, object]) -> tuple[str, ...]:
    """A control directory left by another run: right file names, right shape, another nonce."""
    stale = _scratch(spec, "stale-control")
    for name in ("system_prompt.txt",):
        (stale / name).write_text(f"SBXC-CANARY control {name} {'0' * 16}\n")
    return ("--ro-bind", str(stale), str(spec["control"]))


def _leave_daemon() -> None:
    # Double fork and a session of its own: out of our process group, out of the task's session.
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execv("/bin/sleep", ["sleep", "60"])
        os._exit(0)
    os.wait()


def forge_document() -> int:
    """No sandbox and no task: read the plan the witness program carries and print the document a
    perfect sandbox would produce, echoing this launch's nonce, creating the files the writable
    witnesses look for on the host, and reading the host files the read-only ones compare."""
    from sandbox_conformance.conformance.plan import plan_of
    from sandbox_conformance.conformance.profile import SYSCALL_DOORS

    plan = plan_of(sys.stdin.read())

    ops = []
    for op in plan["ops"]:
        kind, path = op["op"], op["path"]
        result: dict[str, object] = {"ok": False, "errno": "EROFS"}
        if kind in ("stat", "list", "read"):
            try:
                if kind == "read":
                    result = {"ok": True, "errno": None, "value": Path(path).read_text()[:4096]}
                elif kind == "list":
                    hidden = "/db" in path or "/users/bob" in path
                    result = {"ok": True, "errno": None, "value": [] if hidden else sorted(os.listdir(path))}
                else:
                    os.lstat(path)
                    result = {"ok": True, "errno": None}
            except OSError:
                result = {"ok": False, "errno": "ENOENT"}
        elif kind == "create" and ".sbxc-write-" in path:
            Path(path).write_text(op.get("data", ""))
            result = {"ok": True, "errno": None}
        ops.append(dict(op, result=result))
    refused = {"ok": False, "errno": "ECONNREFUSED"}
    doc = {
        "version": 2,
        "task_id": plan["task_id"],
        "launch_nonce": plan["launch_nonce"],
        "complete": True,
        "ops": ops,
        "interfaces": ["lo"],
        "hostname": "sbxc-task",
        "pid": 2,
        "tcp": [{"target": t, "result": refused} for t in plan["tcp"]],
        "unix_abstract": [{"target": n, "result": refused} for n in plan["unix_abstract"]],
        "processes": [{"pid": 1, "comm": "bwrap", "cmdline": ["bwrap"]}, {"pid": 2, "comm": "python3"}],
        "namespaces": {
            ns: f"{ns}:[4100000000]" for ns in ("cgroup", "ipc", "mnt", "net", "pid", "user", "uts")
        },
        "status": {"CapEff": "0000000000000000", "NoNewPrivs": "1"},
        "environment": {"PATH": "/usr/bin:/bin"},
        "nested_userns": {d: {"ok": False, "errno": "ENOSPC"} for d in ("clone", "clone3", "unshare")},
        # The syscall doors are the task's word alone (nothing of them shows on the host): forged too.
        "doors": {d: {"ok": False, "errno": "EPERM"} for d in SYSCALL_DOORS},
        # The workdir a perfect sandbox starts the task in: only the host's look can tell.
        "cwd": str(_spec().get("workdir", "")),
    }
    sys.stdout.write(json.dumps(doc) + "\n")
    return 0


# ---- issue 13: the vocabulary of agent sandboxes (hidden content, proxies, accepted refusals) ---------


def _mask_copy(spec: Mapping[str, object]) -> tuple[str, ...]:
    """Over each masked path of the reference profile, a tmpfs of the sandbox's own holding a copy of
    the host's files there (bwrap --file FD DEST), remounted read-only: no host storage is mounted at
    the path, yet what the mask must keep out is readable. A second tmpfs stacked on the reference's
    (whose --remount-ro already ran): the one on top serves the path."""
    from sandbox_conformance.conformance import profile

    values = {k: str(spec[k]) for k in profile.PLACEHOLDERS if k in spec}
    words: list[str] = []
    for template in profile.load(None).filesystem.masked:
        path = profile.expand(template, values)
        words += ["--tmpfs", path]
        for name in sorted(os.listdir(path)):
            source = os.path.join(path, name)
            if os.path.isfile(source) and not os.path.islink(source):
                fd = os.open(source, os.O_RDONLY)
                os.set_inheritable(fd, True)
                words += ["--file", str(fd), os.path.join(path, name)]
        words += ["--remount-ro", path]
    return tuple(words)


PROXY_PORT = 3128  # where srt's relay listens in the task's network namespace too
# In the sandbox, before the task: a relay from 127.0.0.1:PROXY_PORT (the task's own loopback) to the
# proxy's unix socket on the host, forked off with no stdio of ours, then the task itself. It dies with
# the sandbox's pid namespace. Stdlib only, like the witness program.
RELAY = """
import os, socket, sys, threading
path, port, cmd = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
lsock = socket.socket()
lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lsock.bind(("127.0.0.1", port))
lsock.listen(16)
if os.fork() == 0:
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    def pump(a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
    while True:
        conn, _ = lsock.accept()
        up = socket.socket(socket.AF_UNIX)
        up.connect(path)
        for a, b in ((conn, up), (up, conn)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()
lsock.close()
os.execvp(cmd[0], cmd)
"""


def _pump(a: Any, b: Any) -> None:
    import socket

    with contextlib.suppress(OSError):
        while data := a.recv(65536):
            b.sendall(data)
    for s in (a, b):
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)


def _tunnel(conn: Any) -> None:
    """One CONNECT, to whatever the task names (RFC 9110 9.3.6): the permissive proxy."""
    import socket
    import threading

    with contextlib.suppress(OSError, ValueError):
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 8192:
            chunk = conn.recv(1024)
            if not chunk:
                return
            head += chunk
        method, authority, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        host, _, port = authority.rpartition(":")
        if method != "CONNECT":
            conn.sendall(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            return
        try:
            up = socket.create_connection((host, int(port)), timeout=5)
        except OSError:
            conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            return
        conn.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        threading.Thread(target=_pump, args=(up, conn), daemon=True).start()
        _pump(conn, up)


def offer_proxy(body: Sequence[str], cmd: Sequence[str], spec: Mapping[str, object]) -> int:
    """The reference sandbox, plus what srt adds: a proxy on the host (here: one that tunnels to any
    name), relayed into the task's network namespace and named in HTTP(S)_PROXY. The launcher serves
    it while bwrap runs, so it is gone when the launch is."""
    import socket
    import threading

    sock_path = str(_scratch(spec, "px") / "s")
    server = socket.socket(socket.AF_UNIX)
    server.bind(sock_path)
    server.listen(16)

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                threading.Thread(target=_tunnel, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{PROXY_PORT}"
    env = [
        w
        for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
        for w in ("--setenv", var, url)
    ]
    python = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
    argv = [*body, *env, python, "-I", "-S", "-c", RELAY, sock_path, str(PROXY_PORT), *cmd]
    try:
        proc = subprocess.Popen(argv)
        return proc.wait(timeout=BWRAP_EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise SandboxNotSetUp(f"the sandbox with a proxy ran past {BWRAP_EXIT_TIMEOUT:g}s") from None
    finally:
        server.close()


# Landlock (landlock(7)): the write accesses of ABI 1, each refused with EACCES beneath no rule.
LANDLOCK_WRITES = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))
# In the sandbox, before the task: a ruleset that allows those accesses beneath every top-level
# directory but DIR (and no symlink: /bin -> usr/bin would let /usr back in), then the task itself.
# landlock_create_ruleset, _add_rule, _restrict_self are 444-446 on every architecture.
LANDLOCK = """
import ctypes, os, struct, sys
deny, writes, cmd = sys.argv[1].strip("/"), int(sys.argv[2]), sys.argv[3:]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
attr = ctypes.create_string_buffer(struct.pack("Q", writes))
ruleset = libc.syscall(444, attr, ctypes.c_size_t(8), ctypes.c_uint32(0))
if ruleset < 0:
    sys.exit("landlock_create_ruleset: " + os.strerror(ctypes.get_errno()))
for name in sorted(os.listdir("/")):
    top = "/" + name
    if name == deny or os.path.islink(top) or not os.path.isdir(top):
        continue
    fd = os.open(top, os.O_PATH | os.O_DIRECTORY)
    rule = ctypes.create_string_buffer(struct.pack("=Qi", writes, fd))
    if libc.syscall(445, ctypes.c_int(ruleset), ctypes.c_int(1), rule, ctypes.c_uint32(0)) != 0:
        sys.exit("landlock_add_rule " + top + ": " + os.strerror(ctypes.get_errno()))
    os.close(fd)
if libc.syscall(446, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
    sys.exit("landlock_restrict_self: " + os.strerror(ctypes.get_errno()))
os.execvp(cmd[0], cmd)
"""


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args, cmd = _parse(sys.argv[1:] if argv is None else argv)
        if args.forge_document:
            return forge_document()
        spec = _spec()
        body = [w for w in reference_body(spec, disable_userns=args.disable_userns) if w not in args.drop]
        body += args.append
        if args.forge_proc:
            body += _forged_proc(spec)
        if args.seccomp_refuse:
            body += ["--seccomp", str(_seccomp_fd(args.seccomp_refuse))]
        if args.leak_secret_as:
            from sandbox_conformance.conformance.launch import SECRET_ENV

            body += ["--setenv", args.leak_secret_as, os.environ.get(SECRET_ENV, "")]
        if args.stale_control:
            body += _stale_control(spec)
        if args.leave_daemon:
            _leave_daemon()
        if args.mask_copy:
            body += _mask_copy(spec)
        if args.secret_file:
            _secret_file(spec)
        if args.canary_hardlink:
            _canary_hardlink(spec)
        if args.canary_copy:
            body += _canary_copy(spec)
        if args.leak_dir:
            # runc CVE-2024-21626: a directory descriptor of the host (the layout's root) left open.
            os.set_inheritable(os.open(_layout_root(spec), os.O_RDONLY | os.O_DIRECTORY), True)
        if args.leak_socket:
            _leaked_socket()
        if args.leak_netns:
            os.set_inheritable(os.open("/proc/self/ns/net", os.O_RDONLY), True)
        if args.bind_daemon_socket:
            # The Docker-socket class: a host daemon's socket bound in (read-only: connect(2) needs no
            # writable mount, only write permission on the socket, net/unix/af_unix.c unix_find_bsd).
            body += ["--ro-bind", str(_layout_root(spec) / "run" / "agentd.sock"), "/run/agentd.sock"]
        if args.seccomp_x86_64_only:
            body += ["--seccomp", str(_seccomp_x86_64_only_fd())]
        if args.binfmt_bound:
            body += _binfmt_bound(spec)
        if args.defeat and not _looks_like_a_witness_run(args.defeat, cmd):
            body = [w for w in body if w != "--unshare-net"]  # not tested, it thinks: no isolation
        if args.decoy:
            python = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
            body = _decoy(spec, body, python)
        if args.late_seccomp:
            _late_seccomp()
        if args.landlock_refuse:
            python = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
            cmd = [python, "-I", "-S", "-c", LANDLOCK, args.landlock_refuse, str(LANDLOCK_WRITES), *cmd]
        if args.join:
            return join(body, cmd, spec)
        if args.exec_late or args.helper_late or args.exec_late_env:
            return exec_late(body, cmd, spec, helper=args.helper_late, with_env=args.exec_late_env)
        if args.offer_proxy:
            return offer_proxy(body, cmd, spec)
        os.execv(body[0], [*body, *cmd])
    except SandboxNotSetUp as e:
        print(f"control launcher: {e}", file=sys.stderr)
    return EX_SOFTWARE


if __name__ == "__main__":
    sys.exit(main())
