"""`sandbox-conformance fleet-report DIR`: many hosts' reports as one table.

DIR holds one directory per host, as the Ansible collection (fleet/) fetches them:
- `HOST/host.json`: written by the controller, `{"state": "reached" | "unreachable" | "failed", "reason",
  "task"}` ("failed": a step before or around the run stopped the host, e.g. the install);
- `HOST/probe.json`: `sandbox-conformance probe --json` (schema 1);
- `HOST/run.json`: the witness module's outcome (`status`, `exit_code`, `verdict_line`, `mode`, `reason`);
- `HOST/witness.json`, or `HOST/witness-LEG.json` per leg (container and VM modes): `run --json`.
A directory gathered by hand needs only the probe and witness reports. Every file is read
defensively (the reports gain keys): a host whose files are missing or unreadable is shown as such
and never hides the others.

Exit 0 when no host broke a promise; 1 when one did (its run exited 1: a promise BROKEN or a harness
error), or with --require when any host did not pass (refused, unreachable, stopped, no report);
2 for a DIR that is not a directory of host directories, with one line.

Stdlib only, and importing nothing of the project's but processes.exits, inputs and outputs: the
collection's playbook runs it on the controller as `python3 -m sandbox_conformance fleet-report` from a bare
checkout."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import stat
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sandbox_conformance.processes import inputs, outputs
from sandbox_conformance.processes.exits import EXIT_FAIL, EXIT_OK, UsageError

# A probe verdict in one matrix cell (probes/finding.py's Verdict values).
CODES: dict[str, str] = {
    "supported": "yes",
    "unsupported": "no",
    "denied": "DENIED",
    "unknown": "?",
    "detected": "det",
    "not_detected": "-",
}
LEGEND = "yes supported, no unsupported, DENIED denied, ? unknown, det detected, - not detected, . not probed"
# Verdicts worth a cause line: everything but the two that need no explanation.
QUIET_VERDICTS = frozenset({"supported", "not_detected"})
# A promise's verdict in one cell (conformance/verdicts.py promise_lines: kept, BROKEN, not tested).
PROMISE_CODES = {"kept": "kept", "BROKEN": "BROKEN", "not tested": "-"}
PROMISE_LEGEND = "kept, BROKEN, - not tested, . not in this host's profile"
# FleetHost statuses, in the order the summary line counts them.
STATUSES = ("passed", "failed", "refused", "error", "stopped", "unreachable", "no report")
RUN_STATUS = {0: "passed", 1: "failed", 75: "refused", 2: "error"}
REPORT_FILES = ("host.json", "probe.json", "run.json")


@dataclasses.dataclass(frozen=True)
class ProbeCell:
    verdict: str
    cause: str
    reason: str


@dataclasses.dataclass(frozen=True)
class PromiseCell:
    verdict: str  # kept, BROKEN, not tested (combined over legs: any BROKEN, else all kept, else not tested)
    detail: str
    legs: tuple[str, ...] = ()  # the legs that broke it


@dataclasses.dataclass(frozen=True)
class FleetHost:
    name: str
    status: str  # one of STATUSES
    why: str  # the reason for a status other than passed ("" for a pass)
    mode: str
    verdict_line: str
    probes: Mapping[str, ProbeCell]
    promises: Mapping[str, PromiseCell]
    notes: tuple[str, ...] = ()  # unreadable files and the like

    def count(self, verdict: str) -> int:
        return sum(1 for p in self.promises.values() if p.verdict == verdict)


@dataclasses.dataclass(frozen=True)
class Fleet:
    hosts: tuple[FleetHost, ...]

    @property
    def probe_ids(self) -> list[str]:
        return _ordered(p for h in self.hosts for p in h.probes)

    @property
    def promise_labels(self) -> list[str]:
        return _ordered(p for h in self.hosts for p in h.promises)

    def with_status(self, status: str) -> list[FleetHost]:
        return [h for h in self.hosts if h.status == status]


def _ordered(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


# --- reading --------------------------------------------------------------------------------------


def _read_json(path: Path, notes: list[str]) -> Any:
    """The document, or None (and a note) when the file is absent, unreadable or not JSON."""
    if not path.is_file():
        return None
    try:
        # A regular file, read up to a bound (a FIFO would hang, /dev/zero fill memory: processes/inputs.py).
        return json.loads(inputs.read_bytes(path).decode(errors="replace"))
    except (inputs.UnusableInput, OSError, ValueError) as e:
        notes.append(f"{path.name}: unreadable ({type(e).__name__}: {str(e)[:80]})")
        return None
    except RecursionError:  # a 100,000-deep array: json's recursive decoder gives up (issue 28)
        notes.append(f"{path.name}: unreadable (nested too deeply)")
        return None


def _text(doc: Any, key: str) -> str:
    value = doc.get(key) if isinstance(doc, dict) else None
    return "" if value is None else str(value)


def _probes(doc: Any) -> dict[str, ProbeCell]:
    out: dict[str, ProbeCell] = {}
    findings = doc.get("findings") if isinstance(doc, dict) else None
    for f in findings if isinstance(findings, list) else []:
        if not isinstance(f, dict) or not f.get("probe"):
            continue
        facts = f.get("facts")
        cause = facts.get("cause") if isinstance(facts, dict) else None
        out[str(f["probe"])] = ProbeCell(_text(f, "verdict") or "unknown", str(cause or ""),
                                         _text(f, "reason"))
    return out


def _legs(host_dir: Path, notes: list[str]) -> dict[str, Any]:
    legs: dict[str, Any] = {}
    for path in sorted(host_dir.glob("witness*.json")):
        m = re.fullmatch(r"witness(?:-(?P<leg>[\w.-]+))?\.json", path.name)
        if m:
            doc = _read_json(path, notes)
            if isinstance(doc, dict):
                legs[m.group("leg") or "main"] = doc
    return legs


def _promises(legs: Mapping[str, Any]) -> dict[str, PromiseCell]:
    """Each promise over every leg: BROKEN where any leg broke it, kept where all kept it."""
    seen: dict[str, list[tuple[str, str, str]]] = {}
    for leg, doc in legs.items():
        promises = doc.get("promises")
        for p in promises if isinstance(promises, list) else []:
            if isinstance(p, dict) and p.get("promise"):
                seen.setdefault(str(p["promise"]), []).append((leg, _text(p, "verdict"), _text(p, "detail")))
    out: dict[str, PromiseCell] = {}
    for label, views in seen.items():
        broken = [(leg, d) for leg, v, d in views if v == "BROKEN"]
        if broken:
            named = tuple(leg for leg, _ in broken) if len(legs) > 1 else ()
            out[label] = PromiseCell("BROKEN", broken[0][1], named)
        elif all(v == "kept" for _, v, _ in views):
            out[label] = PromiseCell("kept", "")
        else:
            out[label] = PromiseCell("not tested", next((d for _, v, d in views if v != "kept"), ""))
    return out


def _status(state: Any, run: Any, legs: Mapping[str, Any]) -> tuple[str, str]:
    if _text(state, "state") == "unreachable":
        return "unreachable", _text(state, "reason") or "unreachable"
    if _text(state, "state") == "failed":
        task = _text(state, "task")
        return "stopped", (f"at '{task}': " if task else "") + (_text(state, "reason") or "a step failed")
    if isinstance(run, dict):
        status = _text(run, "status")
        if status not in ("passed", "failed", "refused", "error"):
            status = "error"
        return status, "" if status == "passed" else (_text(run, "reason") or _text(run, "verdict_line"))
    if legs:  # reports gathered by hand: each says its own exit code
        codes = [doc.get("exit") for doc in legs.values()]
        for code in (1, 2, 75):
            if code in codes:
                return RUN_STATUS[code], f"a witness report says exit {code}"
        if all(c == 0 for c in codes):
            return "passed", ""
        return "error", f"witness report exit codes {codes}"
    return "no report", "no witness outcome: the host dropped out before the run finished"


def load_host(host_dir: Path) -> FleetHost:
    notes: list[str] = []
    state = _read_json(host_dir / "host.json", notes)
    probe = _read_json(host_dir / "probe.json", notes)
    run = _read_json(host_dir / "run.json", notes)
    legs = _legs(host_dir, notes)
    status, why = _status(state, run, legs)
    return FleetHost(host_dir.name, status, why, _text(run, "mode"), _text(run, "verdict_line"),
                     _probes(probe), _promises(legs), tuple(notes))


def _is_host_dir(d: Path) -> bool:
    """A host's directory has at least one of its reports (a JUnit directory beside them has none)."""
    return any((d / name).is_file() for name in REPORT_FILES) or any(d.glob("witness*.json"))


