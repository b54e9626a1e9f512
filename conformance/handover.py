"""The probe findings `run` hands down to the witness process it starts, so the guard probes are not
run twice for the same user in the same environment. Its own module, importing only probes.finding:
`run` needs it, and none of the witness settings' imports (profiles, launchers, bwrap's argv)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from probes.finding import Finding

# The probes whose findings guard witnesses (conformance/harness.py).
GUARD_PROBES = ("disable_userns", "cgroup.delegation")
# The environment variable carrying them (JSON, see `handover`).
FINDINGS_ENV = "SANDBOX_CONFORMANCE_FINDINGS"

# What a guard finding depends on besides the user: a promised cgroup root changes cgroup.delegation.
_DEPENDS_ON = ("SANDBOX_CONFORMANCE_CGROUP_ROOT",)


def handover(findings: Iterable[Finding], *, as_user: str | None, environ: Mapping[str, str]) -> str:
    """FINDINGS_ENV's value: the findings, for whom, and the environment they were made in."""
    return json.dumps(
        {
            "as_user": as_user,
            "environ": {k: environ.get(k) for k in _DEPENDS_ON},
            "findings": [f.to_json() for f in findings],
        }
    )


def handed_down(as_user: str | None, environ: Mapping[str, str]) -> dict[str, Finding] | None:
    """The findings `run` handed down, if they were made for this user in this environment; None
    otherwise (the session then probes for itself, as a direct `witness` does)."""
    raw = environ.get(FINDINGS_ENV)
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
