"""A set SANDBOX_CONFORMANCE_CGROUP_ROOT is a promise (README "Environment contracts", STYLE.md 11):
set but unusable, the witness run fails naming the variable and why; unset, the cgroup witnesses are
an honest skip. Issue 28: a set but unusable root used to end PASS with them "not tested"."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from witness_cli import witness

PROMISE_ENV = "SANDBOX_CONFORMANCE_CGROUP_ROOT"


def _v1_path() -> str:
    """A cgroup v1 hierarchy's directory where this host has one, else a cgroup2 file (both unusable)."""
    for p in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/cpu"):
        if os.path.isdir(p) and not os.path.exists(os.path.join(p, "cgroup.controllers")):
            return p
    return "/sys/fs/cgroup/cgroup.procs"


@pytest.mark.parametrize("what", ["missing", "a file", "v1", "relative"])
def test_a_set_but_unusable_cgroup_root_fails_the_run_naming_the_variable(
    bwrap_path: str, tmp_path: Path, what: str
) -> None:
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x\n")
    value = {"missing": "/nonexistent", "a file": str(a_file), "v1": _v1_path(), "relative": "sub/tree"}[what]
    done = witness("--", "-m", "cgroup", env={PROMISE_ENV: value}, timeout=120)
    assert done.returncode == 1, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(("cgroup:", "memory_max:", "pids_max:"))]
    assert lines, done.stdout
    for ln in lines:
        assert "harness error" in ln, ln
    # The reason is said once, below the rows that fell to it (conformance/render.py said_once).
    said = [ln for ln in done.stdout.splitlines() if f"{PROMISE_ENV} is set but unusable" in ln]
    assert said and value in said[0], done.stdout
    assert ": FAIL [" in done.stdout, done.stdout


def test_an_unset_cgroup_root_is_an_honest_skip(bwrap_path: str) -> None:
    done = witness("--", "-m", "cgroup", env={}, timeout=120)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(("cgroup:", "memory_max:", "pids_max:"))]
    assert lines, done.stdout
    # kept where the probe found a delegated root of its own; else skipped with the probe's reason
    skipped = ": not tested: no cgroup leaf for the task: cgroup.delegation:"
    assert all(": kept" in ln or skipped in ln for ln in lines), lines
    assert PROMISE_ENV not in done.stdout