def load(reports: Path) -> Fleet:
    try:
        st = inputs.stat_or_none(reports)
    except inputs.UnusableInput as e:
        raise UsageError(f"{inputs.shown(reports)}: {e}") from None
    if st is None:
        raise UsageError(f"{reports}: no such directory")
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{reports}: not a directory")
    dirs = sorted(d for d in reports.iterdir() if d.is_dir() and _is_host_dir(d))
    if not dirs:
        raise UsageError(f"{reports}: no host directories (expected DIR/HOST/ with probe.json, run.json, "
                         "witness*.json)")
    return Fleet(tuple(load_host(d) for d in dirs))


# --- deciding -------------------------------------------------------------------------------------


def exit_code(fleet: Fleet, *, require: bool = False) -> int:
    if fleet.with_status("failed"):
        return EXIT_FAIL
    if require and any(h.status != "passed" for h in fleet.hosts):
        return EXIT_FAIL
    return EXIT_OK


def summary(fleet: Fleet) -> str:
    counts = ", ".join(f"{len(fleet.with_status(s))} {s}" for s in STATUSES if fleet.with_status(s))
    red = fleet.with_status("failed")
    broken = [f"{h.name} ({h.count('BROKEN')})" for h in red if h.count("BROKEN")]
    harness = [h.name for h in red if not h.count("BROKEN")]
    if not red:
        tail = "no promise broken"
    else:
        parts = [f"BROKEN on {', '.join(broken)}"] if broken else []
        parts += [f"red without a BROKEN promise on {', '.join(harness)}"] if harness else []
        tail = "; ".join(parts)
    n = len(fleet.hosts)
    return f"fleet: {n} host{'s' if n != 1 else ''}: {counts}; {tail}"


