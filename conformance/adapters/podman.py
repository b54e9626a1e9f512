"""podman as a sandbox: `podman run --rootfs` of a directory we make per launch, rootful as root and
rootless as a user (`witness --as-user NAME`), with no registry and no image (no network here).

The flags are docker's (conformance/adapters/docker.py `run_flags`: no network, a read-only root,
no capabilities, no_new_privs, private ipc/pid/uts, the layout bound as docker binds it), with:
  --rootfs DIR       an empty directory with /bin, /lib... symlinks into /usr (a usrmerged Debian
                     host), the host's /usr bound read-only on it: the task runs the host's python3
  --cgroups=disabled this project writes no cgroup it was not delegated (podman-run(1): crun only)
  --runtime          crun, through a wrapper that hides cgroup2 from it on a hybrid host (crun
                     refuses one whose cgroup2 has controllers, conformance/adapters/oci.py)
  --ulimit           the launcher's own limits: podman's rootful default (nofile 1048576) needs
                     CAP_SYS_RESOURCE, which a root in a container may lack (measured: crun's
                     setrlimit EPERM)
  --no-hosts         no /etc/hosts bound from podman's run directory

Everything podman keeps (its storage, run root, tmp dir, XDG_RUNTIME_DIR, HOME, the rootfs) is in
one temp directory per launch, removed afterwards with the container. Rootless podman starts a
per-user "pause" process that holds its user namespace and outlives `podman run` by design
(podman-system-migrate(1)); with a runtime directory of the launch's own it is this launch's helper,
so the adapter stops it (its pid is in libpod's tmp dir, pause.pid) before it exits and
says so on stderr: it is never the task's leftover, and never left running.

The client, SIGKILLed, cannot clean up: conmon holds the container in a session of its own. A
guardian (oci.py's design) waits for the launcher's end and then removes the container, stops the
pause process and removes the workspace, so a killed launch leaves nothing and its task dies."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import secrets
import shlex
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sandbox_conformance.conformance.adapters import _guardian, docker, oci
from sandbox_conformance.conformance.profile import expand
from sandbox_conformance.probes import container_engine
from sandbox_conformance.processes import owner

WORKSPACE_PREFIX = "sbxc-pm-"  # short: podman refuses a runroot past 50 characters
RUN_TIMEOUT = _guardian.RUN_TIMEOUT
VERSION_PREFIX = "podman version "

# crun refuses a hybrid host whose cgroup2 hierarchy has controllers; in a mount namespace of its own it
# gets an empty tmpfs over the cgroup2 mount (rootless: a mount namespace of podman's user namespace may
# mount over, not unmount, a mount it inherited locked, mount_namespaces(7)), then sees a v1 host and,
# with cgroups disabled, touches none. --root: crun's state in the workspace too (podman passes none, and
# crun's default as root is /run/crun).
CRUN_WRAPPER = """#!/bin/sh
exec unshare --mount --propagation private -- sh -c '
if mountpoint -q {unified}; then
    mount -t tmpfs -o ro,size=4k,mode=0555 sbxc-no-cgroup2 {unified} || umount {unified} || exit 125
