"""The host_sockets witness excuses the sockets the host sees only where the task could make no unix
socket at all, by socket(2) or io_uring, because the sandbox refused it: a shortage (EMFILE under a
tiny RLIMIT_NOFILE, ENOBUFS) says nothing of what the sandbox lets through."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest

from sandbox_conformance.conformance import observer, plan
from sandbox_conformance.conformance.witnesses import reach

EXPOSED = [{"host_path": "/run/docker.sock", "path": "/run/docker.sock", "mount_point": "/run",
            "usable": True}]
SETTINGS: Any = SimpleNamespace(profile=SimpleNamespace(unix_allowed=()))


def _task(errno: str) -> plan.Task:
    tried = [{"path": p, "ok": False, "errno": errno, "stage": "socket",
              "io_uring": {"ok": False, "errno": "EPERM", "stage": "io_uring_setup"}}
             for p in ("/run/docker.sock", "/tmp/agentd.sock")]
    seen = observer.Seen(pid=1, namespaces={}, status={}, environ={}, mounts=(), cgroup="", proc_stat={},
                         reached={"sockets": EXPOSED})
    return plan.Task(doc={"unix_sockets": tried}, plan=None, values={}, host=None,  # type: ignore[arg-type]
                     host_after={}, launcher="x", seen=seen)


@pytest.mark.parametrize("errno", ["EPERM", "EACCES", "ENOSYS", "EAFNOSUPPORT"])
def test_a_refused_socket_excuses_what_the_host_sees(errno: str) -> None:
    reach.test_no_host_unix_socket_can_be_connected_to(_task(errno), SETTINGS)


@pytest.mark.parametrize("errno", ["EMFILE", "ENFILE", "ENOBUFS", "ENOMEM"])
def test_a_shortage_at_socket_excuses_nothing(errno: str) -> None:
    says = "the host sees ['/run/docker.sock at /run/docker.sock']"
    with pytest.raises(AssertionError, match=re.escape(says)):
        reach.test_no_host_unix_socket_can_be_connected_to(_task(errno), SETTINGS)
