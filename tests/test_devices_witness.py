"""The devices witness counts an open that reached the device's driver as an open: EBUSY (a TPM held by
its resource manager, a VFIO group in use) or EIO come from the driver's own open method, after every
check a sandbox makes; only EPERM, EACCES and EROFS are refusals, ENXIO and ENODEV no device at all."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox_conformance.conformance import observer, plan
from sandbox_conformance.conformance.witnesses import reach


def _task(refused: list[str]) -> plan.Task:
    tried: list[dict[str, Any]] = [
        {"path": "/dev/null", "rdev": "1:3", "kind": "char", "allowed": True},
        {"path": "/dev/tpm0", "rdev": "10:224", "kind": "char", "allowed": False, "opened": False,
         "refused": refused},
    ]
    seen = observer.Seen(pid=1, namespaces={}, status={}, environ={}, mounts=(), cgroup="", proc_stat={},
                         reached={"devices": [{"path": "/dev/tpm0", "rdev": "10:224"}]})
    return plan.Task(doc={"devices": tried}, plan=None, values={}, host=None,  # type: ignore[arg-type]
                     host_after={}, launcher="x", seen=seen)


@pytest.mark.parametrize("refused", [["EPERM", "EPERM"], ["EACCES", "EACCES"], ["ENXIO", "ENXIO"],
                                     ["EACCES", "EROFS"]])
def test_a_refused_or_absent_device_is_kept(refused: list[str]) -> None:
    reach.test_only_allowlisted_device_nodes_can_be_opened(_task(refused))


@pytest.mark.parametrize("refused", [["EBUSY", "EBUSY"], ["EIO", "EACCES"], ["EACCES", "EAGAIN"]])
def test_an_open_the_driver_answered_is_broken(refused: list[str]) -> None:
    with pytest.raises(AssertionError, match=r"/dev/tpm0 .*the driver answered"):
        reach.test_only_allowlisted_device_nodes_can_be_opened(_task(refused))


def _seen_only(late: bool) -> plan.Task:
    node: dict[str, Any] = {"path": "/hostroot/dev/pts/0", "rdev": "136:0"}
    if late:
        node["late"] = True
    seen = observer.Seen(pid=1, namespaces={}, status={}, environ={}, mounts=(), cgroup="", proc_stat={},
                         reached={"devices": [node]})
    return plan.Task(doc={"devices": []}, plan=None, values={}, host=None,  # type: ignore[arg-type]
                     host_after={}, launcher="x", seen=seen)


def test_a_node_the_host_sees_and_the_task_never_tried_is_broken_unless_it_came_after_the_look() -> None:
    with pytest.raises(AssertionError, match=r"untried, \['/hostroot/dev/pts/0 \(136:0\)'\]"):
        reach.test_only_allowlisted_device_nodes_can_be_opened(_seen_only(late=False))
    reach.test_only_allowlisted_device_nodes_can_be_opened(_seen_only(late=True))


def test_the_host_marks_a_node_made_after_its_reading_began(tmp_path: Path) -> None:
    # A pseudo-terminal opened elsewhere while the task ran: its /dev/pts/N is born then (ctime).
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    (tmp_path / "dev").mkdir()
    # Pseudo-terminal slaves' numbers (136:N) on a node of a tmpfs: no devpts instance behind it, and
    # 240:N, "local/experimental use" (Documentation/admin-guide/devices.txt): no driver for either.
    os.mknod(tmp_path / "dev" / "early", 0o600 | stat.S_IFCHR, os.makedev(136, 250))
    time.sleep(0.05)  # the inode clock is coarse (a jiffy)
    looked_at = time.time()
    time.sleep(0.05)
    os.mknod(tmp_path / "dev" / "late", 0o600 | stat.S_IFCHR, os.makedev(136, 251))
    # Not a terminal: a ctime any owner can bump (chmod) excuses nothing.
    os.mknod(tmp_path / "dev" / "touched", 0o600 | stat.S_IFCHR, os.makedev(240, 1))
    found = {d["path"]: d for d in observer.device_nodes(tmp_path, [], {}, looked_at)}
    assert "late" not in found["/dev/early"] and found["/dev/late"].get("late") is True
    assert "late" not in found["/dev/touched"]
    assert all("late" not in d for d in observer.device_nodes(tmp_path, [], {}, None))
