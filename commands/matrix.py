"""`sandbox-conformance matrix`: one witness set through every sandbox this host can run, one table.

A column is a sandbox (the reference sandbox, the reference sandbox with another bubblewrap, each
adapter) as root or as one `--as-user`; a row is a promise. Each column is one
`sandbox-conformance witness --json` child (never re-implemented here), with that sandbox's shipped
profile (or the one `--profile`), at most two at a time, each with a timeout. A cell is:
  kept          every witness of the promise passed (", partly" where the host could not observe the
                task and only its own view was judged: a user-space kernel)
  BROKEN        a witness saw it broken
  not tested    its witnesses skipped, or a harness error (the detail says which)
  not claimed   this column's profile does not make that promise (with the profile's reason where it
                gives one, [promises] not_claimed)
  did not run   the sandbox cannot run here or as that user: the adapter's or the launcher's reason

Evidence: the details section (every cell that is not `kept`, with what the witness said) and, with
`--reports DIR`, each column's witness JSON and JUnit files.

Exit 0: no sandbox broke what its profile claims; 1: one did, or a column's witness run failed
without a verdict (a harness error, a timeout); 2: bad input; 75: no column could run."""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from sandbox_conformance.processes import inputs, outputs
from sandbox_conformance.processes.children import run
from sandbox_conformance.processes.exits import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    UsageError,
    check_as_user,
    check_seconds,
)

REFERENCE = "reference"
KEPT, BROKEN, NOT_TESTED = "kept", "BROKEN", "not tested"
NOT_CLAIMED, DID_NOT_RUN = "not claimed", "did not run"
UNSAID = "the profile does not make this promise"
CELLS = (KEPT, BROKEN, NOT_TESTED, NOT_CLAIMED, DID_NOT_RUN)
TASK_VIEW = "kept, task's view"  # judged on what the task showed alone: the host could not observe it
FORMATS = ("text", "markdown", "json")
REQUIRE_ENV = "SANDBOX_CONFORMANCE_REQUIRE"
MAX_JOBS = 2  # the witness runs are launches of real sandboxes: two at a time on a 2-core machine


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sandboxes",
        metavar="NAME,...",
        help="only these columns' sandboxes (default: all; `reference`, `bwrap-0.12` and the adapters)",
    )
    p.add_argument(
        "--profile", metavar="FILE", help="one profile for every column (default: each its own)"
    )
    p.add_argument(
        "--as-user",
        action="append",
        default=[],
        metavar="NAME",
        help="(root only) also run every sandbox as this user: a column each; repeatable",
    )
    p.add_argument("--format", choices=FORMATS, default="text", help="what goes to stdout (default text)")
    p.add_argument("--json", metavar="FILE", help="write the matrix as JSON here ('-' for stdout instead)")
    p.add_argument("--markdown", metavar="FILE", help="write the matrix as markdown here (docs/matrix.md)")
    p.add_argument("--junitxml", metavar="FILE", help="write JUnit XML here: a suite per column")
    p.add_argument("--reports", metavar="DIR", help="keep each column's witness JSON and JUnit in DIR")
    p.add_argument(
        "--jobs", type=int, default=MAX_JOBS, metavar="N", help=f"witness runs at a time (1 or {MAX_JOBS})"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="per column's witness run (default 600)",
    )
    p.add_argument(
        "--require",
        action="store_true",
        help="pass --require to every witness run (a column's skip is then a failure); "
        f"${REQUIRE_ENV} is not passed on otherwise",
    )


