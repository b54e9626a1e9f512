"""The nspawn adapter's private name= v1 hierarchy is never left behind: its guardian sweeps it when
the launcher dies, and if both die, the next run's sweep finds the stamped directory standing for it
and sweeps it by name (conformance/adapters/nspawn.py). Real hierarchies, on this kernel."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_conformance.conformance.adapters import _guardian, nspawn
from sandbox_conformance.processes import owner

# A process in a child cgroup of hierarchy $1 (mounted on $2, then unmounted: the child cgroup keeps
# the hierarchy alive, cgroups(7)), left sleeping: what a killed launcher leaves. The shell stays
# outside it and reaps it: an unreaped zombie would keep the cgroup busy (rmdir: EBUSY), as the
# container's own init would not.
PLANT = (
    'mount -t cgroup -o none,name="$1" sbxc-test "$2" && mkdir "$2/payload" || exit 1; '
    'sleep 300 & echo $! > "$2/payload/cgroup.procs"; umount "$2"; wait $!'
)


@pytest.fixture
def hierarchy(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    if os.geteuid() != 0:
        pytest.skip("mounting a cgroup v1 hierarchy needs root")
    if not Path("/sys/fs/cgroup/systemd").is_dir():
        pytest.skip("no cgroup v1 name=systemd on this host: nspawn's adapter does not run here")
    name = f"{nspawn.HIERARCHY_PREFIX}test-{os.getpid()}-{secrets.token_hex(3)}"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", PLANT,
                             "sh", name, str(mnt)], stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 10
    while not nspawn.known(name) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        assert nspawn.known(name), "the planted hierarchy must exist"
        yield name, proc
    finally:
        if nspawn.known(name):
            nspawn.sweep_hierarchy(name)  # kills the sleeper first: its shell, alive, reaps it
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _gone(name: str) -> bool:
    # A v1 hierarchy is destroyed an RCU grace period after its last cgroup and mount go.
    deadline = time.monotonic() + 5
    while nspawn.known(name) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not nspawn.known(name)


def test_the_next_runs_sweep_removes_a_hierarchy_whose_launcher_and_guardian_died(
        hierarchy: tuple[str, subprocess.Popen[bytes]], tmp_path: Path) -> None:
    name, payload = hierarchy
    dead = subprocess.Popen(["sleep", "30"])
    start = owner.start_time(dead.pid)
    assert start is not None
    dead.kill()
    dead.wait()
    label = tmp_path / f"{nspawn.LABEL_PREFIX}{owner.Stamp(dead.pid, start, owner.host_key())}-x"
    label.mkdir()
    owner.ask_before_removal(label, [[sys.executable, "-m", nspawn.MODULE, "--sweep", name]])
    swept = owner.sweep(dirs=[str(tmp_path)])
    assert [(s.path, s.problem) for s in swept] == [(str(label), "")]
    assert payload.wait(timeout=10) != 0, "what was in the hierarchy is killed"
    assert _gone(name)


def test_a_live_owners_hierarchy_is_not_swept(hierarchy: tuple[str, subprocess.Popen[bytes]],
                                             tmp_path: Path) -> None:
    name, payload = hierarchy
    label = tmp_path / f"{nspawn.LABEL_PREFIX}{owner.stamp()}-x"
    label.mkdir()
    owner.ask_before_removal(label, [[sys.executable, "-m", nspawn.MODULE, "--sweep", name]])
    assert owner.sweep(dirs=[str(tmp_path)]) == []
    assert nspawn.known(name) and payload.poll() is None and label.is_dir()


def test_the_guardian_sweeps_the_hierarchy_and_its_label_when_the_launcher_is_gone(
        hierarchy: tuple[str, subprocess.Popen[bytes]], tmp_path: Path) -> None:
    name, payload = hierarchy
    label = tmp_path / f"{nspawn.LABEL_PREFIX}{owner.stamp()}-x"
    label.mkdir()
    guardian, w = _guardian.start_guardian(nspawn.MODULE)
    try:
        _guardian.tell(w, label, name)
        time.sleep(0.2)
        assert guardian.poll() is None and nspawn.known(name), "nothing is swept while the launcher lives"
    finally:
        os.close(w)  # the launcher's end: EOF however it died
    assert guardian.wait(timeout=30) == 0
    assert payload.wait(timeout=10) != 0
    assert _gone(name)
    assert not label.exists()


def test_the_guardian_refuses_a_name_that_is_not_one_of_our_hierarchies(tmp_path: Path) -> None:
    guardian, w = _guardian.start_guardian(nspawn.MODULE)
    try:
        _guardian.tell(w, tmp_path / f"{nspawn.LABEL_PREFIX}x", "systemd")
    finally:
        os.close(w)
    assert guardian.wait(timeout=30) == 2
