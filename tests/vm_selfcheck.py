"""What the VM mode promises, observed from inside one VM boot; prints one JSON document.

Run by tests/test_vm.py (and usable by hand) as root inside the guest:
    run_in_vm(["/usr/bin/python3", "-I", "-S", ".../tests/vm_selfcheck.py", "--user", "sbxc-test"], ...)
Everything is batched into this one program because the VM runs under TCG here (one boot per run):
  hierarchy   /proc/self/cgroup, the cgroup mounts, the root's controllers
  setup       runners.cgroup_setup --in vm: the delegated root it proved
  oom         a 200 MB allocation in a leaf with memory.max=32M: its exit status, memory.events
  pids        forking past pids.max in a leaf: the errno of the refused fork
  *_control   the same two without the limit: what a broken launcher would show (must differ)
  kill        a process tree in a leaf reaped whole by cgroup.kill
  bwrap       bwrap --unshare-user as the unprivileged user, inside a leaf: the uid map, the task's
              own /proc/self/cgroup, and a write to a neighbour leaf's memory.max refused
Each part records what it saw (or the error), never a verdict: the test asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox_conformance.conformance.cgroup_leaf import CgroupUnusable, LeafLimits, task_leaf, unique_name
from sandbox_conformance.runners.cgroup_setup import NoCgroupRoot, Setup, SetupMode

PY = "/usr/bin/python3"
MB = 1 << 20
TIMEOUT = 120


def loopback() -> dict[str, object]:
    """The harness's listeners sit on 127.0.0.1: it must be reachable in the guest's own namespace,
    or every network witness would pass whatever the sandbox does."""
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        code = client.connect_ex(server.getsockname())
    flags = int(Path("/sys/class/net/lo/flags").read_text(), 16)
    return {"connect": errno.errorcode.get(code, "ok") if code else "ok", "up": bool(flags & 0x1),
            "interfaces": sorted(os.listdir("/sys/class/net"))}


def hierarchy() -> dict[str, object]:
    mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
    return {
        "proc_self_cgroup": Path("/proc/self/cgroup").read_text().splitlines(),
        "cgroup_mounts": [[m[1], m[2]] for m in mounts if m[2] in ("cgroup", "cgroup2")],
        "controllers": Path("/sys/fs/cgroup/cgroup.controllers").read_text().split(),
    }


def oom(root: Path, memory_max: int | None = 32 * MB) -> dict[str, object]:
    """memory_max=None is the negative control: the same allocation in a leaf without the limit."""
    # b"x" * n writes every page; a bytearray(n) would be calloc'd zero pages never touched.
    code = "data = b'x' * (200 << 20); print(len(data))"
    with task_leaf(root, unique_name("oom"), LeafLimits(memory_max=memory_max, pids_max=16)) as leaf:
        done = subprocess.run([*leaf.enter_argv(), PY, "-I", "-S", "-c", code], capture_output=True,
                              text=True, timeout=TIMEOUT)
        return {"returncode": done.returncode, "stdout": done.stdout.strip(),
                "memory_events": leaf.memory_events(),
                "memory_max": (leaf.path / "memory.max").read_text().strip()}


FORKER = """
import errno, os, sys
r, w = os.pipe()
forked, refused = 0, None
for _ in range(64):
    try:
        pid = os.fork()
    except OSError as e:
        refused = errno.errorcode[e.errno]
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)   # hold the pid until the parent is done counting
        os._exit(0)
    forked += 1