fi
exec {crun} --root {state} "$@"' sh "$@"
"""


def unavailable(env: Mapping[str, str] | None = None) -> str | None:
    """Why podman cannot run here, or None."""
    path = (env or os.environ).get("PATH")
    for tool in ("podman", "crun", "conmon"):
        if shutil.which(tool, path=path) is None and not Path(f"/usr/libexec/podman/{tool}").exists():
            return f"{tool} not installed (apt-get install --no-install-recommends podman crun)"
    return None


def run_flags(workspace: Path) -> list[str]:
    """podman run's flags for one task, placeholders unexpanded; the task's argv follows them."""
    # podman's tmpfs mounts take `ro`, not docker's `readonly`, and copy up what the image has at their
    # destination unless `notmpcopyup` (podman-run(1)): with --rootfs that is the host's own tree
    # under the bind of {state}, the other users' files an empty tmpfs is meant to hide.
    flags = [
        f.replace(",readonly", ",ro,notmpcopyup") if f.startswith("type=tmpfs,") else f
        for f in docker.run_flags(str(workspace / "rootfs"))
    ]
    image = flags.pop()  # docker's last word is the image; podman's is the rootfs, after --rootfs
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nsoft, nhard = resource.getrlimit(resource.RLIMIT_NPROC)
    return [
        *flags,
        "--cgroups=disabled",
        "--no-hosts",
        "--unsetenv", "TERM",  # podman's default environment adds TERM=xterm (containers.conf(5) env)
        "--ulimit", f"nofile={soft}:{hard}",
        "--ulimit", f"nproc={min(nsoft, 4096)}:{min(nhard, 4096)}",
        "--volume", "/usr:/usr:ro",
        "--rootfs", image,
    ]


def engine_argv(workspace: Path) -> list[str]:
    """`podman` with every piece of its state in the workspace (podman(1) global options)."""
    exe = shutil.which("podman") or "podman"
    return [
        exe,
        "--root", str(workspace / "storage"),
        "--runroot", str(workspace / "run"),
        "--tmpdir", str(workspace / "tmp"),
        "--storage-driver", "vfs",  # nothing to layer: the rootfs is a directory
        "--cgroup-manager", "cgroupfs",  # no systemd to ask
        "--events-backend", "none",
        "--runtime", str(workspace / "bin" / "crun"),  # named crun: podman allows --cgroups=disabled by name
    ]


def engine_env(workspace: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "TERM")}
    return {
        **keep,
        "HOME": str(workspace / "home"),
        "XDG_RUNTIME_DIR": str(workspace / "xdg-run"),
        "XDG_CONFIG_HOME": str(workspace / "home" / ".config"),
        "XDG_DATA_HOME": str(workspace / "home" / ".local" / "share"),
        "CONTAINERS_CONF": "/dev/null",  # no host or user containers.conf changes what runs
    }


def make_workspace(workspace: Path) -> None:
    for d in ("rootfs", "bin", "home", "tmp", "storage", "run"):
        (workspace / d).mkdir()
    (workspace / "xdg-run").mkdir(mode=0o700)
    for name in oci.USR_LINKS:
        if os.path.islink(f"/{name}"):
            os.symlink(os.readlink(f"/{name}"), workspace / "rootfs" / name)
    wrapper = workspace / "bin" / "crun"
    crun = shutil.which("crun") or "/usr/bin/crun"
    (workspace / "crun").mkdir(mode=0o700)
    wrapper.write_text(CRUN_WRAPPER.format(
        unified=shlex.quote(oci.UNIFIED), crun=shlex.quote(crun), state=shlex.quote(str(workspace / "crun"))
    ))
    wrapper.chmod(0o755)


def pause_pid(workspace: Path) -> int | None:
    """The pause process of this workspace's podman, if it runs: its pid file (libpod's tmp dir,
    --tmpdir), checked against the process (its name, and our uid), so that a pid the kernel has
    since given another process is never killed."""
    for f in (workspace / "tmp" / "pause.pid", workspace / "xdg-run" / "libpod" / "tmp" / "pause.pid"):
        pid = container_engine.pause_pid(f, os.geteuid())  # the probe's own check, one of it
        if pid is not None:
            return pid
    return None


def cleanup(workspace: Path, cid: str, *, say: bool = False) -> None:
    """Remove the container (killing it if it still runs), its storage, rootless podman's pause
    process, the workspace. Idempotent."""
    env = engine_env(workspace)
    if (workspace / "storage").is_dir():
        _guardian.run_cleanup([*engine_argv(workspace), "rm", "--force", "--time", "0", cid], env=env)
        if os.geteuid() != 0:
            # Rootless storage may hold files of the user namespace's other uids: removed from inside it.
            storage = str(workspace / "storage")
            _guardian.run_cleanup([*engine_argv(workspace), "unshare", "rm", "-rf", storage], env=env)
    pid = pause_pid(workspace)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            if say:
                print(
                    f"podman adapter: stopped rootless podman's pause process (pid {pid}): the engine's "
                    "helper, started for this launch's runtime directory, not the task's",
                    file=sys.stderr,
                )
    shutil.rmtree(workspace, ignore_errors=True)


def guardian() -> int:
    """The guardian (oci.py `guardian`): its first line on stdin names the workspace and the container;
    then it blocks until the launcher is gone (EOF, however it died) and cleans up. The workspace is
    stamped with the GUARDIAN's pid, not the launcher's: a launcher SIGKILLed (the lifecycle launch)
    leaves its workspace to the guardian, and another run's sweep (processes/owner.py), which removes a
    dead owner's directory and kills what names it, must not race the guardian's clean-up (measured:
    a pause process left running, and /tmp chmod'ed by the racing removal)."""
    named = _guardian.told(WORKSPACE_PREFIX)
    if named is None:
        return 2
    workspace, cid = named
    while sys.stdin.buffer.read(4096):
        pass
    cleanup(workspace, cid)
    return 0


def launch(args: Sequence[str], spec: Mapping[str, Any]) -> int:
    values = oci.values_from_spec(spec)
    cid = f"sbxc-{values['task_id']}-{secrets.token_hex(3)}"
    # podman refuses a runroot past 50 characters, and having refused, it had already made its default
    # storage (/var/lib/containers, with a mount on it: measured): a long $TMPDIR gives way to /tmp.
    runroot = len(tempfile.gettempdir()) + len(WORKSPACE_PREFIX) + len(owner.stamp()) + len("/XXXXXXXX-/run")
    top = None if runroot <= 47 else "/tmp"  # the guardian's pid may have more digits than ours
    guardian, w = _guardian.start_guardian("sandbox_conformance.conformance.adapters.podman")
    start = owner.start_time(guardian.pid)
    stamp = owner.Stamp(guardian.pid, start, owner.host_key()) if start is not None else owner.mine()
    workspace = Path(tempfile.mkdtemp(prefix=f"{WORKSPACE_PREFIX}{stamp}-", dir=top))
    workspace.chmod(0o755)
    _guardian.tell(w, workspace, cid)
    flags = [expand(f, values) for f in run_flags(workspace)]
    # --name before the rootfs, which (with --rootfs) stands where the image would.
    argv = [*engine_argv(workspace), *flags[:-2], "--name", cid, *flags[-2:], *args]
    return _guardian.run_with_guardian(
        argv, what="podman", guardian=guardian, pipe=w, env=engine_env(workspace),
        prepare=lambda: make_workspace(workspace), cleanup=lambda: cleanup(workspace, cid, say=True),
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m sandbox_conformance.conformance.adapters.podman", description=__doc__.splitlines()[0]
    )
    p.add_argument("--guardian", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("args", nargs=argparse.REMAINDER, help="-- the task's argv")
    a = p.parse_args(argv)
    if a.guardian:
        return guardian()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if not args:
        p.error("no task argv after --")
    why = unavailable()
    if why:
        print(f"podman adapter: {why}", file=sys.stderr)
        return 75
    spec_file = os.environ.get(oci.SPEC_ENV)
    if not spec_file:
        print(f"podman adapter: ${oci.SPEC_ENV} is not set (run me through `sandbox-conformance witness`)",
              file=sys.stderr)
        return 2
    try:
        return launch(args, json.loads(Path(spec_file).read_text()))
    except (OSError, ValueError, oci.BundleNotBuilt) as e:
        print(f"podman adapter: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
