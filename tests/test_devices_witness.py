"""The devices witness counts an open that reached the device's driver as an open: EBUSY (a TPM held by
its resource manager, a VFIO group in use) or EIO come from the driver's own open method, after every
check a sandbox makes; only EPERM, EACCES and EROFS are refusals, ENXIO and ENODEV no device at all."""

from __future__ import annotations

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