os.close(w)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
print(forked, refused or "-")
"""


def pids(root: Path, pids_max: int | None = 8) -> dict[str, object]:
    """pids_max=None is the negative control: all 64 forks succeed."""
    with task_leaf(root, unique_name("pids"), LeafLimits(memory_max=256 * MB, pids_max=pids_max)) as leaf:
        done = subprocess.run([*leaf.enter_argv(), PY, "-I", "-S", "-c", FORKER], capture_output=True,
                              text=True, timeout=TIMEOUT)
        forked, refused = [*done.stdout.split(), "", ""][:2]
        return {"returncode": done.returncode, "forked": int(forked) if forked.isdigit() else None,
                "refused": None if refused in ("", "-") else refused, "pids_max": pids_max,
                "pids_events": leaf.pids_events(), "stderr": done.stderr[-500:]}


def kill(root: Path) -> dict[str, object]:
    # A tree: a shell with two background children and a grandchild that escaped into its own
    # session (setsid): only a cgroup-wide kill catches all of them.
    tree = "sleep 600 & sleep 600 & setsid sh -c 'sleep 600 & wait' & wait"
    tree_size = 5  # sh, two sleeps, the setsid sh and its sleep
    with task_leaf(root, unique_name("kill"), LeafLimits(pids_max=32)) as leaf:
        proc = subprocess.Popen([*leaf.enter_argv(), "/bin/sh", "-c", tree], start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while len(leaf.procs()) < tree_size and time.monotonic() < deadline:
                time.sleep(0.05)
            before = leaf.procs()
            method = leaf.kill(timeout=10)
            proc.wait(timeout=10)
            after = leaf.procs()
            time.sleep(0.3)  # orphans are reaped by our PID 1 (stage 2) every 50 ms
            alive = []
            for pid in before:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 0)
                    alive.append(pid)
            return {"before": before, "after": after, "method": str(method), "alive_after": alive,
                    "returncode": proc.returncode}
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


INSIDE = """
import errno, json, os, sys
out = {"cgroup": open("/proc/self/cgroup").read().splitlines(),
       "uid_map": open("/proc/self/uid_map").read().split(),
       "userns": os.readlink("/proc/self/ns/user"), "euid": os.geteuid()}
try:
    with open(sys.argv[1], "w") as f:
        f.write("max")
    out["neighbour_write"] = "ok"
except OSError as e:
    out["neighbour_write"] = errno.errorcode[e.errno]
print(json.dumps(out))
"""


def bwrap(root: Path, user: str) -> dict[str, object]:
    limits = LeafLimits(memory_max=256 * MB, pids_max=32)
    with task_leaf(root, unique_name("neighbour"), limits) as neighbour, \
            task_leaf(root, unique_name("bwrap"), limits) as leaf:
        argv = [*leaf.enter_argv(),
                "setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--inh-caps=-all", "--",
                "bwrap", "--unshare-user", "--unshare-pid", "--die-with-parent",
                "--ro-bind", "/", "/",
                "--proc", "/proc",
                "--dev", "/dev",
                "--", PY, "-I", "-S", "-c", INSIDE, str(neighbour.path / "memory.max")]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
        result: dict[str, object] = {
            "returncode": done.returncode, "stderr": done.stderr[-500:],
            "leaf": leaf.cgroup_path, "neighbour": neighbour.cgroup_path,
            "neighbour_memory_max": (neighbour.path / "memory.max").read_text().strip(),
            "outer_userns": os.readlink("/proc/self/ns/user")}
        with contextlib.suppress(json.JSONDecodeError):
            result["inside"] = json.loads(done.stdout)
        return result


def part(name: str, fn, *args) -> dict[str, object]:  # type: ignore[no-untyped-def]
    try:
        return fn(*args)
    except (CgroupUnusable, NoCgroupRoot, OSError, subprocess.SubprocessError) as e:
        detail = errno.errorcode.get(getattr(e, "errno", None) or 0, "")
        return {"error": f"{name}: {type(e).__name__}: {e}" + (f" ({detail})" if detail else "")}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--user", required=True)
    args = parser.parse_args()
    report: dict[str, object] = {"kernel": os.uname().release, "hierarchy": part("hierarchy", hierarchy),
                                 "loopback": part("loopback", loopback)}
    try:
        setup = Setup(SetupMode.vm).run()
        report["setup"] = {"root": str(setup.root), "moved": len(setup.moved), "remounted": setup.remounted}
        root = setup.root
    except NoCgroupRoot as e:
        report["setup"] = {"error": str(e)}
        print(json.dumps(report))
        return 1
    report["oom"] = part("oom", oom, root)
    report["pids"] = part("pids", pids, root)
    report["oom_control"] = part("oom_control", oom, root, None)
    report["pids_control"] = part("pids_control", pids, root, None)
    report["kill"] = part("kill", kill, root)
    report["bwrap"] = part("bwrap", bwrap, root, args.user)
    report["leftover_leaves"] = sorted(p.name for p in root.iterdir() if p.is_dir())
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
