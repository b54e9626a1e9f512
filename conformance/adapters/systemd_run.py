"""systemd-run(1) as a sandbox: the task is a transient service with sandboxing properties
(systemd.exec(5)), its stdio piped through (--pipe), waited for (--wait), collected (--collect).

Only where systemd is PID 1: systemd-run asks the system manager over D-Bus to start the unit, and
without a manager there is nothing to ask. sd_booted(3) defines "booted with systemd" as
/run/systemd/system/ existing; we require that and PID 1's comm being `systemd`."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from sandbox_conformance.conformance.adapters._unavailable import Unavailable

# systemd.exec(5) properties and what each one promises (systemd >= 252, Debian 12):
PROPERTIES = (
    "PrivateNetwork=yes",  # a new network namespace with only lo
    "PrivateIPC=yes",
    "ProtectHostname=yes",  # a private uts namespace
    "ProtectSystem=strict",  # the whole file system read-only but /dev, /proc, /sys...
    # ...and but /home, /root, /run/user, which `strict` leaves to ProtectHome= (default no: writable,
    # seen as write_surface BROKEN under systemd 252, tests/test_host_shape_lab.py).
    "ProtectHome=read-only",
    # /proc/sys, /sys, /proc/sysrq-trigger read-only: ProtectSystem= leaves the API file systems alone,
    # and a uid-0 task with no capabilities still opens the host's sysctls (mode 0644) for writing.
    "ProtectKernelTunables=yes",
    # ...but /sys/fs/cgroup, which it leaves read-write for ProtectControlGroups= to decide (systemd's
    # namespace.c, protect_kernel_tunables_sys_table): the host's whole cgroup tree, from its root, to a
    # uid-0 task (cgroup.max.depth there needs only the file's mode).
    "ProtectControlGroups=yes",
    # The host's daemon sockets live in /run and /tmp (and the harness plants one beside the layout):
    # a private /tmp, an empty read-only /run; the task's trees are bound back below.
    "PrivateTmp=yes",
    "TemporaryFileSystem=/run:ro",
    "BindReadOnlyPaths={state}",
    # A private /dev (a tmpfs of the task's own with null, zero, random, tty...), not the host's
    # devtmpfs; systemd still binds the host's /dev/shm and /dev/hugepages into it, so those get a
    # tmpfs of their own / nothing.
    "PrivateDevices=yes",
    "TemporaryFileSystem=/dev/shm",
    "InaccessiblePaths=-/dev/hugepages",
    "ReadWritePaths={workdir} {user_tmp}",  # ...except these
    "TemporaryFileSystem={state}/db:ro",  # the mask: an empty read-only tmpfs
    "TemporaryFileSystem={state}/users:ro",  # hides other tasks and users...
    "BindReadOnlyPaths={control}",  # ...with this task's trees bound back on top
    "BindPaths={workdir} {user_tmp}",
    "NoNewPrivileges=yes",
    "CapabilityBoundingSet=",  # empty: no capabilities
    "AmbientCapabilities=",
    "RestrictNamespaces=~user",  # a nested user namespace is refused (seccomp)
    "WorkingDirectory={workdir}",
)


def booted(root: Path = Path("/")) -> str | None:
    """Why systemd-run cannot be used here, or None."""
    if not (root / "run/systemd/system").is_dir():
        return "systemd is not PID 1 (no /run/systemd/system, sd_booted(3))"
    try:
        comm = (root / "proc/1/comm").read_text().strip()
    except FileNotFoundError:
        return "no /proc/1/comm: cannot tell what PID 1 is"
    if comm != "systemd":
        return f"systemd is not PID 1 (PID 1 is {comm!r})"
    return None


def prefix(root: Path = Path("/")) -> str:
    why = booted(root)
    if why:
        raise Unavailable(why)
    exe = shutil.which("systemd-run")
    if exe is None:
        raise Unavailable("systemd-run not installed (apt-get install systemd)")
    props = [w for p in PROPERTIES for w in ("--property", p)]
    return shlex.join([exe, "--quiet", "--wait", "--pipe", "--collect", "--service-type=exec", *props])