# ---- columns -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Column:
    sandbox: str
    user: str | None  # None: the caller (root, or whoever ran matrix)
    args: tuple[str, ...] = ()  # witness's arguments for this sandbox (profile, launcher...)
    path_first: str | None = None  # a directory put first on the witness run's PATH (a bwrap version)
    unavailable: str | None = None  # why it cannot run here: no witness run at all
    profile: str | None = None  # the profile file, None for the embedded reference profile
    version: str = "?"

    @property
    def id(self) -> str:
        return self.sandbox if self.user is None else f"{self.sandbox}@{self.user}"

    @property
    def label(self) -> str:
        return self.sandbox if self.user is None else f"{self.sandbox} ({self.user})"

    def reports(self, where: Path) -> tuple[Path, Path]:
        """Its witness run's JSON and JUnit files in `where` (--reports, or a temporary directory):
        SANDBOX.json, SANDBOX-as-USER.json; named here alone, so --reports is checked for the names the
        runs write."""
        stem = self.id.replace("@", "-as-")
        return where / f"{stem}.json", where / f"{stem}.xml"


def sandbox_names() -> list[str]:
    from sandbox_conformance.conformance.adapters import ADAPTERS, bwrap_versions

    return [REFERENCE, *bwrap_versions.VERSIONS, *ADAPTERS]


def _first_line(argv: Sequence[str]) -> str:
    if shutil.which(argv[0]) is None:
        return "not installed"
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0].strip() if lines else "?"


# sandbox -> the command whose first line names its version
VERSION_ARGV: Mapping[str, tuple[str, ...]] = {
    REFERENCE: ("bwrap", "--version"),
    "unshare": ("unshare", "--version"),
    "runc": ("runc", "--version"),
    "crun": ("crun", "--version"),
    "runsc": ("runsc", "--version"),
    "systemd-run": ("systemd-run", "--version"),
    "docker": ("docker", "--version"),
    "podman": ("podman", "--version"),
    "firejail": ("firejail", "--version"),
    "nspawn": ("systemd-nspawn", "--version"),
}


def tool_version(sandbox: str) -> str:
    from sandbox_conformance.conformance.adapters import bwrap_versions

    if sandbox in bwrap_versions.VERSIONS:
        v = bwrap_versions.version(bwrap_versions.VERSIONS[sandbox] / "bwrap")
        return f"bubblewrap {v}" if v else "not unpacked"
    if sandbox in VERSION_ARGV:
        return _first_line(VERSION_ARGV[sandbox])
    import importlib

    with contextlib.suppress(ImportError):
        mod = importlib.import_module(f"sandbox_conformance.conformance.adapters.{sandbox.replace('-', '_')}")
        if hasattr(mod, "VERSION"):
            return f"{sandbox} {mod.VERSION} (pinned)"
    return "?"


def columns(sandboxes: Sequence[str], users: Sequence[str | None], profile: str | None) -> list[Column]:
    from sandbox_conformance.conformance import adapters
    from sandbox_conformance.conformance.adapters import bwrap_versions

    out = []
    for name in sandboxes:
        version = tool_version(name)
        for user in users:
            base = Column(name, user, profile=profile, version=version)
            if name == REFERENCE:
                out.append(dataclasses.replace(base, args=("--profile", profile) if profile else ()))
            elif name in bwrap_versions.VERSIONS:
                why = bwrap_versions.unavailable(name)
                out.append(dataclasses.replace(
                    base,
                    args=("--profile", profile) if profile else (),
                    path_first=str(bwrap_versions.VERSIONS[name]),
                    unavailable=why,
                ))
            else:
                try:
                    r = adapters.resolve(name, as_user=user)
                except adapters.Unavailable as e:
                    own = str(adapters.profile_path(adapters.ADAPTERS[name].profile))
                    out.append(dataclasses.replace(base, unavailable=str(e), profile=profile or own))
                    continue
                args = r.witness_args()
                if profile:
                    args[args.index("--profile") + 1] = profile
                out.append(dataclasses.replace(base, args=tuple(args), profile=profile or str(r.profile)))
    return out


# ---- running a column ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Outcome:
    exit: int | None  # the witness run's exit; None: not run
    report: Mapping[str, Any] | None  # its JSON report
    reason: str = ""  # did not run / failed without a report: why
    seconds: float = 0.0


