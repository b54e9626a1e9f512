"""The cgroup witnesses' moving parts that run on any host: how the trials are sized from the profile,
and the witness program's trials themselves, run unsandboxed and unlimited (what a broken launcher
would give). Whether the limits BITE is witnessed in a real leaf in the VM tier (tests/test_vm.py:
TestRunModeVm), the only place this hybrid host can give a delegated cgroup v2 root."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sandbox_conformance.conformance import cgroup_leaf, harness, plan
from sandbox_conformance.conformance import profile as profile_mod


def test_the_trials_are_sized_from_the_profiles_limits_not_the_leafs() -> None:
    prof = profile_mod.load(None)
    t = plan.cgroup_trials(prof, {"workdir": "/w"}, "n1", "/sys/fs/cgroup/tasks/neighbour-1")
    assert t["memory_alloc"] == 512 * 2**20 + plan.MEMORY_PAST
    assert t["pids_forks"] == 256 + 16
    assert [w["path"] for w in t["neighbour_writes"]] == [
        "/sys/fs/cgroup/tasks/neighbour-1/cgroup.procs", "/sys/fs/cgroup/tasks/neighbour-1/memory.max"]
    assert t["tree_marker"] == f"/w/{plan.TREE_MARKER}n1"


def test_no_limit_means_no_trial_and_a_huge_pids_max_is_not_forked_out() -> None:
    prof = profile_mod.load(None)
    none = prof._replace(limits=profile_mod.Limits())
    t = plan.cgroup_trials(none, {"workdir": "/w"}, "n", None)
    assert t["memory_alloc"] is None and t["pids_forks"] is None and t["neighbour_writes"] == []
    huge = prof._replace(limits=profile_mod.Limits(pids_max=plan.PIDS_TRIAL_CAP + 1))
    assert plan.cgroup_trials(huge, {"workdir": "/w"}, "n", None)["pids_forks"] is None
    assert "cgroup" not in none.promises()


def test_the_witness_program_runs_its_trials_and_signals_its_tree(tmp_path: Path) -> None:
    """Unsandboxed and unlimited: the allocation survives, every fork succeeds, the writes to a
    neighbour that does not exist are refused (ENOENT), and the tree is announced only after the
    document is out."""
    trials = {
        "memory_alloc": 32 << 20,
        "pids_forks": 8,
        "neighbour_writes": [{"path": str(tmp_path / "no-such-leaf" / "memory.max"), "data": "max"}],
        "tree_marker": str(tmp_path / "marker"),
        "hold_seconds": 1,
    }
    p = plan.Plan(task_id="t", ops=(), tcp=(), unix_abstract=(), nested_userns=False, cgroup=trials)
    done = subprocess.run([sys.executable, "-I", "-S", "-"], input=plan.program(p), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["complete"] is True
    assert doc["memory_trial"] == {"size": 32 << 20, "signal": None, "exit": 0}
    assert doc["pids_trial"] == {"tries": 8, "forked": 8, "refused": None}
    assert doc["neighbour_writes"][0]["result"] == {"ok": False, "errno": "ENOENT"}
    assert doc["cgroup_self"] == Path("/proc/self/cgroup").read_text()  # unsandboxed: ours
    roles = [t["role"] for t in doc["tree"]]
    assert roles == ["child", "setsid child", "setsid grandchild"]
    marker = json.loads((tmp_path / "marker").read_text())
    assert marker == {"pid": doc["pid"], "ready": True}
    # The grandchild really left the program's session (what a process-group kill would miss).
    grand = harness.host_view(doc["tree"][2]["pid"])
    if grand is not None and grand["state"] not in ("Z", "X"):
        assert grand["sid"] != os.getsid(0)
    # Nothing is left behind: the tree sleeps hold_seconds (1) and exits.
    deadline = time.monotonic() + 10
    alive = [t["pid"] for t in doc["tree"]]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if (v := harness.host_view(pid)) is not None and v["state"] not in "ZX"]
    assert alive == []


def test_the_host_view_of_a_process_matches_what_it_knows_of_itself() -> None:
    me = harness.host_view(os.getpid())
    assert me is not None and me["sid"] == os.getsid(0) and me["nspid"][-1] == os.getpid()
    assert me["state"] in "RS" and me["cgroup"] == Path("/proc/self/cgroup").read_text().splitlines()
    assert harness.host_view(2**22 + 1) is None  # above pid_max: gone, not an error


class _MarkerLeaf:
    """Stands in for the task's cgroup leaf (no delegated root here): empty, and its kill SIGKILLs the
    process that wrote the marker, as cgroup.kill would the task."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker
        self.path = marker.parent  # named in the kill ledger (processes/kills.py), as a leaf's path is

    def procs(self) -> list[int]:
        return []

    def kill(self, *, timeout: float) -> cgroup_leaf.KillMethod:
        os.kill(json.loads(self.marker.read_text())["pid"], signal.SIGKILL)
        return cgroup_leaf.KillMethod.cgroup_kill


def test_a_launch_ended_by_the_harness_tree_kill_is_reported_as_the_clean_exit_it_is(tmp_path: Path) -> None:
    """The launcher dies of the harness's own SIGKILL once the document is out: the runner reports
    exit 0 and keeps what the launch printed. A SIGKILL the harness did not send stays one."""
    marker = tmp_path / "marker"
    # `exec` keeps the pid the marker names: the sleep is what the kill ends.
    script = f'echo doc; echo "{{\\"ready\\": true, \\"pid\\": $$}}" > {marker}; exec sleep 30'
    killer = harness._TreeKill(_MarkerLeaf(marker), marker, timeout=20)
    killer.start()
    try:
        done = killer.runner(["sh", "-c", script], timeout=20)
    finally:
        killer.stop()
    assert killer.killed, killer.result
    assert done.returncode == 0 and not done.timed_out and done.seconds < 20
    assert done.stdout == "doc\n"

    other = harness._TreeKill(_MarkerLeaf(marker), tmp_path / "never", timeout=20)
    unexpected = other.runner(["sh", "-c", "kill -9 $$"], timeout=20)
    assert unexpected.returncode == -signal.SIGKILL and not other.killed
