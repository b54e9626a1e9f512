"""probes/mountinfo.py: which mount serves a path, and where a filesystem's subtree shows, from mount
tables written the way the kernel writes them (a mount on top of another is its child)."""

from __future__ import annotations

from pathlib import Path

import pytest

from probes import mountinfo as mi

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