def witness_argv(col: Column, json_out: Path, junit_out: Path, *, require: bool) -> list[str]:
    return [
        sys.executable, "-m", "sandbox_conformance", "witness", *col.args,
        *(["--as-user", col.user] if col.user else []),
        "--json", str(json_out),
        "--junitxml", str(junit_out),
        "--format", "lines",
        *(["--require"] if require else []),
    ]


def run_column(col: Column, reports: Path, *, timeout: float, require: bool) -> Outcome:
    if col.unavailable:
        return Outcome(None, None, col.unavailable)
    json_out, junit_out = col.reports(reports)
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_ENV}
    if col.path_first:
        env["PATH"] = os.pathsep.join([col.path_first, env.get("PATH", "/usr/bin:/bin")])
    started = time.monotonic()
    # SIGTERM as the parent-death signal: a witness run stops its launches in order (docs/cancellation.md).
    done = run(witness_argv(col, json_out, junit_out, require=require), timeout=timeout, env=env,
               die_with=signal.SIGTERM)
    seconds = time.monotonic() - started
    report = None
    if json_out.exists():
        with contextlib.suppress(ValueError):
            report = json.loads(json_out.read_text())
    tail = " ".join(done.stderr.strip().splitlines()[-3:])
    if done.timed_out:
        return Outcome(done.returncode, report, f"the witness run timed out after {timeout:.0f}s", seconds)
    if done.returncode == EXIT_UNAVAILABLE:
        # "witness: refused: launcher '...': did not run: WHY": the launcher's own reason is the cell's.
        why = tail.rsplit("did not run: ", 1)[-1] if "did not run: " in tail else tail
        return Outcome(EXIT_UNAVAILABLE, None, why or "the witness run exited 75", seconds)
    if report is None:
        return Outcome(done.returncode, None, f"exit {done.returncode}, no report: {tail}", seconds)
    return Outcome(done.returncode, report, "", seconds)


# ---- the table: pure ----------------------------------------------------------------------------


def not_claimed_reasons(profile: str | None) -> Mapping[str, str]:
    from sandbox_conformance.conformance import profile as profile_mod

    try:
        return dict(profile_mod.load(profile).not_claimed)
    except Exception:  # a profile witness itself would refuse: its column says so, not this table
        return {}


def cell(promise: str, outcome: Outcome, reasons: Mapping[str, str]) -> tuple[str, str]:
    """(verdict, detail) of one promise in one column."""
    if outcome.report is None:
        return (DID_NOT_RUN, outcome.reason) if outcome.exit in (None, EXIT_UNAVAILABLE) else (
            NOT_TESTED, f"the witness run failed: {outcome.reason}")
    for p in outcome.report.get("promises", []):
        if p.get("promise") == promise:
            verdict, detail = str(p.get("verdict")), str(p.get("detail") or "")
            if verdict == KEPT and detail.startswith("partly"):
                return "kept, partly", detail
            # conformance/verdicts.py TASK_VIEW_ONLY: the host could not observe the task
            if verdict == KEPT and detail.startswith("task's view only"):
                return TASK_VIEW, detail
            return (verdict if verdict in CELLS else NOT_TESTED), detail
    return NOT_CLAIMED, reasons.get(promise, UNSAID)


def rows_of(outcomes: Sequence[Outcome]) -> list[str]:
    """Every promise any column reported, in the order they first appear (the reference's first)."""
    seen: dict[str, None] = {}
    for o in outcomes:
        for p in (o.report or {}).get("promises", []):
            seen.setdefault(str(p["promise"]), None)
    return list(seen)


def exit_code(outcomes: Sequence[Outcome]) -> int:
    ran = [o for o in outcomes if o.report is not None or o.exit not in (None, EXIT_UNAVAILABLE)]
    if not ran:
        return EXIT_UNAVAILABLE
    return EXIT_FAIL if any(o.exit not in (EXIT_OK, EXIT_UNAVAILABLE, None) for o in ran) else EXIT_OK


def kept_reports(col: Column, outcome: Outcome, reports: Path | None) -> dict[str, str | None]:
    """A column's "report" and "junit": its witness run's files, where --reports keeps them and the run
    made them."""
    if reports is None or outcome.report is None:
        return {"report": None, "junit": None}
    json_out, junit_out = col.reports(reports)
    return {"report": str(json_out), "junit": str(junit_out)}