def cause_groups(fleet: Fleet) -> list[tuple[str, str, str, list[str], str]]:
    """(probe, verdict, cause, hosts, an example reason) for every verdict that needs explaining,
    grouped so a hundred hosts of one shape make one line, not a hundred."""
    groups: dict[tuple[str, str, str], tuple[list[str], str]] = {}
    for probe in fleet.probe_ids:
        for h in fleet.hosts:
            cell = h.probes.get(probe)
            if cell is None or cell.verdict in QUIET_VERDICTS:
                continue
            hosts, _ = groups.setdefault((probe, cell.verdict, cell.cause), ([], cell.reason))
            hosts.append(h.name)
    return [(p, v, c, hosts, reason) for (p, v, c), (hosts, reason) in groups.items()]


def _witnessed(fleet: Fleet) -> list[FleetHost]:
    return [h for h in fleet.hosts if h.promises]


# --- rendering ------------------------------------------------------------------------------------


def _host_rows(fleet: Fleet) -> tuple[list[str], list[list[str]]]:
    header = ["HOST", "STATUS", "MODE", "KEPT", "BROKEN", "NOT TESTED", "WHY"]
    rows = []
    for h in fleet.hosts:
        counts = [str(h.count(v)) for v in ("kept", "BROKEN", "not tested")] if h.promises else ["", "", ""]
        why = "; ".join(x for x in (h.why, *h.notes) if x)
        rows.append([h.name, h.status, h.mode or "", *counts, _one_line(why)])
    return header, rows


