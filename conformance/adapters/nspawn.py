"""systemd-nspawn(1) as a sandbox, as root only: the host's own tree booted volatile (`-D /
--volatile=yes`: a tmpfs root with the host's /usr bound read-only), the state bound read-only with
its database and the other tasks' trees under empty tmpfs, this task's control directory (ro),
workdir and per-user temp (rw) bound back; a network namespace of its own, every capability dropped,
no_new_privs; the task is PID 2 under nspawn's stub init (--as-pid2), its stdio piped through
(--console=pipe). `--register=no --keep-unit`: no systemd-machined and no unit to ask for (systemd is
not PID 1 on every host this runs on).

As a user it cannot run: systemd-nspawn refuses ("Need to be root"). The launcher then exits 75
(docs/launchers.md), and the run says "did not run" once, with that reason.

Cgroups: nspawn 252 creates payload/ and supervisor/ cgroups under its own cgroup in the
name=systemd and cgroup2 hierarchies (measured on a hybrid host: in the host's, left behind), and
this project writes no cgroup tree it was not delegated. So it runs in a mount namespace of its own
where /sys/fs/cgroup/unified is an empty tmpfs (it then sees a legacy host) and /sys/fs/cgroup/systemd
is a NEW named v1 hierarchy (`name=sbxc-nspawn-ID`, no controllers: nothing of the host's), with
/run/systemd a tmpfs (nspawn's propagation and volatile directories). Afterwards its cgroups are
removed and the mount dropped, which destroys the hierarchy (cgroups(7): a v1 hierarchy with no child
cgroups goes with its last mount). A guardian (oci.py's design) does the same by the hierarchy's
name if the launcher is killed: it kills what is still in it (the task: the `lifecycle` promise).
A hierarchy's name has no room for an owner's stamp to be found by (and is no directory a sweep
lists), so a stamped directory stands for it (`sbxc-nspawn-h-<guardian's stamp>-`): if the launcher
and the guardian both die, the next run's sweep runs the command recorded there, which sweeps the
hierarchy by name, then removes the directory (processes/owner.py)."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sandbox_conformance.conformance.adapters import _guardian, oci
from sandbox_conformance.conformance.profile import expand
from sandbox_conformance.processes import owner

HOSTNAME = "sbxc-task"
HIERARCHY_PREFIX = "sbxc-nspawn-"
LABEL_PREFIX = "sbxc-nspawn-h-"  # the stamped directory standing for a live hierarchy
RUN_TIMEOUT = _guardian.RUN_TIMEOUT
MODULE = "sandbox_conformance.conformance.adapters.nspawn"
SWEEP_TIMEOUT = 20.0  # seconds for one hierarchy's sweep (kill, rmdir, umount), all passes
SWEEP_PASSES = 3
NEED_ROOT = "systemd-nspawn needs root (it refuses otherwise: \"Need to be root\"): run without --as-user"

FLAGS = (
    "--quiet", "--register=no", "--keep-unit",
    "--directory=/", "--volatile=yes",
    "--console=pipe", "--as-pid2",
    "--private-network",
    f"--hostname={HOSTNAME}",
    "--drop-capability=all", "--no-new-privileges=yes",
    "--bind-ro={state}",
    "--tmpfs={state}/db:mode=0755,ro",  # the mask: an empty read-only tmpfs
    # The other tasks' and users' trees: an inaccessible node over each (mode 000), not a tmpfs over
    # {state}/users, which nspawn mounts read-write (its bind targets are made in it) and which then
    # took writes beneath the read-only {state} (measured).
    "--inaccessible={neighbour_control}", "--inaccessible={other_user}",
    "--bind-ro={control}",
    "--bind={workdir}", "--bind={user_tmp}",
    "--chdir={workdir}",
    "--setenv=HOME={workdir}", "--setenv=LANG=C.UTF-8", "--setenv=TASK_ID={task_id}",
)

# Run inside `unshare --mount --propagation private`: $1 is the hierarchy's name, the rest nspawn's argv.
SCRIPT = r"""
set -e
name=$1; shift
run=/run/systemd; [ -d $run ] || run=/run
mount -t tmpfs -o mode=0755,size=1m sbxc-nspawn-run $run
# What --inaccessible= binds from, made by systemd as PID 1 where it is (tmpfiles.d/systemd.conf).
mkdir -p /run/systemd/inaccessible/dir && touch /run/systemd/inaccessible/reg
chmod 0000 /run/systemd/inaccessible/dir /run/systemd/inaccessible/reg
if mountpoint -q /sys/fs/cgroup/unified; then
    mount -t tmpfs -o ro,size=4k,mode=0555 sbxc-no-cgroup2 /sys/fs/cgroup/unified
