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
so the profile does not claim [environment] or secrets."""

from __future__ import annotations

import shlex
import shutil
import subprocess

from sandbox_conformance.conformance.adapters import Unavailable

VERSION = "0.9.72"  # what firejail.toml was measured with
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
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout
    first = out.splitlines()[0] if out else ""
    return first.rsplit(" ", 1)[-1]  # "firejail version 0.9.72"


def prefix() -> str:
    exe = shutil.which("firejail")
    if exe is None:
        raise Unavailable("firejail not installed (apt-get install --no-install-recommends firejail)")
    v = version(exe)
    if v != VERSION:
        raise Unavailable(f"firejail {v}: firejail.toml was measured with {VERSION}")
    return shlex.join([exe, *FLAGS])