def document(cols: Sequence[Column], outcomes: Sequence[Outcome], reports: Path | None) -> dict[str, Any]:
    rows = rows_of(outcomes)
    reasons = [not_claimed_reasons(c.profile) for c in cols]
    return {
        "version": 1,
        "host": host_facts(),
        "exit": exit_code(outcomes),
        "columns": [
            {
                "id": c.id, "sandbox": c.sandbox, "user": c.user, "version": c.version,
                "profile": (o.report or {}).get("profile")
                or (Path(c.profile).stem if c.profile else REFERENCE),
                "exit": o.exit, "reason": o.reason, "seconds": round(o.seconds, 1),
                "summary": (o.report or {}).get("summary"),
                **kept_reports(c, o, reports),
            }
            for c, o in zip(cols, outcomes, strict=True)
        ],
        "rows": [
            {
                "promise": r,
                "cells": {
                    c.id: dict(zip(("verdict", "detail"), cell(r, o, why), strict=True))
                    for c, o, why in zip(cols, outcomes, reasons, strict=True)
                },
            }
            for r in rows
        ],
    }


def host_facts() -> dict[str, str]:
    pretty = "?"
    with contextlib.suppress(OSError):
        for ln in Path("/etc/os-release").read_text().splitlines():
            if ln.startswith("PRETTY_NAME="):
                pretty = ln.split("=", 1)[1].strip('"')
    return {"os": pretty, "kernel": platform.release(), "arch": platform.machine()}


def _short(verdict: str) -> str:
    return {TASK_VIEW: "kept*", "kept, partly": "kept~"}.get(verdict, verdict)


def label(c: Mapping[str, Any]) -> str:
    return str(c["sandbox"]) if c["user"] is None else f"{c['sandbox']} ({c['user']})"


def table(doc: Mapping[str, Any]) -> list[list[str]]:
    """Header row, then a row per promise: the same cells in every format."""
    cols = doc["columns"]
    out = [["promise", *(label(c) for c in cols)]]
    for row in doc["rows"]:
        out.append([row["promise"], *(_short(row["cells"][c["id"]]["verdict"]) for c in cols)])
    return out


def details(doc: Mapping[str, Any]) -> Iterator[tuple[str, str, str, str]]:
    """(column label, promise, verdict, detail) of every cell that is not plainly kept, but a promise
    the profile simply does not make (its file says why)."""
    for c in doc["columns"]:
        if c["exit"] in (None, EXIT_UNAVAILABLE) and c["summary"] is None:
            yield label(c), "(every promise)", DID_NOT_RUN, c["reason"]
            continue
        for row in doc["rows"]:
            v = row["cells"][c["id"]]
            if v["verdict"] != KEPT and (v["verdict"], v["detail"]) != (NOT_CLAIMED, UNSAID):
                yield label(c), row["promise"], v["verdict"], v["detail"]


