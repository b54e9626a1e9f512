"""The cgroup promises ([limits]): a leaf of the task's own, memory.max and pids.max kept, the task's
whole tree reaped with it, a neighbour's leaf out of reach."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_conformance.conformance.harness import WitnessSession
from sandbox_conformance.conformance.launch import NoObservation
from sandbox_conformance.conformance.plan import Task
from sandbox_conformance.conformance.plugin import Settings

# The autouse fixture that names the running witness for _task_view: pytest finds a fixture among a
# module's own names, so every module of the suite imports it.
from sandbox_conformance.conformance.witnesses._common import _current as _current
from sandbox_conformance.conformance.witnesses._common import (
    _seen,
    witness,
)
from sandbox_conformance.kernel.cgroupfs import PROMISE_ENV

# ---- cgroup limits -----------------------------------------------------------------------------------
# The harness gives each task its own leaf with the profile's limits (conformance/harness.py) when the
# cgroup.delegation probe proved a usable root; the witness program tries the limits from inside and
# the harness reads the leaf's event counters on the host. Also marked `cgroup` for `-m cgroup`.

cgroup = pytest.mark.cgroup


def _leaf(task: Task, session: WitnessSession) -> dict[str, Any]:
    if task.cgroup is None:
        _, why = session.cgroup_root()
        found = session.preconditions.get("cgroup.delegation")
        if found is not None and found.facts.get("promised") and not found.ok:
            # A set SANDBOX_CONFORMANCE_CGROUP_ROOT is a promise (STYLE.md 11): broken, it is a failure
            # of the run, never a quiet skip. Only an unset variable is an honest skip.
            raise NoObservation(
                f"{PROMISE_ENV} is set but unusable, so no task got a cgroup leaf: {found.reason} "
                f"(unset it to skip the cgroup witnesses instead)"
            )
        pytest.skip(f"no cgroup leaf for the task: {why}")
    return dict(task.cgroup)


def _own_cgroup(task: Task) -> dict[str, Any]:
    """For a launcher that keeps its own cgroups: the task's cgroup as the host's kernel shows it (its
    /proc/PID/cgroup, and that directory's limits read through the host's cgroup2 mount). None of it
    comes from the task or from the harness: the promise is the sandbox's."""
    files = dict(_seen(task).cgroup_files)
    assert "error" not in files, f"cannot tell the task's cgroup: {files.get('error')}"
    assert files["path"] != task.host.cgroup, (
        f"the task runs in the harness's own cgroup {files['path']}: no leaf of its own, no limit of its own"
    )
    return files


def _limit_kept(task: Task, name: str, promised: int | None) -> None:
    files = _own_cgroup(task)
    value = files.get(name, "")
    assert not value.startswith("error"), f"cannot tell {name} of the task's cgroup {files['path']}: {value}"
    assert value != "max" and promised is not None and int(value) <= promised, (
        f"the task's cgroup {files['path']} has {name} {value}, the profile promises {promised}"
    )


def _trial(task: Task, name: str) -> dict[str, Any]:
    trial = task.get(name)
    assert isinstance(trial, dict), f"the task made no {name.replace('_', ' ')}"
    assert "error" not in trial, f"the {name.replace('_', ' ')} could not be made: {trial['error']}"
    return trial


def _seen_by_host(task: Task, leaf: dict[str, Any], pid: int) -> dict[str, Any] | None:
    """The host's view (harness.host_view) of the task's process `pid` (as the task numbers it), among
    the processes the leaf's cgroup.procs listed while the task ran."""
    pidns = (task.get("namespaces") or {}).get("pid")
    before: list[dict[str, Any]] = (leaf.get("kill") or {}).get("before", [])
    for v in before:
        if v["pidns"] == pidns and v["nspid"] and v["nspid"][-1] == pid:
            return v
    return None


@witness("cgroup")
@cgroup
def test_the_task_runs_in_its_own_cgroup_leaf(sbxc_task: Task, sbxc_session: WitnessSession) -> None:
    if not sbxc_session.leaves_by_harness:
        files = _own_cgroup(sbxc_task)
        # Not the root either: a cgroup of the sandbox's own, somewhere below.
        assert files["path"] not in ("/", ""), f"the task runs in the root cgroup {files['path']!r}"
        return
    leaf = _leaf(sbxc_task, sbxc_session)
    kill = leaf.get("kill") or {}
    assert kill.get("before"), f"the host never saw the task's leaf populated: {kill.get('why')}"
    me = _seen_by_host(sbxc_task, leaf, sbxc_task.get("pid"))
    assert me is not None, (
        f"the task's process was not in its leaf {leaf['cgroup_path']} while it ran "
        f"(cgroup.procs held {[v['pid'] for v in kill['before']]})"
    )
    assert me["cgroup"] == [f"0::{leaf['cgroup_path']}"], (
        f"the host sees the task in {me['cgroup']}, not in its leaf {leaf['cgroup_path']}"
    )
    inside = sbxc_task.get("cgroup_self")
    assert isinstance(inside, str), f"the task could not read /proc/self/cgroup: {inside}"
    v2 = [line[3:] for line in inside.splitlines() if line.startswith("0::")]
    assert v2, f"no cgroup v2 line in the task's /proc/self/cgroup: {inside!r}"
    if v2[0] == "/":
        # A cgroup namespace (bwrap --unshare-cgroup-try) made while already in the leaf is rooted at
        # the leaf, so the leaf reads "/" (cgroup_namespaces(7)); in the host's namespace "/" would be
        # the root cgroup itself.
        assert sbxc_task.get("namespaces")["cgroup"] != sbxc_task.host.namespaces.get("cgroup"), (
            "the task reads 0::/ in the host's cgroup namespace: it is in the root cgroup"
        )
    else:
        assert v2[0] == leaf["cgroup_path"], f"the task reads 0::{v2[0]}, not its leaf {leaf['cgroup_path']}"


