"""kernel/mountinfo.py: which mount serves a path, and where a filesystem's subtree shows, from mount
tables written the way the kernel writes them (a mount on top of another is its child)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_conformance.kernel import mountinfo as mi

# A bwrap-shaped task: tmpfs root, /usr and {state} bound read-only from the host disk (8:1), a mask
# on {state}/db, a hiding tmpfs on {state}/users with the workdir bound back on top.
TASK = """\
10 1 0:40 / / rw,nosuid - tmpfs tmpfs rw
11 10 8:1 /usr /usr ro,nosuid - ext4 /dev/vda rw
12 10 8:1 /tmp/L/state /tmp/L/state ro,nosuid - ext4 /dev/vda rw
13 12 0:41 / /tmp/L/state/db ro - tmpfs tmpfs rw
14 12 0:42 / /tmp/L/state/users ro - tmpfs tmpfs rw
15 14 8:1 /tmp/L/state/users/alice/work /tmp/L/state/users/alice/work rw - ext4 /dev/vda rw
16 10 0:43 / /proc rw - proc proc rw
"""


def test_the_innermost_mount_serves_a_path() -> None:
    mounts = mi.parse(TASK)
    assert mi.serving(mounts, "/usr/bin/python3").mount_point == "/usr"
    assert mi.serving(mounts, "/tmp/L/state/db/canary").fstype == "tmpfs"
    assert mi.serving(mounts, "/tmp/L/state/config.toml").mount_point == "/tmp/L/state"
    assert mi.serving(mounts, "/tmp/L/state/users/bob").mount_id == 14
    assert mi.serving(mounts, "/tmp/L/state/users/alice/work/x").mount_id == 15


def test_a_mount_on_top_hides_the_one_beneath_and_everything_mounted_in_it() -> None:
    mounts = mi.parse(TASK + "17 12 0:44 / /tmp/L/state rw - tmpfs tmpfs rw\n")
    shown = {m.mount_id for m in mi.on_top(mounts)}
    # 17 covers 12, and with it 13, 14 and 15 beneath.
    assert shown == {10, 11, 16, 17}
    assert mi.serving(mounts, "/tmp/L/state/db/canary").mount_id == 17


def test_a_protected_subtree_masked_at_its_own_path_is_exposed_nowhere() -> None:
    mounts = mi.parse(TASK)
    db = mi.Location("8:1", "/tmp/L/state/db")
    neighbour = mi.Location("8:1", "/tmp/L/state/users/alice/tasks/other/control")
    assert mi.exposures(mounts, db) == []
    assert mi.exposures(mounts, neighbour) == []


def test_an_alias_of_the_host_root_exposes_the_protected_subtree_under_its_name() -> None:
    mounts = mi.parse(TASK + "18 10 8:1 / /hostroot ro - ext4 /dev/vda rw\n")
    [exp] = mi.exposures(mounts, mi.Location("8:1", "/tmp/L/state/db"))
    assert exp.path == "/hostroot/tmp/L/state/db" and exp.mount.mount_id == 18


def test_a_bind_of_a_part_of_a_protected_subtree_is_an_exposure_at_its_mount_point() -> None:
    mounts = mi.parse(TASK + "18 10 8:1 /tmp/L/state/db/canary /canary ro - ext4 /dev/vda rw\n")
    [exp] = mi.exposures(mounts, mi.Location("8:1", "/tmp/L/state/db"))
    assert exp.path == "/canary"


def test_another_filesystem_with_the_same_paths_is_no_exposure() -> None:
    mounts = mi.parse(TASK + "18 10 8:2 / /hostroot ro - ext4 /dev/vdb rw\n")
    assert mi.exposures(mounts, mi.Location("8:1", "/tmp/L/state/db")) == []


def test_read_only_comes_from_the_mount_or_its_superblock() -> None:
    [a, b, c] = mi.parse(
        "1 0 8:1 / /a ro - ext4 x rw\n2 0 8:1 / /b rw - ext4 x ro\n3 0 8:1 / /c rw - ext4 x rw\n"
    )
    assert (a.read_only, b.read_only, c.read_only) == (True, True, False)


@pytest.mark.parametrize(
    ("path", "top", "under"),
    [("/a/b", "/a", True), ("/a/bc", "/a/b", False), ("/a", "/a", True), ("/x", "/", True)],
)
def test_under_compares_whole_components(path: str, top: str, under: bool) -> None:
    assert mi.under(path, top) is under


def test_escaped_mount_points_are_decoded() -> None:
    [m] = mi.parse("1 0 8:1 / /with\\040space rw - ext4 x rw\n")
    assert m.mount_point == "/with space"


def test_this_hosts_own_table_serves_every_path_from_some_mount() -> None:
    mounts = mi.parse(Path("/proc/self/mountinfo").read_text())
    assert mi.serving(mounts, "/") is not None and mi.locate(mounts, "/usr/bin") is not None


def test_a_mount_over_an_ancestor_hides_the_submounts_beneath_it() -> None:
    # bwrap --ro-bind / / copies the host's submounts (here one under /tmp), then --tmpfs /tmp covers
    # the directory they hang in: lookups of /tmp/x/inner now end in the tmpfs.
    mounts = mi.parse(
        "1 0 0:40 / / rw - tmpfs tmpfs rw\n"
        "2 1 8:1 / / ro - ext4 /dev/vda rw\n"
        "3 2 0:50 / /tmp/x/inner rw - tmpfs none rw\n"
        "4 2 0:51 / /tmp rw - tmpfs tmpfs rw\n"
    )
    assert {m.mount_id for m in mi.on_top(mounts)} == {2, 4}
    assert mi.serving(mounts, "/tmp/x/inner/f").mount_id == 4


# ---- the task's own tree, from the mount its root really is -----------------------------------------

# firejail 0.9.72 --read-only=/ as root, from a live task's /proc/PID/mountinfo (ids kept, the rest
# cut down): 51 is the task's root (/proc/PID/root's mnt_id), remounted read-only; 90 is the
# read-write rbind of / that firejail stacked on it, with copies of the submounts. {state}/db is
# masked beneath the root, not in the stack.
FIREJAIL = """\
51 46 8:1 / / ro,relatime - ext4 /dev/vda rw
53 51 0:21 / /proc rw - proc proc rw
101 51 8:1 /etc /etc ro - ext4 /dev/vda rw
103 51 8:1 /usr /usr ro - ext4 /dev/vda rw
60 51 0:41 / /tmp/L/state/db ro - tmpfs tmpfs rw
90 51 8:1 / / rw,relatime - ext4 /dev/vda rw
92 90 0:21 / /proc rw - proc proc rw
115 90 8:1 /etc /etc ro - ext4 /dev/vda rw
119 90 8:1 /usr /usr ro - ext4 /dev/vda rw
"""


def test_paths_resolve_from_the_tasks_root_mount_not_the_one_stacked_on_it() -> None:
    reach = mi.reachable(mi.parse(FIREJAIL), 51)
    assert mi.serving(reach, "/tmp/L/state/db/canary").mount_id == 60
    assert mi.serving(reach, "/tmp/L/state/config.toml").mount_id == 51
    assert mi.serving(reach, "/tmp/L/state/config.toml").read_only
    assert mi.serving(reach, "/usr/bin/python3").mount_id == 103
    # The old reading took the last mount stacked at "/" for the root, and lost the mask with it.
    assert mi.serving(mi.parse(FIREJAIL), "/tmp/L/state/db/canary").mount_id == 90


def test_the_stack_on_the_root_is_reached_through_dotdot_and_named_so() -> None:
    reach = {m.mount_id: m for m in mi.reachable(mi.parse(FIREJAIL), 51)}
    assert set(reach) == {51, 53, 101, 103, 60, 90, 92, 115, 119}
    assert reach[90].mount_point == "/.." and not reach[90].read_only
    assert reach[119].mount_point == "/../usr"
    assert [m.mount_id for m in reach.values() if mi.over_root(m)] == [90, 92, 115, 119]
    # No canonical path of the profile lies under it ...
    assert mi.serving(tuple(reach.values()), "/etc/passwd").mount_id == 101
    # ... but the masked content is reachable through it, under a name that starts with `..`.
    [exp] = mi.exposures(tuple(reach.values()), mi.Location("8:1", "/tmp/L/state/db"))
    assert (exp.path, exp.mount.mount_id) == ("/../tmp/L/state/db", 90)


def test_a_covered_mount_and_a_shadowed_one_are_out_of_reach_with_what_hangs_in_them() -> None:
    mounts = mi.parse(
        "1 0 8:1 / / ro - ext4 x rw\n"
        "2 1 0:40 / /srv rw - tmpfs a rw\n"  # covered by 3
        "3 2 0:41 / /srv ro - tmpfs b rw\n"
        "4 2 0:42 / /srv/inner rw - tmpfs c rw\n"  # hangs in the covered 2
        "5 1 0:43 / /var/lib/x rw - tmpfs d rw\n"  # shadowed by 6, mounted later on an ancestor
        "6 1 0:44 / /var ro - tmpfs e rw\n"
    )
    assert [m.mount_id for m in mi.reachable(mounts, 1)] == [1, 3, 6]


def test_a_root_missing_from_the_table_is_walked_from_its_children() -> None:
    # A task chrooted into a directory of mount 7: mountinfo lists only what is under its root.
    mounts = mi.parse(
        "8 7 0:40 / /usr ro - tmpfs a rw\n"
        "9 7 0:41 / / rw - tmpfs b rw\n"  # mounted on the chroot directory after the chroot
    )
    reach = mi.reachable(mounts, 7)
    assert [(m.mount_id, m.mount_point) for m in reach] == [(8, "/usr"), (9, "/..")]


def test_the_reachable_mounts_read_the_same_through_on_top() -> None:
    # The witnesses hand the reachable tuple to serving() and on_top(): it must come back unchanged.
    for text, root in ((FIREJAIL, 51), (TASK, 10)):
        reach = mi.reachable(mi.parse(text), root)
        assert tuple(mi.on_top(reach)) == reach


def test_a_bwrap_shaped_task_reaches_what_on_top_shows() -> None:
    mounts = mi.parse(TASK)
    assert mi.reachable(mounts, 10) == tuple(mi.on_top(mounts))


def test_this_process_root_mount_is_the_one_at_slash_in_its_own_table() -> None:
    mounts = mi.parse(Path("/proc/self/mountinfo").read_text())
    root = mi.root_mount_id("self")
    assert any(m.mount_id == root and m.mount_point == "/" for m in mounts)
    assert mi.serving(mi.reachable(mounts, root), "/usr/bin") is not None


# The stacked shape made with a private mount namespace, the way firejail makes it: a root, a mount
# on the root directory after it became the root, then a read-only remount of "/", which lands on
# the root mount beneath. All of it on tmpfs in a namespace of its own: nothing reaches the host.
STACK_ON_ROOT = r"""
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def mount(src, target, fstype, flags, data=None):
    if libc.mount(src.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                  data.encode() if data else None) != 0:
        raise OSError(ctypes.get_errno(), f"mount {target}")
MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
d = sys.argv[1]
mount("none", d, "tmpfs", 0, "size=1m")
os.chroot(d)
os.chdir("/")
mount("none", "/", "tmpfs", 0, "size=1m")            # stacked on the root directory
mount("none", "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY)   # "/" names the root mount beneath
def write(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
print(write("/plain"), write("/../through-dotdot"), flush=True)
sys.stdin.read()
"""


@pytest.mark.integration
def test_a_mount_stacked_on_a_live_tasks_root_is_reached_only_through_dotdot(
    root_only: None, tmp_path: Path
) -> None:
    import select
    import shutil
    import subprocess

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) (util-linux)")
    task = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "/usr/bin/python3", "-I", "-S", "-c",
         STACK_ON_ROOT, str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert task.stdout is not None
        ready, _, _ = select.select([task.stdout], [], [], 10)
        assert ready, "the task did not set up its mounts within 10 s"
        line = task.stdout.readline()  # the task is set up and waits on stdin
        assert line, f"the task exited: {task.communicate(timeout=10)[1]}"
        plain, dotdot = line.split()
        mounts = mi.parse(Path(f"/proc/{task.pid}/mountinfo").read_text())
        root = mi.root_mount_id(task.pid)
    finally:
        task.kill()
        task.communicate(timeout=10)
    # What the kernel did: a path from "/" ends in the read-only root, one through `..` in the stack.
    assert (plain, dotdot) == ("EROFS", "ok")
    reach = mi.reachable(mounts, root)
    assert mi.serving(reach, "/plain").mount_id == root and mi.serving(reach, "/plain").read_only
    [stack] = [m for m in reach if mi.over_root(m)]
    assert stack.mount_point == "/.." and not stack.read_only
    # The stack-top reading took the read-write stack for the root: the false BROKEN of issue 29.
    assert not mi.serving(mounts, "/plain").read_only
