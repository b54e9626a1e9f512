"""The guardians of the adapters whose engines leave state behind (conformance/adapters/_guardian.py):
they read what to clean from the launcher whatever the path holds, and a clean-up command that hangs
neither stops the rest of the clean-up nor outlives its bound."""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

import pytest

from sandbox_conformance.conformance.adapters import _guardian, oci, podman


@pytest.mark.parametrize(("module", "prefix"),
                         [(oci, oci.WORKSPACE_PREFIX), (podman, podman.WORKSPACE_PREFIX)])
def test_a_workspace_path_with_spaces_reaches_the_guardians_clean_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: object, prefix: str,
) -> None:
    # Before, the guardian split its line on whitespace and gave up (exit 2) on "/tmp/ci build/...":
    # every launcher death (the lifecycle launch SIGKILLs one on every run) then left the container.
    workspace = tmp_path / "ci build" / f"{prefix}x y"
    r, w = os.pipe()
    _guardian.tell(w, workspace, "sbxc-cid")
    os.close(w)
    cleaned: list[tuple[Path, str]] = []
    with os.fdopen(r, "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(stdin))
        if module is oci:
            monkeypatch.setattr(oci, "cleanup", lambda runtime, ws, cid: cleaned.append((ws, cid)))
            assert oci.guardian("crun") == 0
        else:
            monkeypatch.setattr(podman, "cleanup", lambda ws, cid: cleaned.append((ws, cid)))
            assert podman.guardian() == 0
    assert cleaned == [(workspace, "sbxc-cid")]


def test_a_line_that_is_not_ours_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for line in (b"/tmp/elsewhere cid\n", b'["/tmp/not-ours", "cid"]\n', b"[1, 2]\n", b"\n"):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(line)))
        assert _guardian.told(oci.WORKSPACE_PREFIX) is None


def test_a_hanging_clean_up_command_is_killed_with_its_group_and_the_workspace_still_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before, `runc delete --force` past its 20 s raised TimeoutExpired out of cleanup(): the workspace
    # stayed, and in the launcher the guardian's pipe was never closed.
    monkeypatch.setattr(_guardian, "CLEANUP_TIMEOUT", 0.5)
    workspace = tmp_path / f"{oci.WORKSPACE_PREFIX}w"
    (workspace / "state").mkdir(parents=True)
    hang = tmp_path / "runtime"
    pids = tmp_path / "pids"
    hang.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pids}\nexec sleep 300\n")
    hang.chmod(0o755)
    began = time.monotonic()
    oci.cleanup(str(hang), workspace, "cid")
    assert time.monotonic() - began < 10
    assert not workspace.exists()
    child = int(pids.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and "Z" not in Path(f"/proc/{child}/stat").read_text().split()[2]:
        assert time.monotonic() < deadline, "the clean-up command's group outlived its bound"
        time.sleep(0.02)


def test_a_stop_signal_while_the_engine_client_starts_waits_until_it_is_known(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Raised inside Popen (after the fork), the stop left the client running, unknown to the finally
    # that kills it, while cleanup() removed its bundle and state.
    import signal
    import subprocess

    real = subprocess.Popen
    started: list[subprocess.Popen[bytes]] = []

    def popen(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        started.append(real(argv, env=env))
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(10_000))  # bytecodes: the handler runs here, inside the start
        return started[-1]

    guardian = real(["true"])
    r, w = os.pipe()
    cleaned: list[bool] = []
    monkeypatch.setattr(_guardian.subprocess, "Popen", popen)
    try:
        with pytest.raises(SystemExit) as stopped:
            _guardian.run_with_guardian(["sleep", "30"], what="t", guardian=guardian, pipe=w,
                                        cleanup=lambda: cleaned.append(True))
        assert stopped.value.code == 128 + signal.SIGTERM
        assert started[0].poll() is not None  # killed and reaped before the clean-up
        assert cleaned == [True]
    finally:
        monkeypatch.undo()
        os.close(r)
        for p in started:
            p.kill()
            p.wait()