def _probe_rows(fleet: Fleet) -> tuple[list[str], list[list[str]]]:
    ids = fleet.probe_ids
    rows = [[h.name, *(CODES.get(h.probes[i].verdict, h.probes[i].verdict) if i in h.probes else "."
                       for i in ids)] for h in fleet.hosts if h.probes]
    return ["HOST", *ids], rows


def _promise_rows(fleet: Fleet) -> tuple[list[str], list[list[str]]]:
    hosts = _witnessed(fleet)
    rows = [[label, *(PROMISE_CODES.get(h.promises[label].verdict, h.promises[label].verdict)
                      if label in h.promises else "." for h in hosts)] for label in fleet.promise_labels]
    return ["PROMISE", *(h.name for h in hosts)], rows


def _cause_rows(fleet: Fleet) -> tuple[list[str], list[list[str]]]:
    rows = [[probe, verdict, cause or "", ", ".join(hosts), _one_line(reason)]
            for probe, verdict, cause, hosts, reason in cause_groups(fleet)]
    return ["PROBE", "VERDICT", "CAUSE", "HOSTS", "REASON (first host)"], rows


def _broken_rows(fleet: Fleet) -> tuple[list[str], list[list[str]]]:
    rows = [[h.name, label, ",".join(cell.legs), _one_line(cell.detail)]
            for h in fleet.hosts for label, cell in h.promises.items() if cell.verdict == "BROKEN"]
    return ["HOST", "PROMISE", "LEGS", "WHAT THE TASK SAW"], rows


def _untested_rows(fleet: Fleet) -> tuple[list[str], list[list[str]]]:
    """Why promises went untested, one row per reason: the promises and the hosts it covers."""
    groups: dict[str, tuple[dict[str, None], dict[str, None]]] = {}  # ordered sets
    for h in fleet.hosts:
        for label, cell in h.promises.items():
            if cell.verdict == "not tested":
                labels, hosts = groups.setdefault(_one_line(cell.detail) or "(no reason given)", ({}, {}))
                labels[label] = hosts[h.name] = None
    return ["PROMISES", "HOSTS", "WHY NOT TESTED"], [[", ".join(labels), ", ".join(hosts), why]
                                                    for why, (labels, hosts) in groups.items()]


def _one_line(text: str) -> str:
    """Whitespace flattened, nothing cut: a reason is the cause a person acts on (it goes last)."""
    return " ".join(text.split())


def _text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|") or " "


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(_md_cell(c) for c in header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]


SECTIONS = (
    ("Hosts", None, _host_rows),
    ("Probes (host × probe)", LEGEND, _probe_rows),
    ("Probe causes", None, _cause_rows),
    ("Promises (promise × host)", PROMISE_LEGEND, _promise_rows),
    ("Broken promises", None, _broken_rows),
    ("Not tested", None, _untested_rows),
)


def render(fleet: Fleet, fmt: str) -> str:
    out = [summary(fleet)]
    for title, legend, rows_of in SECTIONS:
        header, rows = rows_of(fleet)
        if not rows:
            continue
        if fmt == "markdown":
            intro = [f"_{legend}_", ""] if legend else []
            out += ["", f"### {title}", "", *intro, *_md_table(header, rows)]
        else:
            out += ["", title + (f"  ({legend})" if legend else ""), *_text_table(header, rows)]
    return "\n".join(out) + "\n"


