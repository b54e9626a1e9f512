"""The probe findings `run` hands down to the witness process it starts, so the precondition probes are not
run twice for the same user in the same environment. Its own module, importing only probes.finding:
`run` needs it, and none of the witness settings' imports (profiles, launchers, bwrap's argv).

They travel on a pipe: `run` starts the witness process before it probes (runners/native.py
Standby), and the process waits (`witness --standby-fd N`) for GO and the findings, or for the end
of the pipe with nothing said: the run went another way, and it exits having made nothing."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping

from sandbox_conformance.probes.finding import Finding

# The probes whose findings witnesses need (conformance/preconditions.py).
PRECONDITION_PROBES = ("disable_userns", "cgroup.delegation")
# The hidden witness option naming the pipe, and the word that starts a standby witness run.
STANDBY_FLAG = "--standby-fd"
GO = b"go\n"

# What a precondition finding depends on besides the user: a promised cgroup root changes cgroup.delegation.
_DEPENDS_ON = ("SANDBOX_CONFORMANCE_CGROUP_ROOT",)


def handover(findings: Iterable[Finding], *, as_user: str | None, environ: Mapping[str, str]) -> str:
    """The record said after GO: the findings, for whom, and the environment they were made in."""
    return json.dumps(
        {
            "as_user": as_user,
            "environ": {k: environ.get(k) for k in _DEPENDS_ON},
            "findings": [f.to_json() for f in findings],
        }
    )


def handed_down(raw: str | None, as_user: str | None,
                environ: Mapping[str, str]) -> dict[str, Finding] | None:
    """The findings in `run`'s record, if they were made for this user in this environment; None
    otherwise (the session then probes for itself, as a direct `witness` does)."""
    if not raw:
        return None
    try:
        doc = json.loads(raw)
        if doc.get("as_user") != as_user:
            return None
        if any(doc.get("environ", {}).get(k) != environ.get(k) for k in _DEPENDS_ON):
            return None  # the process's environment changed since: re-probe
        return {f.probe: f for f in map(Finding.from_json, doc["findings"])}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # a malformed handover is no evidence: probe again


def await_go(fd: int) -> str | None:
    """Block until `run` says: the findings' record (`handover`'s, "" for none) after GO, or
    None when the pipe ended without it. The read to EOF is one `run` ends by closing its end."""
    with os.fdopen(fd, "rb", closefd=True) as pipe:
        said = pipe.read()  # to EOF
    return said[len(GO):].decode() if said.startswith(GO) else None
