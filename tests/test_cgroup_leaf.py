"""conformance/cgroup_leaf.py on a fake cgroup tree in tmp_path (files standing in for the kernel's
interface files), plus the parts that can run on this host without touching its cgroup tree (the
/bin/sh shim enters a "cgroup.procs" that is a plain file). The real kernel behaviour (OOM kill,
EAGAIN past pids.max, cgroup.kill) is checked inside the VM by tests/test_vm.py."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
from pathlib import Path

import pytest

from sandbox_conformance.conformance.cgroup_leaf import (
    ENTER_FAILED,
    CgroupUnusable,
    KillMethod,
    Leaf,
    LeafLimits,
    leaf_path,
    make_leaf,
    parse_keyed,
    task_leaf,
)
from sandbox_conformance.kernel.cgroupfs import CgroupFs

INTERFACE = {"cgroup.procs": "", "cgroup.events": "populated 0\nfrozen 0\n", "cgroup.freeze": "0",
             "cgroup.kill": "", "memory.max": "max", "memory.swap.max": "max", "pids.max": "max",
             "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
             "pids.events": "max 0\n"}


class FakeCgroupFs(CgroupFs):
    """Emulates what the kernel does on cgroupfs: mkdir populates interface files, cgroup.kill and
    SIGKILL empty cgroup.procs, rmdir removes a populated-looking directory (optionally EBUSY first)."""

    def __init__(self, *, without=(), busy_rmdirs=0, stubborn=(), kill_empties=True):
        self.without = set(without)
        self.busy_rmdirs = busy_rmdirs
        self.stubborn = set(stubborn)  # pids that never leave
        self.kill_empties = kill_empties
        self.writes: list[tuple[Path, str]] = []
        self.signals: list[tuple[int, int]] = []
        self.rmdir_calls = 0
        self.populated: list[Path] = []  # leaves populate() put processes in

    def mkdir(self, path):
        os.mkdir(path)
        for name, text in INTERFACE.items():
            if name not in self.without:
                (path / name).write_text(text)

    def rmdir(self, path):
        self.rmdir_calls += 1
        if self.busy_rmdirs:
            self.busy_rmdirs -= 1
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))
        for f in path.iterdir():
            f.unlink()
        os.rmdir(path)

    def write(self, path, text):
        super().write(path, text)  # the real write: no O_CREAT, so a missing file raises
        self.writes.append((path, text))
        path.write_text(text)  # a cgroup file holds the last value written, not an overwrite
        if path.name == "cgroup.kill" and self.kill_empties:
            self._set_procs(path.parent, [p for p in self._procs(path.parent) if p in self.stubborn])

    def kill(self, pid, sig):
        self.signals.append((pid, sig))
        if pid in self.stubborn:
            return
        for leaf in self.populated:
            self._set_procs(leaf, [p for p in self._procs(leaf) if p != pid])

    @staticmethod
    def _procs(leaf):
        return [int(p) for p in (leaf / "cgroup.procs").read_text().split()]

    @staticmethod
    def _set_procs(leaf, pids):
        if leaf.exists():
            (leaf / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))


def populate(leaf: Leaf, fs: FakeCgroupFs, pids) -> None:
    """Processes "in" the leaf, as if tasks had entered it."""
    fs.populated = [leaf.path]
    fs._set_procs(leaf.path, pids)


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "cg" / "tasks"
    r.mkdir(parents=True)
    (r.parent / "cgroup.procs").write_text("")  # the mount root
    (r / "cgroup.procs").write_text("")
    return r


def test_a_leaf_gets_the_limits_and_swap_off(root):
    fs = FakeCgroupFs()
    leaf = make_leaf(root, "task-1", LeafLimits(memory_max=32 << 20, pids_max=8), fs=fs)
    assert leaf.path == root / "task-1"
    assert (leaf.path / "memory.max").read_text() == str(32 << 20)
    assert (leaf.path / "pids.max").read_text() == "8"
    # swap 0: an allocation past memory.max must be OOM-killed, not swapped out
    assert (leaf.path / "memory.swap.max").read_text() == "0"


def test_no_swap_accounting_is_not_an_error(root):
    fs = FakeCgroupFs(without={"memory.swap.max"})
    leaf = make_leaf(root, "task-1", LeafLimits(memory_max=1 << 20), fs=fs)
    assert not (leaf.path / "memory.swap.max").exists()  # never created by our write
    assert [p.name for p, _ in fs.writes] == ["memory.max"]


def test_a_controller_not_enabled_is_an_error_and_leaves_nothing_behind(root):
    fs = FakeCgroupFs(without={"memory.max", "memory.swap.max"})
    with pytest.raises(CgroupUnusable, match=r"memory controller is not enabled .*cgroup.subtree_control"):
        make_leaf(root, "task-1", LeafLimits(memory_max=1 << 20, pids_max=4), fs=fs)
    assert not (root / "task-1").exists()


@pytest.mark.parametrize("name", ["", "..", "../escape", "a/b", ".hidden", "cgroup.procs", "memory.max",
                                  "pids.max", "x" * 65, "sp ace"])
def test_a_name_that_could_leave_the_root_or_clash_is_refused(root, name):
    with pytest.raises(CgroupUnusable, match="bad leaf name"):
        leaf_path(root, name)
    with pytest.raises(CgroupUnusable):
        make_leaf(root, name, LeafLimits(), fs=FakeCgroupFs())
    assert sorted(p.name for p in root.parent.parent.iterdir()) == ["cg"]
    assert sorted(p.name for p in root.iterdir()) == ["cgroup.procs"]


def test_a_leaf_is_never_reused(root):
    fs = FakeCgroupFs()
    make_leaf(root, "task-1", LeafLimits(), fs=fs)
    with pytest.raises(CgroupUnusable, match="already exists"):
        make_leaf(root, "task-1", LeafLimits(), fs=fs)


def test_writes_outside_the_leaf_are_refused(root):
    leaf = make_leaf(root, "task-1", LeafLimits(), fs=FakeCgroupFs())
    with pytest.raises(CgroupUnusable, match="outside the leaf"):
        leaf._write_inside("../cgroup.procs", "1")


def test_task_leaf_kills_with_cgroup_kill_and_removes_even_when_the_body_fails(root):
    fs = FakeCgroupFs()
    with pytest.raises(RuntimeError, match="task blew up"), \
            task_leaf(root, "task-1", LeafLimits(pids_max=4), fs=fs) as leaf:
        populate(leaf, fs, [101, 102, 103])
        raise RuntimeError("task blew up")
    assert (leaf.path / "cgroup.kill", "1") in fs.writes
    assert fs.signals == []
    assert not leaf.path.exists()


def test_an_ebusy_rmdir_is_retried(root):
    fs = FakeCgroupFs(busy_rmdirs=2)
    with task_leaf(root, "task-1", LeafLimits(), fs=fs) as leaf:
        pass
    assert fs.rmdir_calls == 3
    assert not leaf.path.exists()


def test_a_leaf_busy_for_ever_is_an_error_after_the_timeout(root):
    fs = FakeCgroupFs(busy_rmdirs=10**6)
    leaf = make_leaf(root, "task-1", LeafLimits(), fs=fs)
    with pytest.raises(CgroupUnusable, match=r"rmdir .*EBUSY"):
        leaf.remove(timeout=0.1)


def test_without_cgroup_kill_the_leaf_is_frozen_and_each_pid_sigkilled(root):
    fs = FakeCgroupFs(without={"cgroup.kill"})
    leaf = make_leaf(root, "task-1", LeafLimits(), fs=fs)
    populate(leaf, fs, [201, 202])
    assert leaf.kill(timeout=2) is KillMethod.signal_loop
    assert (leaf.path / "cgroup.freeze", "1") in fs.writes
    assert sorted(fs.signals) == [(201, signal.SIGKILL), (202, signal.SIGKILL)]
    assert leaf.procs() == []


def test_a_pid_that_never_leaves_is_an_error_after_the_timeout(root):
    fs = FakeCgroupFs(stubborn={301})
    leaf = make_leaf(root, "task-1", LeafLimits(), fs=fs)
    populate(leaf, fs, [301, 302])
    with pytest.raises(CgroupUnusable, match=r"still holds pids \[301\]"):
        leaf.kill(timeout=0.1)


def test_oom_kills_are_read_from_memory_events(root):
    leaf = make_leaf(root, "task-1", LeafLimits(), fs=FakeCgroupFs())
    assert leaf.oom_kills() == 0
    (leaf.path / "memory.events").write_text("low 0\nhigh 0\nmax 35\noom 1\noom_kill 1\noom_group_kill 0\n")
    assert leaf.oom_kills() == 1
    assert parse_keyed("populated 1\nfrozen 0\n") == {"populated": 1, "frozen": 0}


def test_the_task_reads_the_leaf_relative_to_the_mount(root):
    leaf = make_leaf(root, "task-1", LeafLimits(), fs=FakeCgroupFs())
    assert leaf.cgroup_path == "/tasks/task-1"


# ---- the entering shim, for real, against a plain file standing in for cgroup.procs


def test_the_shim_writes_the_tasks_own_pid_before_the_task_runs(tmp_path):
    leafdir = tmp_path / "leaf"
    leafdir.mkdir()
    (leafdir / "cgroup.procs").write_text("")
    leaf = Leaf(tmp_path, leafdir)
    # The task prints its pid and what the procs file held when it started: `exec` keeps the pid,
    # so both must be the same number.
    task = ["/bin/sh", "-c", 'echo "$$ $(cat "$0")"', str(leaf.procs_file)]
    done = subprocess.run([*leaf.enter_argv(), *task], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    own, recorded = done.stdout.split()
    assert own == recorded


def test_the_task_never_runs_when_the_shim_cannot_enter(tmp_path):
    leaf = Leaf(tmp_path, tmp_path / "missing-leaf")
    marker = tmp_path / "ran"
    done = subprocess.run([*leaf.enter_argv(), "/bin/sh", "-c", f"touch {marker}"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == ENTER_FAILED
    assert "cannot enter cgroup" in done.stderr
    assert not marker.exists()
