"""probes/owner.rmtree, the sweep's remover: it may restore write permission on a directory inside the
tree it removes, never on the tree's own parent (/tmp). Two runs removing the same dead directory at
once (a witness run's sweep and an adapter's guardian, measured under the matrix's two parallel
witness runs) made the top's rmdir fail, and the retry chmod'ed /tmp to 0755."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from sandbox_conformance.processes import owner


def test_a_failure_on_the_top_itself_leaves_its_parent_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = tmp_path / "tmp"
    parent.mkdir()
    parent.chmod(0o1777)
    top = parent / "sbxc-y"
    (top / "a").mkdir(parents=True)
    real_rmdir = os.rmdir

    def racing_rmdir(path: str | os.PathLike[str], *a: object, **k: object) -> None:
        if os.path.abspath(path) == str(top):
            # Another remover got there first: the top is gone when we come to it.
            real_rmdir(path)
            raise FileNotFoundError(2, "No such file or directory", str(top))
        real_rmdir(path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "rmdir", racing_rmdir)
    owner.rmtree(str(top))
    assert stat.S_IMODE(parent.stat().st_mode) == 0o1777
    assert not top.exists()


def test_a_recorded_command_that_hangs_is_killed_with_what_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """owner.before_removal: each recorded command has its timeout, and on it the command's whole group
    goes (an engine's helper it forked included), so a sweep never waits for ever or leaves one behind."""
    monkeypatch.setattr(owner, "BEFORE_REMOVAL_TIMEOUT", 0.5)
    pidfile = tmp_path / "helper.pid"
    hanging = ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"]
    owner.ask_before_removal(tmp_path, [hanging])
    owner.before_removal(str(tmp_path))
    helper = int(pidfile.read_text())

    def alive() -> bool:
        try:
            return ") Z " not in Path(f"/proc/{helper}/stat").read_text()  # a zombie is dead
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 5
    while alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(), "the recorded command's helper outlived its timeout"