def render_text(doc: Mapping[str, Any]) -> str:
    t = table(doc)
    widths = [max(len(r[i]) for r in t) for i in range(len(t[0]))]
    lines = ["  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)).rstrip() for r in t]
    lines += ["", "kept* = kept, judged from the task's own view alone (the host cannot observe it); "
              "kept~ = kept, partly (some of its witnesses could not be judged)", ""]
    lines += [f"{col}: {promise}: {verdict}: {detail}" for col, promise, verdict, detail in details(doc)]
    lines += ["", summary_line(doc)]
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(doc: Mapping[str, Any], *, command: str = "") -> str:
    h = doc["host"]
    out = ["# The sandbox matrix", ""]
    if command:
        out += [f"Generated by `{command}` (tests/test_matrix.py checks it is not stale).", ""]
    out += [
        f"Host: {h['os']}, Linux {h['kernel']}, {h['arch']}. A column per sandbox and user; its profile is "
        "the adapter's shipped one (`conformance/adapters/NAME.toml`), the reference sandbox's the embedded "
        "`reference.toml`. `kept*`: kept, judged from the task's own view alone (the host cannot observe "
        "the task); `kept~`: kept, partly (some of its witnesses could not be judged). Every cell that is "
        "not `kept` is explained under Details.",
        "",
        "| column | version | profile | result |",
        "|---|---|---|---|",
    ]
    for c in doc["columns"]:
        s = c["summary"]
        result = (
            f"{s['kept']} kept, {s['broken']} BROKEN, {s['not_tested']} not tested (exit {c['exit']})"
            if s else f"{DID_NOT_RUN}"
        )
        out.append(f"| {_md(label(c))} | {_md(c['version'])} | {_md(c['profile'])} | {result} |")
    out += ["", "<!-- matrix:table -->"]
    t = table(doc)
    out.append("| " + " | ".join(_md(x) for x in t[0]) + " |")
    out.append("|" + "---|" * len(t[0]))
    out += ["| " + " | ".join(_md(x) for x in r) + " |" for r in t[1:]]
    out += ["<!-- /matrix:table -->", "", "## Details", ""]
    out += [f"- **{_md(col)}**, `{_md(promise)}`: {verdict}: {_md(detail)}"
            for col, promise, verdict, detail in details(doc)]
    out += ["", summary_line(doc)]
    return "\n".join(out) + "\n"


def summary_line(doc: Mapping[str, Any]) -> str:
    cols = doc["columns"]
    ran = [c for c in cols if c["summary"] is not None]
    broke = [c["id"] for c in ran if c["summary"]["broken"]]
    failed = [c["id"] for c in cols if c["exit"] not in (0, 75, None)]
    verdict = {EXIT_OK: "PASS", EXIT_FAIL: "FAIL", EXIT_UNAVAILABLE: "DID NOT RUN"}[doc["exit"]]
    return (
        f"matrix: {len(ran)} of {len(cols)} columns ran, {len(doc['rows'])} promises; "
        f"BROKEN in {broke or 'none'}; failed runs {failed or 'none'}: {verdict}"
    )


def junit(doc: Mapping[str, Any]) -> bytes:
    suites = ET.Element("testsuites", name="sandbox-conformance matrix")
    for c in doc["columns"]:
        suite = ET.SubElement(suites, "testsuite", name=c["id"])
        counts = {"tests": 0, "failures": 0, "skipped": 0}
        for row in doc["rows"]:
            v = row["cells"][c["id"]]
            case = ET.SubElement(suite, "testcase", classname=f"matrix.{c['id']}", name=row["promise"])
            counts["tests"] += 1
            if v["verdict"] == BROKEN:
                ET.SubElement(case, "failure", message=v["detail"][:500]).text = v["detail"]
                counts["failures"] += 1
            elif not v["verdict"].startswith(KEPT):
                ET.SubElement(case, "skipped", message=f"{v['verdict']}: {v['detail']}"[:500])
                counts["skipped"] += 1
        for k, n in counts.items():
            suite.set(k, str(n))
    return bytes(ET.tostring(suites, encoding="utf-8", xml_declaration=True))


# ---- the command --------------------------------------------------------------------------------


def _validate(args: argparse.Namespace) -> tuple[list[str], list[str | None]]:
    """Every usage error before a column runs: exit 2, one line (the same checks as witness and run:
    processes/outputs.py for the files, processes/exits.py for the seconds and the users)."""
    known = sandbox_names()
    chosen = known if not args.sandboxes else [s.strip() for s in args.sandboxes.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in known]
    if unknown or not chosen:
        bad = unknown[0] if unknown else "(none)"
        raise UsageError(f"--sandboxes: no sandbox {bad!r} (known: {', '.join(known)})")
    twice = next((s for i, s in enumerate(chosen) if s in chosen[:i]), None)
    if twice is not None:
        # Two columns of one id: the second's reports replaced the first's, and the table showed one.
        raise UsageError(f"--sandboxes: {twice!r} given twice")
    if args.jobs not in range(1, MAX_JOBS + 1):
        raise UsageError(f"--jobs: expected 1 to {MAX_JOBS}, got {args.jobs}")
    check_seconds("--timeout", args.timeout)  # nan and inf passed `<= 0`, then failed mid-run
    if args.profile:
        _check_profile(args.profile)
    for u in args.as_user:
        check_as_user(u, group_by_name=False)
    users: list[str | None] = [None, *dict.fromkeys(args.as_user)]
    outputs.check_reports([("--json", args.json, True), ("--markdown", args.markdown, False),
                           ("--junitxml", args.junitxml, False)], [("--profile", args.profile)])
    if args.reports:
        _check_reports_dir(args.reports, [Column(s, u) for s in chosen for u in users],
                           [("--json", args.json), ("--markdown", args.markdown),
                            ("--junitxml", args.junitxml), ("--profile", args.profile)])
    return chosen, users


def _check_profile(path: str) -> None:
    """--profile FILE as `run` checks it: read, and a profile every witness run would take."""
    from sandbox_conformance.conformance import settings

    try:
        settings.check_named_files(path, None)
    except settings.InvalidSettings as e:
        raise UsageError(str(e)) from None


def _check_reports_dir(value: str, cols: Sequence[Column], others: Sequence[tuple[str, str | None]]) -> None:
    """--reports DIR: a directory (made if need be) where each column's JSON and JUnit can be written,
    none of which is another option's file."""
    try:
        st = inputs.stat_or_none(value)
    except inputs.UnusableInput as e:
        raise UsageError(f"--reports {inputs.shown(value)}: {e}") from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"--reports {value}: not a directory")
    # Where the first file will be made: DIR, or the nearest directory above it that exists (DIR is
    # made with its parents). Tried, as for every output: /proc and a read-only mount refuse a file.
    where = os.path.realpath(value)
    while not os.path.isdir(where):
        if os.path.lexists(where):
            raise UsageError(f"--reports {value}: {where} is not a directory")
        where = os.path.dirname(where)
    outputs.check_creatable("--reports", value, os.path.join(where, "sbxc-matrix"))
    files = [str(f) for c in cols for f in c.reports(Path(value))]
    for flag, other in others:
        for f in files:
            if other and other != "-" and outputs.same_file(f, other):
                raise UsageError(f"{flag} {other}: is also a column's report in --reports {value}")


