"""Shared by the end-to-end tests of the witness command: run it as a user would, and read pytest's
own JUnit result (an oracle independent of the witness command's own reporting)."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def witness(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`sandbox-conformance witness ARGS` in a subprocess, with only PATH (plus env) inherited."""
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env or {})}
    if "XDG_STATE_HOME" in os.environ:  # the session's (tests/conftest.py), for the logs red runs keep
        full.setdefault("XDG_STATE_HOME", os.environ["XDG_STATE_HOME"])
    return subprocess.run(
        [sys.executable, "-m", "sandbox_conformance", "witness", *args],
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=timeout,
        env=full,
    )


def junit(path: Path) -> dict[str, str]:
    """test name -> passed / failure / error / skipped."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        out[case.get("name", "")] = kinds[0] if kinds else "passed"
    return out
