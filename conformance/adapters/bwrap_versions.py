"""bubblewrap at more than one version: the reference sandbox (conformance/bwrap_argv.py) run with
another bwrap binary than the host's. The reference launcher takes the first `bwrap` on the witness
run's PATH (conformance/harness.py `facts`), so a version is a directory to put first on PATH.

Trixie's 0.12 is unpacked, never installed, by scripts/test-tier-deps into
/var/cache/sandbox-conformance/bwrap-trixie (its bin/bwrap runs it with trixie's own loader and
libraries: it needs glibc 2.38, bookworm has 2.36)."""

from __future__ import annotations

import os
from pathlib import Path

from sandbox_conformance.processes import children

CACHE = Path(os.environ.get("SANDBOX_CONFORMANCE_CACHE", "/var/cache/sandbox-conformance"))
# label -> the directory holding that version's `bwrap`
VERSIONS = {"bwrap-0.12": CACHE / "bwrap-trixie" / "bin"}
VERSION_TIMEOUT = 10.0


def version(bwrap: Path | str) -> str | None:
    """`bubblewrap 0.12.0` -> "0.12.0"; None when it does not run."""
    # A bwrap that hangs is killed with its group at VERSION_TIMEOUT (processes/children.py): None, as
    # one that does not run.
    words = children.run([str(bwrap), "--version"], timeout=VERSION_TIMEOUT).stdout.split()
    return words[1] if len(words) == 2 and words[0] == "bubblewrap" else None


def unavailable(label: str) -> str | None:
    """Why that version cannot run here, or None."""
    exe = VERSIONS[label] / "bwrap"
    if not exe.exists():
        return f"{exe} not there: scripts/test-tier-deps unpacks trixie's bubblewrap (as root)"
    if version(exe) is None:
        return f"{exe} --version did not answer `bubblewrap VERSION`"
    return None
