"""A layout named by the profile ([layout], issue 27): its root carries the platform's names and no
stamp of ours, so the stamp lives on a label beside it (processes/owner.py make_named_dir), which the
sweep follows to remove what a dead run left, and nothing else."""

from __future__ import annotations

import os
from pathlib import Path

from sandbox_conformance.conformance import layout
from sandbox_conformance.conformance.profile import LayoutNames
from sandbox_conformance.processes import owner
from sandbox_conformance.processes.owner import Stamp


def _dead() -> Stamp:
    me = owner.mine()
    return Stamp(me.pid, me.start - 1, me.host)  # our pid, another start time: gone


def test_a_named_layout_has_the_profiles_names_and_is_labelled_until_removed(tmp_path: Path) -> None:
    names = LayoutNames(root="agentd-", user="maria", other_user="sam", task_prefix="job-")
    lay = layout.create(temp_root=str(tmp_path), names=names)
    try:
        assert lay.root.parent == tmp_path and lay.root.name.startswith("agentd-")
        assert "sbxc" not in lay.root.name and str(owner.mine()) not in lay.root.name
        assert lay.task_id.startswith("job-") and lay.control.parts[-4:-1] == ("maria", "tasks", lay.task_id)
        assert lay.other_user.name == "sam" and any(lay.other_user.rglob("system_prompt.txt"))
        [label] = [p for p in tmp_path.iterdir() if p.name.startswith(owner.LABEL_PREFIX)]
        assert owner.find(label.name) == owner.mine() and os.readlink(label) == lay.root.name
    finally:
        layout.remove(lay)
    assert list(tmp_path.iterdir()) == []


def test_the_sweep_follows_a_dead_runs_label_and_only_to_a_directory_beside_it(tmp_path: Path) -> None:
    dead, me = _dead(), owner.mine()
    for name in ("agentd-dead", "agentd-live"):
        (tmp_path / name / "state").mkdir(parents=True)
        (tmp_path / name / "state" / "f").write_text("x")
    os.symlink("agentd-dead", tmp_path / f"{owner.LABEL_PREFIX}{dead}-agentd-dead")
    os.symlink("agentd-live", tmp_path / f"{owner.LABEL_PREFIX}{me}-agentd-live")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    try:
        # A label that points away from its directory is never followed: only the label goes.
        os.symlink(str(outside), tmp_path / f"{owner.LABEL_PREFIX}{dead}-elsewhere")
        swept = owner.sweep(dirs=[str(tmp_path)])
        assert [s.path for s in swept] == [str(tmp_path / "agentd-dead")] and not swept[0].problem
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == [f"{owner.LABEL_PREFIX}{me}-agentd-live", "agentd-live"]
        assert outside.is_dir()
    finally:
        outside.rmdir()


def test_the_sweep_removes_a_dead_runs_shared_memory_segment_by_its_label(tmp_path: Path) -> None:
    # The ipc witness's segment outlives a SIGKILLed run (ipc_namespaces(7)); its label names the key.
    import ctypes
    import secrets

    libc = ctypes.CDLL(None, use_errno=True)
    key = secrets.randbelow(0x7FFFFFFF) + 1
    shmid = libc.shmget(ctypes.c_int(key), ctypes.c_size_t(4096), ctypes.c_int(0o1000 | 0o2000 | 0o600))
    assert shmid >= 0, os.strerror(ctypes.get_errno())
    try:
        (tmp_path / f"{owner.LABEL_PREFIX}{_dead()}-shm-{key}").touch()
        live = owner.label_shm(key + 1, str(tmp_path))  # ours, alive: never touched
        swept = owner.sweep(dirs=[str(tmp_path)])
        assert [s.path for s in swept] == [f"shared memory key {key}"]
        assert libc.shmget(ctypes.c_int(key), ctypes.c_size_t(0), ctypes.c_int(0)) < 0
        assert [p.name for p in tmp_path.iterdir()] == [os.path.basename(live)]
    finally:
        owner.remove_shm(key)
