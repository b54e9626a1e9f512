"""`sandbox-conformance probe`: the findings as a table a person reads at a glance, or one stable JSON
document.

The table: PROBE, VERDICT, CAUSE (the ladder's cause id, `-` where there is none) and the reason, one
line a finding when piped; on a terminal the reason wraps under its own column and the verdict is in
colour (not with NO_COLOR). Under what is not a pass, `way on:` and the one thing to do, the same
words `run` names when it refuses for that cause. A last line counts the verdicts.

JSON schema 1: {"schema": 1, "context": {...}, "findings": [{"probe", "verdict", "reason",
"evidence": {str: str}, "facts": {...}}]}. Exit 0 when the probes ran, whatever they found; with
--require, 1 naming each required probe that is not `supported`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import Any

from sandbox_conformance.probes.collect import PROBE_IDS, collect
from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes.children import Background
from sandbox_conformance.processes.exits import EXIT_FAIL, EXIT_OK, UsageError, check_as_user

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
    uname = os.uname()  # what platform.release()/machine() return, without importing platform
    bw = by.get("bwrap")
    return {
        "euid": host.euid,
        "user": host.user,
        "as_user": as_user or host.as_user,
        "kernel": uname.release,
        "arch": uname.machine,
        "python": sys.version.split()[0],  # what platform.python_version() parses out of it
        # Without the bwrap probe (--only deployment), still say which bwrap PATH finds.
        "bwrap": (bw.facts.get("path") if bw else host.which("bwrap")),
        "bwrap_version": (bw.facts.get("version") if bw else None),
    }


# ---------------------------------------------------------------- the table a person reads

# SGR colours for the verdict (ECMA-48): only on a terminal, never with NO_COLOR (no-color.org) or
# TERM=dumb. Alignment is computed on the plain text, so colour never shifts a column.
_COLOUR = {Verdict.supported: "32", Verdict.denied: "31", Verdict.unsupported: "33", Verdict.unknown: "35"}
_WAY = "way on: "


def way_on(f: Finding, by: Mapping[str, Finding]) -> str | None:
    """The one-line way on for a finding that is not a pass: the one `run` would name for its cause
    (runners/decide.py, so the probe and a refusal never disagree); None where the reason is all."""
    if f.verdict in (Verdict.supported, Verdict.detected, Verdict.not_detected):
        return None
    from sandbox_conformance.runners import decide  # only a failing finding needs the table of ways on

    probe_id = f.probe.partition("@")[0]
    if probe_id == "bwrap":
        return decide._bwrap_way_on(f)
    cause = f.facts.get("cause")
    if cause == "no_bwrap" and (bw := by.get("bwrap")) is not None and bw.verdict is not Verdict.supported:
        return None  # the bwrap row says what to do about bwrap itself
    return decide.CAUSE_WAY_ON.get(str(cause)) if cause else None


def _summary(findings: list[Finding]) -> str:
    counts: dict[str, int] = {}
    for f in findings:
        counts[str(f.verdict)] = counts.get(str(f.verdict), 0) + 1
    parts = [f"{counts[v]} {v}" for v in Verdict if v in counts]
    return f"{len(findings)} probes: {', '.join(parts)}"


def _wrap(text: str, width: int | None) -> list[str]:
    """Split at spaces to fit `width` (None: one line, as a pipe wants it for grep)."""
    if width is None or len(text) <= width:
        return [text]
    import textwrap

    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [text]


def render_table(findings: list[Finding], *, width: int | None = None, colour: bool = False) -> str:
    """PROBE, VERDICT, CAUSE, then the reason; a `way on:` line under the reason of what is not a pass.
    `width`: the terminal's, to wrap the reason under its own column; None keeps one line a finding."""
    by = {f.probe: f for f in findings}
    causes = {f.probe: str(f.facts.get("cause") or "") for f in findings}
    pw = max([len("PROBE"), *(len(f.probe) for f in findings)])
    vw = max(len(v) for v in Verdict)
    # The CAUSE column only where some finding has a cause: a healthy host's table stays narrow.
    cw = max([len("CAUSE"), *(len(c) for c in causes.values())]) if any(causes.values()) else 0
    indent = pw + vw + 4 + (cw + 2 if cw else 0)
    room = None if width is None else max(width - indent, 30)
    head = f"{'PROBE':<{pw}}  {'VERDICT':<{vw}}  " + (f"{'CAUSE':<{cw}}  " if cw else "")
    lines = [head + "REASON"]
    for f in findings:
        verdict = f"{f.verdict!s:<{vw}}"
        if colour and f.verdict in _COLOUR:
            verdict = f"\033[{_COLOUR[f.verdict]}m{f.verdict}\033[0m" + " " * (vw - len(f.verdict))
        reason = _wrap(f.reason, room)
        cause = f"{causes[f.probe] or '-':<{cw}}  " if cw else ""
        lines.append(f"{f.probe:<{pw}}  {verdict}  {cause}{reason[0]}")
        lines += [" " * indent + more for more in reason[1:]]
        way = way_on(f, by)
        if way:
            lines += [" " * indent + (_WAY if i == 0 else " " * len(_WAY)) + part
                      for i, part in enumerate(_wrap(way, None if room is None else room - len(_WAY)))]
    lines.append(_summary(findings))
    return "\n".join(lines)


