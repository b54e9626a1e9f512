"""firejail(1) as a sandbox: the host's tree with the state read-only, its database behind a
read-only tmpfs, the other tasks' and users' trees blacklisted, no network, private ipc and uts, no
capabilities, no_new_privs; the task starts in its workdir (--private-cwd). firejail is setuid root:
a user runs it too (the task then runs as that user).

Why not `--read-only=/`, the shorter way to say "the host read-only": firejail 0.9.72 run as root binds
"/" on "/" and remounts the mount beneath read-only (fs_rdonly()), so a read-write bind of the host's
"/" stays stacked on the task's root directory, reachable through `..`: `/../x` writes the host's /x
and `/../{state}/db` shows the masked canary (tests/test_firejail_e2e.py keeps that shape, with the
launcher a user would write: aliases and write_surface BROKEN). Read-only per directory, as here,
stacks nothing on the root.

firejail passes its caller's environment through (firejail(1): there is no --env-clear in 0.9.72),
so the profile does not claim [environment] or secrets.

Run as root, firejail 0.9.72 sets up /run/firejail on first use and leaves three mounts in its
caller's mount namespace, the host's: /run/firejail/dbus (bound on itself nosuid,nodev,noexec),
/run/firejail/firejail.ro.dir and firejail.ro.file (bound read-only on themselves), its
preproc_build_firejail_dir() (measured: `findmnt` before and after one launch, issue 28). So root's
launch runs it in a mount namespace of its own, private (`unshare --mount --propagation private`):
those mounts die with the launch (mount_namespaces(7)), and firejail, which makes every namespace of
the sandbox itself, sees the same tree. A user's launch cannot make one (unshare(CLONE_NEWNS) needs
CAP_SYS_ADMIN, and setuid firejail in a user namespace would gain nothing): as a user it still
makes them on first use, where no root launch has made them (tests/test_firejail_e2e.py)."""

from __future__ import annotations

import os
import shlex
import shutil

from sandbox_conformance.conformance.adapters._unavailable import Unavailable
from sandbox_conformance.processes import children

VERSION = "0.9.72"  # what firejail.toml was measured with
VERSION_TIMEOUT = 10.0
HOSTNAME = "sbxc-task"
FLAGS = (
    "--noprofile", "--quiet",
    "--private-cwd={workdir}",
    "--read-only=/usr", "--read-only={state}",
    "--read-write={workdir}", "--read-write={user_tmp}",
    # --blacklist, not --tmpfs: firejail refuses --tmpfs outside the home directory to a user, and the
    # mask was then not made at all (measured as sbxc-test); a blacklisted path is hidden for both.
    "--blacklist={state}/db", "--blacklist={neighbour_control}", "--blacklist={other_user}",
    "--private-dev",  # a /dev of its own (null, zero, tty, random...), not the host's devtmpfs
    "--net=none", "--ipc-namespace", f"--hostname={HOSTNAME}",
    "--caps.drop=all", "--nonewprivs",
    "--",
)


def version(exe: str) -> str:
    """"0.9.72" from "firejail version 0.9.72"; "" where it did not answer within VERSION_TIMEOUT (its
    group killed then, as every child of ours is, processes/children.py)."""
    out = children.run([exe, "--version"], timeout=VERSION_TIMEOUT).stdout
    first = out.splitlines()[0] if out else ""
    return first.rsplit(" ", 1)[-1]


def private_mounts(as_user: str | None = None) -> list[str]:
    """The argv that gives root's firejail a mount namespace of its own, or [] where the launch runs
    as a user (ourselves, or `--as-user`: setpriv runs before this prefix) or there is no unshare."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or as_user is not None or unshare is None:
        return []
    return [unshare, "--mount", "--propagation", "private", "--"]


def prefix(as_user: str | None = None) -> str:
    exe = shutil.which("firejail")
    if exe is None:
        raise Unavailable("firejail not installed (apt-get install --no-install-recommends firejail)")
    v = version(exe)
    if v != VERSION:
        said = f"firejail {v}" if v else f"{exe} --version gave no version (within {VERSION_TIMEOUT:g} s)"
        raise Unavailable(f"{said}: firejail.toml was measured with {VERSION}")
    return shlex.join([*private_mounts(as_user), exe, *FLAGS])
