"""runners/cgroup_setup.py: the container/VM set-up step, on a fake cgroup2 mount in tmp_path that
enforces the no-internal-process rule the way the kernel does. It runs for real inside the VM
(tests/test_vm.py); on this host only its refusals may run: nothing here writes to the host's tree."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_conformance.kernel import mountinfo as mountinfo_mod
from sandbox_conformance.kernel.cgroupfs import PROOF_LIMIT, CgroupFs, mount_at
from sandbox_conformance.processes.children import Completed
from sandbox_conformance.runners import cgroup_setup
from sandbox_conformance.runners.cgroup_setup import NoCgroupRoot, Setup, SetupMode, is_kernel_thread

REPO = Path(__file__).resolve().parent.parent
KTHREAD_STAT = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 8 0 0"
USER_STAT = "100 (python3 (x) y) S 1 100 100 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 8 0 0"


def mountinfo(mount: Path, fstype: str = "cgroup2", opts: str = "rw,nosuid") -> str:
    return (f"22 1 0:21 / /proc rw - proc proc rw\n"
            f"30 22 0:26 / {mount} {opts} shared:9 - {fstype} {fstype} rw,nsdelegate\n")


class FakeMount(CgroupFs):
    """A cgroup2 mount: mkdir populates interface files; cgroup.procs writes move pids; a
    subtree_control write on a non-root cgroup with processes fails EBUSY (cgroup-v2.rst)."""

    def __init__(self, mount: Path, controllers=("cpu", "memory", "pids")):
        self.mount = mount
        self.controllers = controllers
        self.writes: list[tuple[str, str]] = []
        self.kthreads = {"2"}

    def populate(self, path: Path, controllers) -> None:
        (path / "cgroup.procs").write_text("")
        (path / "cgroup.controllers").write_text(" ".join(controllers) + "\n")
        (path / "cgroup.subtree_control").write_text("")
        if path != self.mount:
            (path / "cgroup.type").write_text("domain\n")
        parent_enabled = (path.parent / "cgroup.subtree_control").read_text().split() if path != self.mount \
            else []
        if "memory" in parent_enabled:
            (path / "memory.max").write_text("max\n")

    def mkdir(self, path):
        os.mkdir(path)
        enabled = (path.parent / "cgroup.subtree_control").read_text().split()
        self.populate(path, enabled)

    def rmdir(self, path):
        for f in path.iterdir():
            f.unlink()
        os.rmdir(path)

    def write(self, path, text):
        before = path.read_text() if path.exists() else ""
        super().write(path, text)  # no O_CREAT: a missing interface file raises as on cgroupfs
        path.write_text(before)  # undo the plain file's overwrite; the kernel's semantics follow
        self.writes.append((str(path.relative_to(self.mount)), text))
        if path.name == "cgroup.procs":
            pid = int(text)
            for procs in self.mount.rglob("cgroup.procs"):
                procs.write_text("".join(f"{p}\n" for p in procs.read_text().split() if int(p) != pid))
            path.write_text(path.read_text() + f"{pid}\n")
        elif path.name == "cgroup.subtree_control":
            cg = path.parent
            if cg != self.mount and (cg / "cgroup.procs").read_text().split():
                raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))
            user_procs = [p for p in (cg / "cgroup.procs").read_text().split() if p not in self.kthreads]
            if cg == self.mount and user_procs:
                # a container's namespace root is not the real root: the rule applies to it too
                raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))
            path.write_text(" ".join(w.lstrip("+") for w in text.split()) + "\n")
        else:
            path.write_text(text)



@pytest.fixture
def host(tmp_path):
    mount = tmp_path / "sys" / "fs" / "cgroup"
    mount.mkdir(parents=True)
    fs = FakeMount(mount)
    fs.populate(mount, fs.controllers)
    (mount / "cgroup.procs").write_text("2\n100\n101\n")
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(mountinfo(mount))
    (proc / "self" / "ns").mkdir()
    (proc / "self" / "ns" / "cgroup").symlink_to("cgroup:[4026532811]")  # a private namespace
    for pid, text in (("2", KTHREAD_STAT), ("100", USER_STAT), ("101", USER_STAT.replace("100", "101", 1))):
        (proc / pid).mkdir()
        (proc / pid / "stat").write_text(text)
    return mount, proc, fs


def make(host, mode=SetupMode.container, env=None, runner=None) -> Setup:
    mount, proc, fs = host
    kw = {"runner": runner} if runner else {}
    return Setup(mode, mount=mount, proc=proc, env=env or {}, fs=fs, **kw)


def test_processes_move_to_supervisor_and_tasks_gets_memory_and_pids(host):
    mount, _, fs = host
    result = make(host).run()
    assert result.root == mount / "tasks"
    assert result.moved == (100, 101)
    assert (mount / "supervisor" / "cgroup.procs").read_text().split() == ["100", "101"]
    assert (mount / "cgroup.procs").read_text().split() == ["2"]  # the kernel thread stays
    assert set((mount / "cgroup.subtree_control").read_text().split()) == {"memory", "pids"}
    assert set((mount / "tasks" / "cgroup.subtree_control").read_text().split()) == {"memory", "pids"}
    # the proof: a memory.max write in a throwaway child that is gone afterwards
    proofs = [(p, t) for p, t in fs.writes if p.endswith("/memory.max")]
    assert proofs and proofs[0][0].startswith("tasks/sbxc-proof-") and proofs[0][1] == f"{PROOF_LIMIT}\n"
    assert sorted(p.name for p in (mount / "tasks").iterdir() if p.is_dir()) == []


def test_enabling_before_the_move_would_hit_the_no_internal_process_rule(host):
    mount, _, fs = host
    with pytest.raises(OSError) as e:
        fs.write(mount / "cgroup.subtree_control", "+memory")
    assert e.value.errno == errno.EBUSY  # what the move in step 2 exists to avoid


def test_a_read_only_mount_is_remounted_read_write(host):
    mount, proc, _ = host
    (proc / "self" / "mountinfo").write_text(mountinfo(mount, opts="ro,nosuid"))
    calls = []

    def runner(argv, *, timeout, input=None, env=None, cwd=None):
        calls.append(list(argv))
        (proc / "self" / "mountinfo").write_text(mountinfo(mount, opts="rw,nosuid"))
        return Completed(tuple(argv), 0, "", "", 0.1)

    assert make(host, runner=runner).run().remounted
    assert calls == [["mount", "-o", "remount,rw", str(mount)]]


def test_a_read_only_mount_without_cap_sys_admin_loses_the_witnesses_with_the_reason(host):
    mount, proc, fs = host
    (proc / "self" / "mountinfo").write_text(mountinfo(mount, opts="ro,nosuid"))

    def runner(argv, *, timeout, input=None, env=None, cwd=None):
        return Completed(tuple(argv), 32, "", "mount: permission denied", 0.1)

    with pytest.raises(NoCgroupRoot, match="CAP_SYS_ADMIN"):
        make(host, runner=runner).run()
    assert fs.writes == []


@pytest.mark.parametrize("fstype", ["tmpfs", "cgroup"])
def test_a_v1_or_hybrid_mount_is_refused_before_any_write(host, fstype):
    mount, proc, fs = host
    (proc / "self" / "mountinfo").write_text(mountinfo(mount, fstype=fstype))
    with pytest.raises(NoCgroupRoot, match="not cgroup2"):
        make(host).run()
    assert fs.writes == [] and not (mount / "supervisor").exists()


def test_vm_mode_outside_the_vm_is_refused_before_any_write(host):
    mount, _, fs = host
    with pytest.raises(NoCgroupRoot, match="SANDBOX_CONFORMANCE_IN_VM"):
        make(host, SetupMode.vm, env={}).run()
    assert fs.writes == [] and not (mount / "supervisor").exists()
    assert make(host, SetupMode.vm, env={"SANDBOX_CONFORMANCE_IN_VM": "1"}).run().root == mount / "tasks"


def test_a_container_in_the_hosts_cgroup_namespace_is_refused_before_any_write(host):
    mount, proc, fs = host
    (proc / "self" / "ns" / "cgroup").unlink()
    (proc / "self" / "ns" / "cgroup").symlink_to("cgroup:[4026531835]")  # PROC_CGROUP_INIT_INO
    with pytest.raises(NoCgroupRoot, match="--cgroupns=private"):
        make(host).run()
    assert fs.writes == [] and not (mount / "supervisor").exists()


def test_a_missing_memory_controller_is_named(host):
    mount, _, _ = host
    (mount / "cgroup.controllers").write_text("cpu pids\n")
    with pytest.raises(NoCgroupRoot, match="lacks memory"):
        make(host).run()


def test_a_proof_child_left_behind_fails_the_setup(host):
    mount, _, fs = host

    def rmdir(path):
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))

    fs.rmdir = rmdir
    with pytest.raises(NoCgroupRoot, match=r"could not clean up: FAILED to remove .*sbxc-proof-.*: EBUSY"):
        make(host).run()
    assert [p.name.startswith("sbxc-proof-") for p in (mount / "tasks").iterdir() if p.is_dir()] == [True]


def test_kernel_threads_are_told_apart_by_pf_kthread():
    assert is_kernel_thread(KTHREAD_STAT)
    assert not is_kernel_thread(USER_STAT)  # a comm with spaces and parentheses


def test_the_topmost_mount_at_the_point_wins():
    text = mountinfo(Path("/sys/fs/cgroup"), fstype="tmpfs") + \
        "40 30 0:30 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n"
    mounts = mountinfo_mod.parse(text)
    entry = mount_at(mounts, "/sys/fs/cgroup")
    assert entry is not None and entry.fstype == "cgroup2" and entry.read_only
    assert mount_at(mounts, "/nowhere") is None


# ---- on this host: only refusals, never a write


def test_the_cli_refuses_without_being_told_where_it_is(capsys):
    assert cgroup_setup.main([]) == 2
    assert "--in container|vm is required" in capsys.readouterr().err


def test_the_cli_in_vm_mode_on_this_host_refuses_with_exit_75(monkeypatch, capsys):
    monkeypatch.delenv("SANDBOX_CONFORMANCE_IN_VM", raising=False)
    assert cgroup_setup.main(["--in", "vm"]) == 75
    assert "SANDBOX_CONFORMANCE_IN_VM" in capsys.readouterr().err


def test_this_hosts_mount_is_judged_by_its_real_type():
    """Read-only: this host is hybrid (/sys/fs/cgroup is a tmpfs), so even `--in container` refuses."""
    entry = mount_at(mountinfo_mod.parse(Path("/proc/self/mountinfo").read_text()), "/sys/fs/cgroup")
    setup = Setup(SetupMode.container)
    if entry is None or entry.fstype != "cgroup2":
        with pytest.raises(NoCgroupRoot):
            setup.mount_entry()
    else:
        assert setup.mount_entry().fstype == "cgroup2"


def test_a_refused_setup_still_runs_the_command_but_without_a_root():
    """`-- CMD`: the rest of the suite must run when the cgroup witnesses cannot (they then skip with
    the probe's reason). On this host the vm guard refuses before any write."""
    env = {"PATH": "/usr/bin:/bin", "SANDBOX_CONFORMANCE_CGROUP_ROOT": "/inherited"}
    done = subprocess.run([sys.executable, "-m", "sandbox_conformance.runners.cgroup_setup", "--in", "vm",
                           "--",
                           "/bin/sh", "-c", 'echo "root=${SANDBOX_CONFORMANCE_CGROUP_ROOT-unset}"; exit 3'],
                          capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert done.returncode == 3
    assert "cgroup witnesses unavailable" in done.stderr
    assert done.stdout.strip() == "root=unset"  # an inherited promise is not passed on