def main(args: argparse.Namespace) -> int:
    sandboxes, users = _validate(args)
    profile = str(Path(args.profile).resolve()) if args.profile else None
    cols = columns(sandboxes, users, profile)
    keep = Path(args.reports) if args.reports else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        reports = keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sbxc-matrix-")))
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs,
                                                   thread_name_prefix="sbxc-matrix") as pool:
            outcomes = list(pool.map(
                lambda c: run_column(c, reports, timeout=args.timeout, require=args.require), cols
            ))
        doc = document(cols, outcomes, keep)
    command = "sandbox-conformance matrix " + " ".join(
        [*(f"--as-user {u}" for u in dict.fromkeys(args.as_user)),
         *([f"--sandboxes {args.sandboxes}"] if args.sandboxes else []),
         *([f"--markdown {args.markdown}"] if args.markdown else [])]
    )
    # Whole or not at all, each beside its target (processes/outputs.py): a fixed `.NAME.tmp` was
    # shared by two matrix runs writing the same report.
    if args.json and args.json != "-":
        outputs.write_text(args.json, json.dumps(doc, indent=1) + "\n")
    if args.markdown:
        outputs.write_text(args.markdown, render_markdown(doc, command=command.strip()))
    if args.junitxml:
        with outputs.replacing(args.junitxml) as tmp:
            tmp.write_bytes(junit(doc))
    if args.format == "json" or args.json == "-":
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    elif args.format == "markdown":
        sys.stdout.write(render_markdown(doc, command=command.strip()))
    else:
        sys.stdout.write(render_text(doc))
    return int(doc["exit"])