def _terminal() -> tuple[int | None, bool]:
    """(wrap width, colour) for stdout: a terminal wraps and colours; a pipe or file gets neither."""
    if not sys.stdout.isatty():
        return None, False
    import shutil

    colour = "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"
    return shutil.get_terminal_size().columns, colour


def _collect_as_user(only: list[str] | None, as_user: str) -> Background[list[Finding]] | None:
    ladder = ("userns", "userns.map", "netns", "pidns.proc", "disable_userns")
    wanted = [i for i in ladder if only is None or i in only]
    return Background(collect, Host(as_user=as_user), wanted) if wanted else None


# Probes that answer "am I in X?" (detected / not_detected), never `supported`: required, they could
# only ever fail (docs/findings.md).
NOT_REQUIRABLE = ("platform", "sandboxed", "deployment")


def main(args: argparse.Namespace) -> int:
    required = _ids(args.require, "--require")
    if asks := [i for i in required if i in NOT_REQUIRABLE]:
        raise UsageError(f"--require: {', '.join(asks)} answer detected or not_detected, never supported; "
                         "read them from --json instead")
    only = _ids(args.only, "--only") or None
    if only is not None:
        only = sorted(set(only) | set(required))
    check_as_user(args.as_user, how="it switches user with setpriv", group_by_name=False)
    # Their ladder and ours are independent: both at once.
    theirs_task = _collect_as_user(only, args.as_user) if args.as_user else None
    findings = collect(Host(), only)
    if theirs_task is not None:
        findings += [Finding(f"{f.probe}@{args.as_user}", f.verdict, f.reason, f.evidence, f.facts)
                     for f in theirs_task.result()]
    host = Host()
    if args.json:
        import json

        doc = {"schema": SCHEMA, "context": context(host, findings, args.as_user),
               "findings": [f.to_json() for f in findings]}
        print(json.dumps(doc, indent=2, sort_keys=False))
    else:
        width, colour = _terminal()
        print(render_table(findings, width=width, colour=colour))
    by = {f.probe: f for f in findings}
    missing = [i for i in required if by.get(i) is None or by[i].verdict is not Verdict.supported]
    for i in missing:
        f = by.get(i)
        state = f"{f.verdict}: {f.reason}" if f else "did not report"
        print(f"sandbox-conformance probe: required {i} is not supported ({state})", file=sys.stderr)
    # The process is about to exit: the interpreter's shutdown collections would walk every object the
    # imports and probes made (~30 ms of a ~200 ms probe, measured); frozen, they skip them (gc.freeze
    # moves them to the permanent generation, which no collection visits).
    import gc

    gc.freeze()
    return EXIT_FAIL if missing else EXIT_OK
