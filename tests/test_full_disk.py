"""A full disk under --layout-root or TMPDIR is a host condition said in one line (issue 28): exit 2
before any work when it is full already; a harness error naming ENOSPC and the path when it fills
during the run. Never a traceback, and never `controls`' 75, "did not run".

The full filesystem is a small tmpfs in a mount namespace of the test's own (unshare -m), so the
host's own mounts are never touched; it goes with that namespace."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_conformance.commands import cli

REPO = Path(__file__).resolve().parent.parent
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FULL = """
set -eu
mount --make-rprivate /
mount -t tmpfs -o size=8k tmpfs "$FULL"
shift 0
set +e
"$@"
"""

COMMANDS = {
    "witness": (["witness"], "TMPDIR"),
    "witness --layout-root": (["witness", "--layout-root", "{full}"], "--layout-root"),
    "run": (["run", "--mode", "native"], "TMPDIR"),
    "controls": (["controls", "--only", "mask_dropped"], "TMPDIR"),
}


@pytest.mark.parametrize("case", list(COMMANDS))
def test_a_full_disk_where_the_run_writes_is_one_line_and_exit_2_before_any_work(case: str,
                                                                                   tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1): a tmpfs of our own in a private mount namespace")
    full = tmp_path / "full"
    full.mkdir()
    words, named = COMMANDS[case]
    argv = [sys.executable, "-m", "sandbox_conformance", *(w.format(full=full) for w in words)]
    env = {"PATH": BASE_PATH, "LANG": "C.UTF-8", "HOME": str(tmp_path), "FULL": str(full),
           "TMPDIR": str(full) if named == "TMPDIR" else str(tmp_path)}
    done = subprocess.run(["unshare", "-m", "sh", "-c", FULL, "sh", *argv], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=120)
    said = [ln for ln in done.stderr.splitlines() if not ln.startswith("sandbox-conformance: ERROR mode=")]
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert len(said) == 1, done.stderr
    assert f"{named} {full}: no space left on its filesystem" in said[0], said
    assert "Traceback" not in done.stderr and "did not run" not in done.stderr
    assert not os.listdir(full)  # a mount of the namespace's own: the directory here stayed empty


def test_a_disk_that_fills_during_the_run_is_a_harness_error_naming_enospc_and_the_path(
        monkeypatch, capsys) -> None:
    from sandbox_conformance.conformance import layout

    def full(*_a: object, **_kw: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/tmp/sbxc-witness-x/.env")

    monkeypatch.setattr(layout, "create", full)
    code = cli.main(["witness", "--launcher", "true"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert ("sandbox-conformance witness: harness error: No space left on device (ENOSPC): "
            "/tmp/sbxc-witness-x/.env") in err
    assert "Traceback" not in err
