"""`sandbox-conformance probe`: the findings as a table or one stable JSON document.

JSON schema 1: {"schema": 1, "context": {...}, "findings": [{"probe", "verdict", "reason",
"evidence": {str: str}, "facts": {...}}]}. Exit 0 when the probes ran, whatever they found; with
--require, 1 naming each required probe that is not `supported`."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import Any

from probes.collect import PROBE_IDS, collect
from probes.finding import Finding, Verdict
from probes.host import Host
from runners.errors import EXIT_FAIL, EXIT_OK, UsageError, check_as_user

SCHEMA = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON document (schema 1)")
    p.add_argument("--require", metavar="IDS", default="",
                   help="comma-separated probe ids that must be `supported`; exit 1 naming each that is not")
    p.add_argument("--only", metavar="IDS", default="", help="run only these probe ids")
    p.add_argument("--as-user", metavar="NAME",
                   help="(root only) run the user-namespace ladder as this user too, through setpriv")


def _ids(text: str, flag: str) -> list[str]:
    ids = [i.strip() for i in text.split(",") if i.strip()]
    bad = [i for i in ids if i not in PROBE_IDS]
    if bad:
        raise UsageError(f"{flag}: unknown probe id(s) {', '.join(bad)}; known: {', '.join(PROBE_IDS)}")
    return ids


def context(host: Host, findings: list[Finding], as_user: str | None = None) -> dict[str, Any]:
    by = {f.probe: f for f in findings}
    bw = by.get("bwrap")
    return {
        "euid": host.euid,
        "user": host.user,
        "as_user": as_user or host.as_user,
        "kernel": platform.release(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        # Without the bwrap probe (--only deployment), still say which bwrap PATH finds.
        "bwrap": (bw.facts.get("path") if bw else host.which("bwrap")),
        "bwrap_version": (bw.facts.get("version") if bw else None),
    }


def render_table(findings: list[Finding]) -> str:
    width = max((len(f.probe) for f in findings), default=5)
    vwidth = max(len(v) for v in Verdict)
    lines = [f"{'VERDICT':<{vwidth}}  {'PROBE':<{width}}  REASON"]
    lines += [f"{f.verdict:<{vwidth}}  {f.probe:<{width}}  {f.reason}" for f in findings]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    required = _ids(args.require, "--require")
    only = _ids(args.only, "--only") or None
    if only is not None:
        only = sorted(set(only) | set(required))
    check_as_user(args.as_user, how="it switches user with setpriv")
    findings = collect(Host(), only)
    if args.as_user:
        ladder = ("userns", "userns.map", "netns", "pidns.proc", "disable_userns")
        wanted = [i for i in ladder if only is None or i in only]
        theirs = collect(Host(as_user=args.as_user), wanted) if wanted else []
        findings += [Finding(f"{f.probe}@{args.as_user}", f.verdict, f.reason, f.evidence, f.facts)
                     for f in theirs]
    host = Host()
    if args.json:
        doc = {"schema": SCHEMA, "context": context(host, findings, args.as_user),
               "findings": [f.to_json() for f in findings]}
        print(json.dumps(doc, indent=2, sort_keys=False))
    else:
        print(render_table(findings))
    by = {f.probe: f for f in findings}
    missing = [i for i in required if by.get(i) is None or by[i].verdict is not Verdict.supported]
    if missing:
        for i in missing:
            f = by.get(i)
            state = f"{f.verdict}: {f.reason}" if f else "did not report"
            print(f"sandbox-conformance probe: required {i} is not supported ({state})", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK
