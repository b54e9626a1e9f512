"""The cgroup set-up step of container and VM modes: turn the cgroup2 mount we were given into a
delegated root the cgroup witnesses can use, and say so only once a limit write has been proved.

    python3 -m sandbox_conformance.runners.cgroup_setup --in vm
        # prints SANDBOX_CONFORMANCE_CGROUP_ROOT=...
    python3 -m sandbox_conformance.runners.cgroup_setup --in container -- pytest ...
        # runs pytest with it exported

Steps (Documentation/admin-guide/cgroup-v2.rst):
1. /sys/fs/cgroup must be a cgroup2 mount (never a v1 or hybrid tmpfs); remount it read-write if a
   container engine mounted it read-only (needs CAP_SYS_ADMIN; without it these witnesses are lost
   and the rest of the suite runs).
2. Move every process of the mount's root cgroup into `supervisor/`: "no internal process" rule, a
   non-root cgroup with processes cannot enable controllers for its children (subtree_control write
   fails with EBUSY). Kernel threads (in the real root, inside a VM) cannot move and need not: the real
   root is exempt from the rule.
3. Enable memory and pids in the mount root's subtree_control, make `tasks/` and enable them there too,
   so every leaf under tasks/ has memory.max and pids.max.
4. Prove it: a throwaway child of tasks/ accepts a memory.max write and reads it back (probes/cgroupfs
   prove, the cgroup.delegation probe's proof). Only then is SANDBOX_CONFORMANCE_CGROUP_ROOT=<mount>/tasks
   printed or exported.

It refuses to run without `--in container|vm`; `--in vm` also needs SANDBOX_CONFORMANCE_IN_VM=1 (set by
the VM's stage 2) and `--in container` a cgroup namespace of its own (with --cgroupns=host the mount
root is the host's root): it can never rearrange a host's own tree by accident.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from sandbox_conformance.kernel import mountinfo
from sandbox_conformance.kernel.cgroupfs import (
    PROMISE_ENV,
    CgroupFs,
    initial_cgroupns,
    mount_at,
    prove,
    v1_bound_controllers,
)
from sandbox_conformance.kernel.errnos import errname
from sandbox_conformance.processes.children import Runner, run

CONTROLLERS = ("memory", "pids")  # what the task limits need (memory.max, memory.swap.max, pids.max)
PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread


class SetupMode(enum.StrEnum):
    container = "container"
    vm = "vm"


class NoCgroupRoot(Exception):
    """The cgroup witnesses cannot run here: one line naming the step and the errno."""


@dataclasses.dataclass(frozen=True)
class SetupResult:
    mount: Path
    root: Path
    moved: tuple[int, ...]
    controllers: tuple[str, ...]
    remounted: bool


def is_kernel_thread(stat_text: str) -> bool:
    """/proc/<pid>/stat field 9 (flags) has PF_KTHREAD. The comm field may hold spaces and ")":
    split after the last ")"."""
    after = stat_text.rpartition(")")[2].split()
    return len(after) > 6 and int(after[6]) & PF_KTHREAD != 0


@dataclasses.dataclass(frozen=True)
class Setup:
    mode: SetupMode
    mount: Path = Path("/sys/fs/cgroup")
    proc: Path = Path("/proc")
    env: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(os.environ))
    fs: CgroupFs = dataclasses.field(default_factory=CgroupFs)
    runner: Runner = run

    def check_allowed(self) -> None:
        if self.mode is SetupMode.vm and self.env.get("SANDBOX_CONFORMANCE_IN_VM") != "1":
            raise NoCgroupRoot("--in vm outside the VM mode's guest (SANDBOX_CONFORMANCE_IN_VM is not 1): "
                             "refusing to rearrange this host's cgroup tree")
        # A container sharing the host's cgroup namespace (--cgroupns=host, or a bind of the host's
        # /sys/fs/cgroup) sees the host's whole tree at the mount root: moving "our" processes would
        # move every process of the host. Only a private namespace makes the root ours. Without cgroup
        # namespaces (kernel < 4.6) we cannot tell, so refuse.
        if self.mode is SetupMode.container and initial_cgroupns(self.proc):
            raise NoCgroupRoot("the container shares the host's cgroup namespace: refusing to rearrange "
                                 "the host's tree (run it with --cgroupns=private)")

    def mount_entry(self) -> mountinfo.Mount:
        entry = mount_at(mountinfo.parse((self.proc / "self" / "mountinfo").read_text()), str(self.mount))
        if entry is None:
            raise NoCgroupRoot(f"nothing mounted at {self.mount}")
        if entry.fstype != "cgroup2":
            raise NoCgroupRoot(f"{self.mount} is {entry.fstype}, not cgroup2 (a v1 or hybrid layout cannot "
                             "delegate memory to a v2 leaf)")
        return entry

    def remount_rw(self) -> bool:
        entry = self.mount_entry()
        if not entry.read_only:
            return False
        done = self.runner(["mount", "-o", "remount,rw", str(self.mount)], timeout=10)
        if not done.ok:
            raise NoCgroupRoot(f"{self.mount} is read-only and remount,rw failed ({done.stderr_tail(1)}): "
                             "the container needs CAP_SYS_ADMIN (--privileged or --cap-add SYS_ADMIN)")
        if self.mount_entry().read_only:
            raise NoCgroupRoot(f"{self.mount} still read-only after remount,rw")
        return True

    def _write(self, path: Path, text: str, step: str) -> None:
        try:
            self.fs.write(path, text)
        except OSError as e:
            raise NoCgroupRoot(f"{step}: write {text!r} to {path}: {errname(e)}") from e

    def _mkdir(self, path: Path) -> None:
        try:
            self.fs.mkdir(path)
        except FileExistsError:
            pass
        except OSError as e:
            raise NoCgroupRoot(f"mkdir {path}: {errname(e)}") from e

    def _kthread(self, pid: int) -> bool:
        try:
            return is_kernel_thread((self.proc / str(pid) / "stat").read_text())
        except FileNotFoundError:
            return False

    def move_to_supervisor(self) -> tuple[int, ...]:
        supervisor = self.mount / "supervisor"
        self._mkdir(supervisor)
        moved: list[int] = []
        # A process may fork while we move its siblings: repeat until only kernel threads remain.
        for _ in range(20):
            pids = [int(p) for p in self.fs.read(self.mount / "cgroup.procs").split()]
            todo = [p for p in pids if not self._kthread(p)]
            if not todo:
                return tuple(moved)
            for pid in todo:
                try:
                    self.fs.write(supervisor / "cgroup.procs", str(pid))
                    moved.append(pid)
                except ProcessLookupError:
                    continue  # exited meanwhile
                except OSError as e:
                    raise NoCgroupRoot(f"move pid {pid} into {supervisor}: {errname(e)}") from e
        raise NoCgroupRoot(f"{self.mount / 'cgroup.procs'} kept gaining processes: could not empty it")

    def v1_bound(self) -> list[str]:
        """Controllers this kernel has bound to a v1 hierarchy (/proc/cgroups is not namespaced: a
        container sees the host's bindings)."""
        try:
            return v1_bound_controllers((self.proc / "cgroups").read_text())
        except FileNotFoundError:
            return []

    def enable(self, cgroup: Path) -> tuple[str, ...]:
        available = self.fs.read(cgroup / "cgroup.controllers").split()
        missing = [c for c in CONTROLLERS if c not in available]
        if missing:
            # A controller bound to a v1 hierarchy cannot appear in any cgroup2 hierarchy ("a controller
            # can be bound to only one hierarchy", cgroup-v2.rst "Mounting"): on a hybrid host no
            # delegation can give it, so name that rather than the parent.
            held = [c for c in missing if c in self.v1_bound()]
            why = (f"{' '.join(held)} bound to a cgroup v1 hierarchy on this kernel (hybrid layout)" if held
                   else "the parent did not delegate them")
            raise NoCgroupRoot(f"{cgroup / 'cgroup.controllers'} lacks {' '.join(missing)} (has: "
                             f"{' '.join(available) or 'nothing'}): {why}")
        self._write(cgroup / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS),
                    "enable controllers")
        return CONTROLLERS

    def prove(self, root: Path, enabled: Sequence[str]) -> None:
        proof = prove(root, enabled, self.fs)
        if proof.leftover:
            raise NoCgroupRoot(f"prove memory.max under {root}: could not clean up: {proof.leftover}")
        if not proof.ok:
            raise NoCgroupRoot(f"prove memory.max under {root}: {proof.what}")

    def run(self) -> SetupResult:
        self.check_allowed()
        remounted = self.remount_rw()
        moved = self.move_to_supervisor()
        controllers = self.enable(self.mount)
        root = self.mount / "tasks"
        self._mkdir(root)
        self.prove(root, self.enable(root))
        return SetupResult(self.mount, root, moved, controllers, remounted)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m sandbox_conformance.runners.cgroup_setup",
                                     description="Container/VM modes only: make a delegated cgroup v2 root.")
    parser.add_argument("--in", dest="mode", choices=[m.value for m in SetupMode],
                        help="where we are: required, so this never runs on a host by accident")
    parser.add_argument("--mount", type=Path, default=Path("/sys/fs/cgroup"))
    parser.epilog = "-- CMD...: after set-up, exec CMD with the root exported (and without it on failure)"
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.mode is None:
        print("sandbox-conformance: cgroup_setup: --in container|vm is required (never run on a host)",
              file=sys.stderr)
        return 2
    try:
        result = Setup(SetupMode(args.mode), mount=args.mount).run()
    except NoCgroupRoot as e:
        print(f"sandbox-conformance: cgroup witnesses unavailable: {e}", file=sys.stderr)
        if command:
            # The rest of the suite still runs; the cgroup witnesses skip (or fail under the require
            # switch) with the cgroup.delegation probe's reason. A promise inherited from outside is
            # not ours to pass on: this step is what makes the promise in these modes.
            os.environ.pop(PROMISE_ENV, None)
            os.execvp(command[0], command)
        return 75
    line = f"{PROMISE_ENV}={result.root}"
    if command:
        os.environ[PROMISE_ENV] = str(result.root)
        os.execvp(command[0], command)
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
