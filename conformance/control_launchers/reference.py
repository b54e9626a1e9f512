"""A negative control's launcher: the reference sandbox (conformance/bwrap_argv.py, embedded profile)
with ONE thing changed, for promises the reference launcher cannot perturb itself.

    python -m conformance.control_launchers.reference [--disable-userns] [--append=WORD]... [--join] -- CMD...

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
from collections.abc import Mapping, Sequence
from pathlib import Path

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


class SetupError(Exception):
    """The perturbed sandbox could not be set up: the witness run reports a harness error."""


def _parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    if "--" not in argv:
        raise SetupError("expected `-- CMD...` after the options")
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="conformance.control_launchers.reference")
    p.add_argument("--disable-userns", action="store_true")
    p.add_argument("--append", action="append", default=[])
    p.add_argument("--join", action="store_true")
    args = p.parse_args(argv[:cut])
    cmd = argv[cut + 1 :]
    if not cmd:
        raise SetupError("no command after --")
    return args, cmd


def _spec() -> dict[str, object]:
    from conformance.launch import SPEC_ENV

    name = os.environ.get(SPEC_ENV)
    if not name:
        raise SetupError(f"${SPEC_ENV} is not set: run me as the witness suite's --launcher")
    return dict(json.loads(Path(name).read_text()))


def reference_body(spec: Mapping[str, object], *, disable_userns: bool) -> tuple[str, ...]:
    """The reference bwrap argv without its command."""
    from conformance import bwrap_argv, profile
    from conformance.harness import system_links

    values = {k: str(spec[k]) for k in profile.PLACEHOLDERS if k in spec}
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SetupError("no bwrap on PATH")
    python = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
    facts = bwrap_argv.Facts(
        bwrap=bwrap, python=python, disable_userns=disable_userns, system_links=system_links()
    )
    argv = bwrap_argv.reference_argv(profile.load(None), values, facts)
    tail = (python, "-I", "-S", "-")
    if argv[-len(tail) :] != tail:
        raise SetupError(f"the reference argv no longer ends with {' '.join(tail)}: {argv[-4:]}")
    return argv[: -len(tail)]


# ---- --join ------------------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int, nstype: int, what: str) -> None:
    if _libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise SetupError(f"setns({what}): {os.strerror(err)}")


def _prctl(option: int, arg: int, arg2: int = 0) -> None:
    if _libc.prctl(option, arg, arg2, 0, 0) != 0:
        err = ctypes.get_errno()
        raise SetupError(f"prctl({option}, {arg}): {os.strerror(err)}")


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _holder_pid(bwrap_pid: int, holder_argv: Sequence[str]) -> int:
    import psutil

    for child in psutil.Process(bwrap_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if tuple(child.cmdline()) == tuple(holder_argv):
                return child.pid
    raise SetupError(f"no holder process {' '.join(holder_argv)} under bwrap (pid {bwrap_pid})")


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


def _drop_capabilities() -> None:
    # setns(CLONE_NEWUSER) grants a full permitted, effective AND bounding set in the new namespace
    # (kernel/user_namespace.c, set_cred_user_ns). An empty bounding set makes execve leave uid 0
    # with no capabilities (capabilities(7): P'(permitted) = (P(inh) & F(inh)) | (F(perm) & P(bset))),
    # which is what bwrap does for its task too (drop_cap_bounding_set).
    last = 40
    with contextlib.suppress(OSError, ValueError):
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap)
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)


def _task_env(spec: Mapping[str, object]) -> dict[str, str]:
    """What the reference launcher gives the task: --clearenv, the profile's --setenv, and PWD (bwrap
    sets it for --chdir)."""
    raw = spec.get("environment_set")
    env = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}
    if spec.get("workdir"):
        env["PWD"] = str(spec["workdir"])
    return env


def join(body: Sequence[str], cmd: Sequence[str], spec: Mapping[str, object]) -> int:
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
            raise SetupError(f"the reference sandbox's holder did not start (bwrap exit {bwrap.poll()})")
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
                    _drop_capabilities()
                    os.execvpe(cmd[0], list(cmd), _task_env(spec))
                code = os.waitstatus_to_exitcode(os.waitpid(task, 0)[1])
            except (SetupError, OSError) as e:
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


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args, cmd = _parse(sys.argv[1:] if argv is None else argv)
        spec = _spec()
        body = (*reference_body(spec, disable_userns=args.disable_userns), *args.append)
        if args.join:
            return join(body, cmd, spec)
        os.execv(body[0], [*body, *cmd])
    except SetupError as e:
        print(f"control launcher: {e}", file=sys.stderr)
    return EX_SOFTWARE


if __name__ == "__main__":
    sys.exit(main())
