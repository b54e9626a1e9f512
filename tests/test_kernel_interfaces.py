"""The host's cgroup hierarchies as kernel settings a task must not write (the `kernel_interfaces`
promise): the task finds them in its own mount table and tries one file of each, the host finds them
in the task's mount table as its kernel shows it, and the witness needs the two to agree. The negative
control `cgroupfs_bound` (tests/test_controls_e2e.py) proves the whole path on this host's kernel."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from sandbox_conformance.conformance import inside, observer, plan
from sandbox_conformance.conformance.witnesses import reach
from sandbox_conformance.kernel import mountinfo

ROOT = observer.Creds(fsuid=0, fsgid=0, groups=frozenset(), mapped=((0, 4294967295),))
MAPPED_USER = observer.Creds(fsuid=1001, fsgid=1001, groups=frozenset(), mapped=((1001, 1),))


def _mount(mount_id: int, point: str, fstype: str, root: str = "/", opts: str = "rw") -> mountinfo.Mount:
    return mountinfo.Mount(mount_id, 1, "0:99", root, point, tuple(opts.split(",")), fstype, fstype, ("rw",))


def test_the_task_tries_a_v1_release_agent_and_the_v2_root_not_a_namespaces_root(tmp_path: Path) -> None:
    v1 = tmp_path / "memory"
    v1.mkdir()
    (v1 / "release_agent").write_text("\n")  # only a hierarchy's root has one
    v1_child = tmp_path / "pids"
    v1_child.mkdir()  # a v1 mount of a subtree (a cgroup namespace's): no release_agent
    v2_root = tmp_path / "unified"
    v2_root.mkdir()  # the hierarchy's real root: no cgroup.type (CFTYPE_NOT_ON_ROOT)
    v2_ns = tmp_path / "nsroot"
    v2_ns.mkdir()
    (v2_ns / "cgroup.type").write_text("domain\n")
    table: list[dict[str, object]] = [
        {"mount_point": str(v1), "fstype": "cgroup"},
        {"mount_point": str(v1_child), "fstype": "cgroup"},
        {"mount_point": str(v2_root), "fstype": "cgroup2"},
        {"mount_point": str(v2_ns), "fstype": "cgroup2"},
        {"mount_point": str(tmp_path), "fstype": "tmpfs"},
    ]
    assert inside.cgroup_settings(table) == [f"{v1}/release_agent", f"{v2_root}/cgroup.max.depth"]
    assert inside.cgroup_settings({"error": "ENOENT"}) == []  # no table: the host's reading still judges


def test_a_refused_write_back_is_recorded_and_the_value_is_unchanged(tmp_path: Path) -> None:
    setting = tmp_path / "cgroup.max.depth"
    setting.write_text("max\n")
    tried = inside.kernel_writes([str(setting), str(tmp_path / "missing")], [str(setting)])
    assert tried[0] == {"path": str(setting), "opened": True, "errno": None, "wrote_back": True}
    assert setting.read_text() == "max\n"  # its own value, never one of ours
    assert tried[1] == {"path": str(tmp_path / "missing"), "opened": False, "errno": "ENOENT"}


def test_the_host_lists_its_cgroup_roots_read_write_in_the_task_only_for_a_task_that_is_root_there() -> None:
    visible = [
        _mount(1, "/sys/fs/cgroup/memory", "cgroup"),
        _mount(2, "/sys/fs/cgroup/unified", "cgroup2"),
        _mount(3, "/sys/fs/cgroup/pids", "cgroup", opts="ro"),  # read-only: no write lands
        _mount(4, "/sys/fs/cgroup/systemd", "cgroup", root="/sbx/task"),  # the task's own subtree
        _mount(5, "/tmp", "tmpfs"),
    ]
    assert observer.cgroup_roots(visible, ROOT) == [
        {"mount_point": "/sys/fs/cgroup/memory", "fstype": "cgroup"},
        {"mount_point": "/sys/fs/cgroup/unified", "fstype": "cgroup2"},
    ]
    assert observer.cgroup_roots(visible, None) == observer.cgroup_roots(visible, ROOT)  # never excused
    assert observer.cgroup_roots(visible, MAPPED_USER) == []  # the files are root's, 0644


def _task(tried: list[dict[str, Any]], roots: list[dict[str, str]]) -> plan.Task:
    seen = observer.Seen(pid=1, namespaces={}, status={}, environ={}, mounts=(), cgroup="", proc_stat={},
                         reached={"cgroup_roots": roots, "proc_sys": None})
    return plan.Task(doc={"kernel_writes": tried}, plan=None, values={}, host=None,  # type: ignore[arg-type]
                     host_after={}, launcher="x", seen=seen)


REFUSED = [{"path": "/proc/sys/kernel/core_pattern", "opened": False, "errno": "EROFS"}]
UNIFIED = [{"mount_point": "/sys/fs/cgroup/unified", "fstype": "cgroup2"}]


@pytest.mark.parametrize(
    ("tried", "roots", "says"),
    [
        # A forged or stale program that never looks at its cgroup mounts: the host saw one.
        (REFUSED, UNIFIED, "tried none of their files: ['/sys/fs/cgroup/unified (cgroup2)']"),
        # A trial that found no such file there tried nothing either.
        ([*REFUSED, {"path": "/sys/fs/cgroup/unified/cgroup.max.depth", "opened": False, "errno": "ENOENT"}],
         UNIFIED, "tried none of their files"),
        # The write failed for another reason than permission: nothing says another value would.
        ([*REFUSED, {"path": "/sys/fs/cgroup/memory/release_agent", "opened": True, "errno": None,
                     "write_errno": "EINVAL"}], [], "release_agent (write-back: EINVAL)"),
        # The write landed.
        ([*REFUSED, {"path": "/sys/fs/cgroup/unified/cgroup.max.depth", "opened": True, "errno": None,
                     "wrote_back": True}], UNIFIED, "cgroup.max.depth (written back)"),
    ],
)
def test_the_witness_is_red_where_a_cgroup_root_was_written_or_never_tried(
    tried: list[dict[str, Any]], roots: list[dict[str, str]], says: str
) -> None:
    with pytest.raises(AssertionError, match=re.escape(says)):
        reach.test_the_hosts_kernel_settings_cannot_be_opened_for_writing(_task(tried, roots))


def test_a_release_agent_whose_write_the_kernel_refuses_is_out_of_reach() -> None:
    # Root in a user namespace of its own opens a v1 release_agent (0644, root's) but the kernel refuses
    # the write (cgroup1_release_agent_write, the CVE-2022-0492 fix): measured so under bwrap as root.
    tried = [*REFUSED, {"path": "/sys/fs/cgroup/memory/release_agent", "opened": True, "errno": None,
                        "write_errno": "EPERM"}]
    roots = [{"mount_point": "/sys/fs/cgroup/memory", "fstype": "cgroup"}]
    reach.test_the_hosts_kernel_settings_cannot_be_opened_for_writing(_task(tried, roots))
