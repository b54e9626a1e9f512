"""A procfs of the host's pid namespace bound into the task beside its own /proc (a monitoring agent's
`-v /proc:/host/proc`) lists every host process: the host finds it through the task's root
(conformance/observer.py host_procfs), and the pid witness fails on it. Real namespaces."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from sandbox_conformance.conformance import observer
from sandbox_conformance.kernel import mountinfo

# $1: where to bind the host's /proc ("" for no bind). Then a pid namespace with its own /proc, as a
# sandbox makes one, and a task sleeping in it.
TASK = ('[ -z "$1" ] || { mkdir -p "$1" && mount --bind /proc "$1"; } || exit 1; '
        'exec unshare --pid --fork --mount-proc sleep 300')


def _task(tmp_path: Path, bind: str) -> tuple[subprocess.Popen[bytes], int]:
    outer = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", TASK, "sh", bind],
                             stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        sleeps = [c.pid for c in psutil.Process(outer.pid).children(recursive=True) if c.name() == "sleep"]
        if sleeps:
            return outer, sleeps[0]
        time.sleep(0.02)
    outer.kill()
    raise AssertionError("the task never started")


@pytest.mark.parametrize("bind", ["", "hostproc"])
def test_a_procfs_of_the_hosts_pid_namespace_in_the_task_is_found(tmp_path: Path, bind: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("a mount namespace with a bind of /proc needs root")
    where = str(tmp_path / bind) if bind else ""
    outer, pid = _task(tmp_path, where)
    try:
        mounts = mountinfo.parse(Path(f"/proc/{pid}/mountinfo").read_text())
        seen = observer.host_procfs(Path(f"/proc/{pid}/root"), mounts)
        # The task's own /proc is never one: its `self` does not resolve for us.
        assert seen == ((where,) if bind else ()), seen
        assert any(m.mount_point == "/proc" and m.fstype == "proc" for m in mounts)
    finally:
        os.killpg(outer.pid, 9)
        outer.wait()


def test_the_kernels_files_are_tried_wherever_a_procfs_or_sysfs_is_mounted() -> None:
    from sandbox_conformance.conformance import inside

    paths = ["/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger", "/sys/kernel/uevent_helper"]
    table = [
        {"fstype": "proc", "root": "/", "mount_point": "/proc"},  # the task's own: the plan's paths
        {"fstype": "proc", "root": "/", "mount_point": "/host/proc"},
        {"fstype": "proc", "root": "/sys", "mount_point": "/srv/sysctl"},  # /proc/sys bound alone
        {"fstype": "proc", "root": "/sys", "mount_point": "/proc/sys"},  # bound over itself (nspawn)
        {"fstype": "sysfs", "root": "/", "mount_point": "/sys"},
        {"fstype": "sysfs", "root": "/kernel", "mount_point": "/k"},
        {"fstype": "tmpfs", "root": "/", "mount_point": "/host/x"},
    ]
    assert inside.elsewhere(paths, table) == [
        "/host/proc/sys/kernel/core_pattern", "/host/proc/sysrq-trigger",
        "/srv/sysctl/kernel/core_pattern",
        "/k/uevent_helper",
    ]
    assert inside.elsewhere(paths, "error: EACCES") == []


def test_the_secret_is_looked_for_in_every_procfs_the_task_reaches(tmp_path: Path) -> None:
    from sandbox_conformance.conformance import inside

    for top, pid, data in (("own", "1", b"A=1\0"), ("host", "4242", b"A=1\0KEY=s3cret\0")):
        (tmp_path / top / pid).mkdir(parents=True)
        (tmp_path / top / pid / "environ").write_bytes(data)
        (tmp_path / top / pid / "cmdline").write_bytes(b"x\0")
    procfs = [str(tmp_path / "own"), str(tmp_path / "host")]
    found = inside.secret_scan(b"s3cret", [], [], procfs)
    assert found["found"] == [f"{tmp_path}/host/4242/environ"] and found["processes"] == 2
    assert inside.secret_scan(b"s3cret", [], [], procfs[:1])["found"] == []


def test_device_nodes_are_tried_under_every_device_filesystem_given(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    from sandbox_conformance.conformance import inside

    (tmp_path / "sub").mkdir()
    # Char 240:0, "local/experimental use" (Documentation/admin-guide/devices.txt): no driver here,
    # so opening it answers ENXIO and touches nothing.
    os.mknod(tmp_path / "sub" / "node", 0o600 | stat.S_IFCHR, os.makedev(240, 0))
    out = inside.device_trials({}, [], ["/nonexistent-dev", str(tmp_path)])
    node = str(tmp_path / "sub" / "node")
    assert [(e["path"], e["rdev"], e["allowed"]) for e in out] == [(node, "240:0", False)]


def test_a_node_four_levels_down_is_found_by_the_task_and_the_host(tmp_path: Path) -> None:
    # /dev/bus/usb/001/004, a USB device handed in with `--device`: both walks stopped at 3 levels.
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    from sandbox_conformance.conformance import inside, observer

    deep = tmp_path / "dev" / "bus" / "usb" / "001"
    deep.mkdir(parents=True)
    # Char 240:0, "local/experimental use" (Documentation/admin-guide/devices.txt): no driver here.
    os.mknod(deep / "004", 0o600 | stat.S_IFCHR, os.makedev(240, 0))
    tried = inside.device_trials({}, [], [str(tmp_path / "dev")])
    assert [e["path"] for e in tried] == [str(deep / "004")]
    seen = observer.device_nodes(tmp_path, [], {})
    assert [d["path"] for d in seen] == ["/dev/bus/usb/001/004"]