def junit(host: FleetHost) -> str:
    """One JUnit file per host: each probe (skipped with its reason unless supported or not detected),
    the run (an error when the host was not reached or stopped, skipped when refused), and each
    promise (a failure when BROKEN, skipped when not tested)."""
    suite = ET.Element("testsuite", name=host.name)
    cases: list[ET.Element] = []

    def case(classname: str, name: str, kind: str | None = None, message: str = "") -> None:
        el = ET.Element("testcase", classname=f"{host.name}.{classname}", name=name, time="0")
        if kind is not None:
            ET.SubElement(el, kind, message=_one_line(message))
        cases.append(el)

    for probe, cell in host.probes.items():
        quiet = cell.verdict in QUIET_VERDICTS
        case("probe", probe, None if quiet else "skipped",
             f"{cell.verdict}" + (f" ({cell.cause})" if cell.cause else "") + f": {cell.reason}")
    kind = {"passed": None, "failed": "failure", "refused": "skipped"}.get(host.status, "error")
    case("run", "witness", kind, f"{host.status}: {host.why or host.verdict_line}")
    for label, promise in host.promises.items():
        kind = {"kept": None, "BROKEN": "failure"}.get(promise.verdict, "skipped")
        case("promise", label, kind, f"{promise.verdict}: {promise.detail}")
    for key, tag in (("tests", None), ("failures", "failure"), ("errors", "error"), ("skipped", "skipped")):
        n = len(cases) if tag is None else sum(1 for c in cases if c.find(tag) is not None)
        suite.set(key, str(n))
    suite.extend(cases)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _junit_name(host: str) -> str:
    return re.sub(r"[^\w.-]", "_", host) + ".xml"


# --- command --------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR",
                   help="a directory of host directories (what the fleet playbook fetches)")
    p.add_argument("--format", choices=("text", "markdown"), default="text", help="the table's format")
    p.add_argument("--output", metavar="FILE", help="write the table here instead of stdout")
    p.add_argument("--junit-dir", metavar="DIR", help="write one JUnit file per host here (HOST.xml)")
    p.add_argument("--require", action="store_true",
                   help="exit 1 when any host did not pass (refused, unreachable, stopped, no report)")


def _host_dir_holding(path: str, reports: str) -> Path | None:
    """The host directory of `reports` that `path` is in (or is), or None. The playbook writes the table
    and the JUnit directory beside the host directories (DIR/fleet.md, DIR/junit): that is fine; a file
    written into a host's directory would replace its report or be read as one next time."""
    real, base = Path(os.path.realpath(path)), Path(os.path.realpath(reports))
    if not real.is_relative_to(base) or real == base:
        return None
    top = base / real.relative_to(base).parts[0]
    return top if top.is_dir() and _is_host_dir(top) else None


def _check_outputs(args: argparse.Namespace) -> None:
    """Before any report is read: an output is a file we can replace, and none lands in a host's
    directory."""
    if args.output is not None:
        outputs.check_target("--output", args.output)
        host = _host_dir_holding(args.output, args.dir)
        if host is not None:
            raise UsageError(f"--output {args.output}: inside the host directory {host}: it would replace "
                             "or join the reports it is made from")
    if args.junit_dir is not None:
        if args.junit_dir == "":
            raise UsageError("--junit-dir: expected a directory, got an empty string")
        host = _host_dir_holding(args.junit_dir, args.dir)
        if host is not None:
            raise UsageError(f"--junit-dir {args.junit_dir}: inside the host directory {host}")
        if os.path.exists(args.junit_dir) and not os.path.isdir(args.junit_dir):
            raise UsageError(f"--junit-dir {args.junit_dir}: not a directory")


def main(args: argparse.Namespace) -> int:
    _check_outputs(args)
    fleet = load(Path(args.dir))
    text = render(fleet, args.format)
    if args.junit_dir:
        out = Path(args.junit_dir)
        try:
            out.mkdir(parents=True, exist_ok=True)
            for h in fleet.hosts:
                outputs.write_text(out / _junit_name(h.name), junit(h))
        except OSError as e:
            raise UsageError(f"--junit-dir {out}: {e.strerror or e}") from None
    if args.output:
        try:
            outputs.write_text(args.output, text)
        except OSError as e:
            raise UsageError(f"--output {args.output}: {e.strerror or e}") from None
    else:
        sys.stdout.write(text)
    return exit_code(fleet, require=args.require)