fi
mount -t cgroup -o none,name="$name" sbxc-nspawn /sys/fs/cgroup/systemd
set +e
"$@"
rc=$?
# Whatever of the container is still in its cgroups goes before we do (measured once, under load: the
# task's children were still running when the launcher had exited).
for i in $(seq 50); do
    left=$(find /sys/fs/cgroup/systemd -mindepth 2 -name cgroup.procs -exec cat {} +)
    [ -z "$left" ] && break
    kill -9 $left 2>/dev/null
    sleep 0.1
done
find /sys/fs/cgroup/systemd -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null
# A removed cgroup stays its parent's child until it is released, after an RCU grace period; an
# unmount before then keeps the hierarchy alive (see sweep_hierarchy; 0.1 s: measured enough here).
sleep 0.1
umount /sys/fs/cgroup/systemd
exit $rc
"""


def unavailable(euid: int | None = None) -> str | None:
    if shutil.which("systemd-nspawn") is None:
        return "systemd-nspawn not installed (apt-get install --no-install-recommends systemd-container)"
    if (os.geteuid() if euid is None else euid) != 0:
        return NEED_ROOT
    if not Path("/sys/fs/cgroup/systemd").is_dir():
        return "no /sys/fs/cgroup/systemd to mount a private name=systemd hierarchy on"
    return None


def sweep_hierarchy(name: str) -> None:
    """Mount hierarchy `name` (if it still exists), kill what is in it, remove its cgroups, unmount: the
    hierarchy is then destroyed. Run in a mount namespace of its own, so the host sees no mount.

    Once more if it is still there after: a removed cgroup leaves its parent's list of children only
    when its last reference goes (kernel/cgroup/cgroup.c css_release_work_fn, after an RCU grace
    period), and an unmount that finds a child still listed keeps the hierarchy (cgroup1_kill_sb), now
    with no mount to remove it through (measured here: rmdir, then umount at once, left it listed in
    /proc/self/cgroup for good, 5 times in 5; with 0.1 s between, 0 in 5; a second mount and unmount
    destroyed it). Each pass waits that long before it unmounts; under load it may not be enough."""
    deadline = time.monotonic() + SWEEP_TIMEOUT
    for _ in range(SWEEP_PASSES):
        _sweep_pass(name, max(0.5, deadline - time.monotonic()))
        settled = time.monotonic() + 0.3  # the hierarchy itself goes an RCU grace period after its umount
        while known(name) and time.monotonic() < settled:
            time.sleep(0.05)
        if not known(name) or time.monotonic() >= deadline:
            return


def _sweep_pass(name: str, timeout: float) -> None:
    # Stamped: a sweeper killed mid-way (a guardian still at it when the harness judges the launch's
    # leftovers) leaves this empty directory to the next run's sweep (processes/owner.py).
    mnt = tempfile.mkdtemp(prefix=f"sbxc-nspawn-cg-{owner.stamp()}-")
    script = (
        'mount -t cgroup -o none,name="$1" sbxc-nspawn "$2" || exit 0; '
        'for f in $(find "$2" -mindepth 2 -name cgroup.procs); do '
        '  for p in $(cat "$f"); do kill -9 "$p" 2>/dev/null; done; done; '
        'for i in 1 2 3 4 5 6 7 8 9 10; do '
        '  find "$2" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null && break; sleep 0.2; done; '
        'sleep 0.1; umount "$2"'
    )
    # A session of its own, and on timeout the whole group is killed: subprocess.run's timeout kills
    # only `unshare`, and the shell it execs into leaves its `find`/`sleep` children behind (issue 28).
    sweeper = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", name, mnt],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        sweeper.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        try:  # noqa: SIM105 - the group may be gone already
            os.killpg(sweeper.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        sweeper.wait()
        os.rmdir(mnt)


def known(name: str) -> bool:
    """Is hierarchy `name` still alive (this process's /proc/self/cgroup lists every hierarchy)?"""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    return any(ln.split(":")[1] == f"name={name}" for ln in lines)


def forget(name: str, label: Path) -> None:
    """Sweep hierarchy `name` if it is still there, then remove the directory standing for it."""
    if known(name):
        sweep_hierarchy(name)
    shutil.rmtree(label, ignore_errors=True)


def guardian() -> int:
    """Its first line on stdin names the label and the hierarchy (_guardian.tell); then it waits for
    the launcher to be gone (EOF, however it died) and sweeps the hierarchy."""
    named = _guardian.told(LABEL_PREFIX)
    if named is None or not named[1].startswith(HIERARCHY_PREFIX):
        return 2
    label, name = named
    while sys.stdin.buffer.read(4096):
        pass
    forget(name, label)
    return 0


def launch(args: Sequence[str], spec: Mapping[str, Any]) -> int:
    values = oci.values_from_spec(spec)
    name = f"{HIERARCHY_PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
    guardian, w = _guardian.start_guardian(MODULE)
    # The guardian's stamp, as oci.py's workspace: while the guardian lives no sweep touches it.
    start = owner.start_time(guardian.pid)
    stamp = owner.Stamp(guardian.pid, start, owner.host_key()) if start is not None else owner.mine()
    label = Path(tempfile.mkdtemp(prefix=f"{LABEL_PREFIX}{stamp}-"))
    owner.ask_before_removal(label, [[sys.executable, "-m", MODULE, "--sweep", name]])
    _guardian.tell(w, label, name)

    def cleanup() -> None:
        # The hierarchy dies a moment after its last mount (an RCU grace period): wait for it, then
        # sweep it by name if it is still there (the script was killed before its own clean-up).
        deadline = time.monotonic() + 2
        while known(name) and time.monotonic() < deadline:
            time.sleep(0.05)
        forget(name, label)

    exe = shutil.which("systemd-nspawn") or "systemd-nspawn"
    nspawn = [exe, *(expand(f, values) for f in FLAGS), *args]
    # nspawn hands its own environment to the stub init, PID 1 of the task's /proc (measured: the
    # launcher's secret was in /proc/1/environ): it gets a fixed one.
    return _guardian.run_with_guardian(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", SCRIPT, "sh", name, *nspawn],
        what="systemd-nspawn", guardian=guardian, pipe=w, cleanup=cleanup,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m sandbox_conformance.conformance.adapters.nspawn", description=__doc__.splitlines()[0]
    )
    p.add_argument("--guardian", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sweep", metavar="HIERARCHY", help=argparse.SUPPRESS)
    p.add_argument("args", nargs=argparse.REMAINDER, help="-- the task's argv")
    a = p.parse_args(argv)
    if a.guardian:
        return guardian()
    if a.sweep is not None:
        if not a.sweep.startswith(HIERARCHY_PREFIX):
            p.error("--sweep: not one of our hierarchies")
        if known(a.sweep):
            sweep_hierarchy(a.sweep)
        return 0
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if not args:
        p.error("no task argv after --")
    why = unavailable()
    if why:
        print(f"nspawn adapter: {why}", file=sys.stderr)
        return 75  # EX_TEMPFAIL: this sandbox cannot run here (docs/launchers.md)
    spec_file = os.environ.get(oci.SPEC_ENV)
    if not spec_file:
        print(f"nspawn adapter: ${oci.SPEC_ENV} is not set (run me through `sandbox-conformance witness`)",
              file=sys.stderr)
        return 2
    try:
        return launch(args, json.loads(Path(spec_file).read_text()))
    except (OSError, ValueError, oci.BundleNotBuilt) as e:
        print(f"nspawn adapter: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
