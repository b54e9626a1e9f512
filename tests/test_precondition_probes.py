"""The precondition probes are asked once, and only for what the launcher reads (issue 30): our reference
launcher reads both (`--disable-userns` where it works, leaves under the delegated root); an external
launcher made its own nesting promise, so its run asks only for the cgroup root, whose trial is not
made to be thrown away."""

from __future__ import annotations

import subprocess
import sys

import pytest
from witness_cli import REPO

from sandbox_conformance.conformance import adapters

pytestmark = pytest.mark.integration


def _header_probes(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "sandbox_conformance", "witness", "-v", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    heads = [line for line in done.stderr.splitlines() if line.startswith("  probe ")]
    return [line.split(":")[0].split()[-1] for line in heads]


def test_the_reference_launcher_asks_both_guard_probes_once(bwrap_path: str) -> None:
    assert _header_probes("--only", "masked") == ["disable_userns", "cgroup.delegation"]


def test_an_external_launcher_asks_only_for_the_cgroup_root(bwrap_path: str) -> None:
    try:
        resolved = adapters.resolve("unshare")
    except adapters.Unavailable as e:
        pytest.skip(f"unshare adapter: {e}")
    assert _header_probes("--profile", str(resolved.profile), "--launcher", resolved.launcher,
                          "--launcher-spec", "--launcher-stdin", "--only", "pid") == ["cgroup.delegation"]