@witness("memory_max")
@cgroup
def test_an_allocation_past_memory_max_is_oom_killed(
    sbxc_task: Task, sbxc_session: WitnessSession, sbxc_settings: Settings
) -> None:
    if not sbxc_session.leaves_by_harness:
        # The kernel enforces what memory.max says, on the cgroup the host sees the task in.
        _limit_kept(sbxc_task, "memory.max", sbxc_settings.profile.limits.memory_max)
        return
    leaf = _leaf(sbxc_task, sbxc_session)
    trial = _trial(sbxc_task, "memory_trial")
    limit = sbxc_settings.profile.limits.memory_max
    assert trial["signal"] == 9, (
        f"a child allocating {trial['size'] >> 20} MiB under memory.max {limit} ended with "
        + (f"signal {trial['signal']}" if trial["signal"] is not None else f"exit {trial['exit']}")
        + ", not SIGKILL by the OOM killer"
    )
    assert leaf["oom_kill"] >= 1, f"the leaf's memory.events shows no oom_kill: {leaf['memory_events']}"


@witness("pids_max")
@cgroup
def test_forking_past_pids_max_fails_with_eagain(
    sbxc_task: Task, sbxc_session: WitnessSession, sbxc_settings: Settings
) -> None:
    if not sbxc_session.leaves_by_harness:
        _limit_kept(sbxc_task, "pids.max", sbxc_settings.profile.limits.pids_max)
        return
    leaf = _leaf(sbxc_task, sbxc_session)
    limit = sbxc_settings.profile.limits.pids_max
    if (sbxc_task.plan.cgroup or {}).get("pids_forks") is None:
        pytest.skip(f"pids_max {limit} is too large to exhaust from inside a witness")
    trial = _trial(sbxc_task, "pids_trial")
    assert trial["refused"] == "EAGAIN", (
        f"{trial['forked']} of {trial['tries']} forks succeeded under pids.max {limit}"
        + (f", then fork failed with {trial['refused']}" if trial["refused"] else "")
    )
    assert limit is not None and trial["forked"] < limit, f"{trial['forked']} forks under pids.max {limit}"
    assert leaf["pids_events"].get("max", 0) >= 1, f"the leaf's pids.events: {leaf['pids_events']}"


@witness("cgroup")
@cgroup
@pytest.mark.harness_leaf
def test_a_task_tree_is_reaped_whole_by_cgroup_kill(sbxc_task: Task, sbxc_session: WitnessSession) -> None:
    leaf = _leaf(sbxc_task, sbxc_session)
    kill = leaf.get("kill") or {}
    assert kill.get("killed"), f"the harness did not kill the task's leaf: {kill.get('why')}"
    tree = sbxc_task.get("tree")
    assert isinstance(tree, list) and len(tree) == 3, f"the task could not spawn its tree: {tree}"
    seen = {t["role"]: _seen_by_host(sbxc_task, leaf, t["pid"]) for t in tree}
    missing = [role for role, v in seen.items() if v is None]
    assert not missing, f"the host did not see the task's {', '.join(missing)} in its leaf"
    me = _seen_by_host(sbxc_task, leaf, sbxc_task.get("pid"))
    escaped = seen["setsid grandchild"]
    assert escaped is not None  # `missing` above is empty
    # Not vacuous: the grandchild really left the task's session, so a session or process-group kill
    # would have missed it.
    assert me is None or escaped["sid"] != me["sid"], "the setsid grandchild stayed in the task's session"
    assert kill["after"] == [], f"the leaf still lists {kill['after']} after cgroup.kill"
    assert kill["alive_after"] == [], (
        f"host pids {kill['alive_after']} of the task's leaf survived {kill['method']}"
    )


@witness("cgroup")
@cgroup
@pytest.mark.harness_leaf
def test_a_neighbour_tasks_leaf_is_not_writable_from_inside(
    sbxc_task: Task, sbxc_session: WitnessSession
) -> None:
    leaf = _leaf(sbxc_task, sbxc_session)
    writes = sbxc_task.get("neighbour_writes")
    assert writes, "the task made no write to the neighbour's leaf"
    broken = [w["path"] for w in writes if "error" in w["result"]]
    assert not broken, f"the writes to {broken} could not be tried"
    through = [f"{w['data']!r} > {w['path']}" for w in writes if w["result"].get("ok")]
    assert not through, f"the task wrote to a neighbour task's leaf: {', '.join(through)}"
    nb = leaf["neighbour"]
    assert nb["memory_max_after"] == nb["memory_max_before"], (
        f"the neighbour's memory.max changed: {nb['memory_max_before']} -> {nb['memory_max_after']}"
    )
    assert nb["procs_after"] == [], f"processes entered the neighbour's leaf: {nb['procs_after']}"
