"""The host's cgroup hierarchies and its binfmt_misc instance as kernel settings a task must not write
(the `kernel_interfaces` promise): the task finds them in its own mount table and tries one file of
each, the host finds them in the task's mount table as its kernel shows it, and the witness needs the
two to agree. The negative controls `cgroupfs_bound` and `binfmt_bound` (tests/test_controls_e2e.py)
prove the whole path on this host's kernel."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import signal
import subprocess
from collections.abc import Iterator
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


def _task(
    tried: list[dict[str, Any]], roots: list[dict[str, str]], binfmt: list[dict[str, str]] | None = None
) -> plan.Task:
    seen = observer.Seen(pid=1, namespaces={}, status={}, environ={}, mounts=(), cgroup="", proc_stat={},
                         reached={"cgroup_roots": roots, "proc_sys": None, "binfmt_mounts": binfmt or []})
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


# ---- binfmt_misc -------------------------------------------------------------------------------------

def test_the_task_tries_the_register_of_every_binfmt_misc_mount_it_sees() -> None:
    table: list[dict[str, object]] = [
        {"mount_point": "/proc/sys/fs/binfmt_misc", "fstype": "binfmt_misc"},
        {"mount_point": "/srv/binfmt/", "fstype": "binfmt_misc"},  # the same instance, bound twice
        {"mount_point": "/proc", "fstype": "proc"},
    ]
    assert inside.binfmt_settings(table) == ["/proc/sys/fs/binfmt_misc/register", "/srv/binfmt/register"]
    assert inside.binfmt_settings({"error": "ENOENT"}) == []


def test_the_host_lists_binfmt_misc_mounts_read_write_for_a_root_task_with_whose_instance_each_is() -> None:
    visible = [
        _mount(1, "/proc/sys/fs/binfmt_misc", "binfmt_misc"),  # dev 0:99, the host's below
        _mount(2, "/ro", "binfmt_misc", opts="ro"),  # read-only: register does not open for writing
        mountinfo.Mount(3, 1, "0:77", "/", "/own", ("rw",), "binfmt_misc", "x", ("rw",)),
    ]
    assert observer.binfmt_mounts(visible, ROOT, lambda: "0:99") == [
        {"mount_point": "/proc/sys/fs/binfmt_misc", "dev": "0:99", "instance": observer.HOSTS},
        {"mount_point": "/own", "dev": "0:77", "instance": observer.OWN},
    ]
    assert observer.binfmt_mounts(visible, MAPPED_USER, lambda: "0:99") == []  # register is 0200, root's
    asked: list[int] = []
    assert observer.binfmt_mounts([], ROOT, lambda: str(asked.append(1))) == [] and not asked  # no trial

    def cannot() -> str:
        raise LookupError("no unshare here")

    [unknown, _] = observer.binfmt_mounts(visible, None, cannot)  # unknown credentials: never excused
    assert unknown["instance"] == "unknown: no unshare here"


REGISTER = "/proc/sys/fs/binfmt_misc/register"
OPENED = [*REFUSED, {"path": REGISTER, "opened": True, "errno": None}]


def _binfmt(instance: str) -> list[dict[str, str]]:
    return [{"mount_point": "/proc/sys/fs/binfmt_misc", "dev": "0:40", "instance": instance}]


@pytest.mark.parametrize(
    ("tried", "binfmt", "says"),
    [
        (OPENED, _binfmt(observer.HOSTS), f"{REGISTER} (the host's binfmt_misc instance)"),
        (OPENED, _binfmt("unknown: timed out"), f"{REGISTER} (unknown: timed out binfmt_misc instance)"),
        # The host sees the host's instance in the task, which never looked (a decoy mount table).
        (REFUSED, _binfmt(observer.HOSTS), 'files: ["/proc/sys/fs/binfmt_misc (binfmt_misc, the host'),
        # Opened and the host could not observe: nothing excuses it.
        (OPENED, [], f"['{REGISTER}']"),
    ],
)
def test_the_witness_is_red_where_the_hosts_binfmt_misc_register_opens_or_is_never_tried(
    tried: list[dict[str, Any]], binfmt: list[dict[str, str]], says: str
) -> None:
    with pytest.raises(AssertionError, match=re.escape(says)):
        reach.test_the_hosts_kernel_settings_cannot_be_opened_for_writing(_task(tried, [], binfmt))


def test_a_user_namespaces_own_binfmt_misc_instance_is_not_a_way_out() -> None:
    own = _task(OPENED, [], _binfmt(observer.OWN))
    reach.test_the_hosts_kernel_settings_cannot_be_opened_for_writing(own)


@contextlib.contextmanager
def _holding(*unshare: str) -> Iterator[str]:
    """A process holding a binfmt_misc mount in a private mount namespace of its own: the device its
    mount shows, or the mount's error."""
    script = ("mount -t binfmt_misc sbxc-test /proc/sys/fs || exit 3; "
              "grep ' /proc/sys/fs ' /proc/self/mountinfo; echo END; exec sleep 60")
    proc = subprocess.Popen(["unshare", *unshare, "--propagation", "private", "sh", "-c", script],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            if line.strip() == "END":
                break
            lines.append(line)
        mounts = [m for m in mountinfo.parse("".join(lines)) if m.fstype == "binfmt_misc"]
        yield mounts[0].dev if mounts else f"error: {proc.wait(timeout=10)} {proc.stderr.read()}"  # type: ignore[union-attr]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_the_host_tells_its_own_binfmt_misc_instance_from_a_user_namespaces(root_only: None) -> None:
    host_mounts = mountinfo.parse(Path("/proc/self/mountinfo").read_text())
    with _holding("--mount") as held:
        assert ":" in held, held
        assert observer.binfmt_instance(host_mounts) == held  # the same superblock while it is held
    with _holding("--map-root-user", "--mount") as own:
        release = tuple(int(x) for x in re.findall(r"\d+", platform.release())[:2])
        if release < (6, 7):
            # Before Linux 6.7 binfmt_misc cannot be mounted in a user namespace: there is no
            # instance of its own to excuse.
            assert own.startswith("error"), own
            return
        assert ":" in own, own
        assert observer.binfmt_instance(host_mounts) != own
    assert "binfmt_misc" not in Path("/proc/self/mountinfo").read_text() or any(
        m.fstype == "binfmt_misc" for m in host_mounts
    ), "a trial mount reached the host's table"
