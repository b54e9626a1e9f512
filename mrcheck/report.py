"""mr-check's pure half: which tiers a change touches, the overall verdict, and the three renderings.

No I/O here. `plan` matches changed paths against the declared globs; `overall` turns the tier
results into one outcome (never green when a touched tier did not run); `render_*` print it as
text, Markdown (to paste into a merge request) or one JSON document (schema 1). Every report names
the commit tested and whether the work tree was dirty; every command in it is the one that ran (or
would run), run from the repository root.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sandbox_conformance.conformance.render import md_code
from sandbox_conformance.mrcheck.config import Tier
from sandbox_conformance.mrcheck.git import Change, Changes, Source
from sandbox_conformance.mrcheck.globs import matches
from sandbox_conformance.mrcheck.tiers import TierOutcome, TierResult, display_command
from sandbox_conformance.processes.exits import EXIT_OK

SCHEMA = 1
TOOL = "sandbox-conformance"
PROG = f"{TOOL} mr-check"


class ReportFormat(enum.StrEnum):
    text = enum.auto()
    markdown = enum.auto()
    json = enum.auto()


@dataclasses.dataclass(frozen=True)
class Hit:
    change: Change
    globs: tuple[str, ...]  # the tier's globs that matched either side of the change


@dataclasses.dataclass(frozen=True)
class TierPlan:
    tier: Tier
    hits: tuple[Hit, ...]

    @property
    def files(self) -> str:
        return ", ".join(h.change.describe() for h in self.hits)


def plan(tiers: Sequence[Tier], changes: Sequence[Change]) -> tuple[TierPlan, ...]:
    """The tiers a change touches, in declaration order, each with the changes that made it necessary.

    A rename counts on both sides (moving a file out of the sandbox's tree changes the sandbox), and a
    deletion counts: removing a seccomp filter is a sandbox change too."""
    out: list[TierPlan] = []
    for tier in tiers:
        hits = []
        for change in changes:
            hit = tuple(g for g in tier.globs if any(matches(g, p) for p in change.paths))
            if hit:
                hits.append(Hit(change, hit))
        if hits:
            out.append(TierPlan(tier, tuple(hits)))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Invocation:
    """How mr-check was asked to run: every option that changes what it checks, so the re-check
    command it prints runs the same check (paths absolute: it works from any directory)."""
    base: str                   # as resolved: the default branch may differ on another clone
    mode: str | None = None
    repo: Path | None = None    # the repository root when -C was given; else run from inside it
    config: Path | None = None  # --config, absolute

    def command(self) -> str:
        args = [TOOL, "mr-check"]
        if self.repo is not None:
            args += ["-C", str(self.repo)]
        if self.config is not None:
            args += ["--config", str(self.config)]
        args += ["--base", self.base]
        if self.mode:
            args += ["--mode", self.mode]
        return shlex.join(args)


@dataclasses.dataclass(frozen=True)
class CheckReport:
    changes: Changes
    config: Path
    invocation: Invocation
    plans: tuple[TierPlan, ...]
    results: tuple[TierResult, ...]  # parallel to plans

    @property
    def mode(self) -> str | None:
        return self.invocation.mode

    @property
    def touched(self) -> bool:
        return bool(self.plans)

    @property
    def pairs(self) -> list[tuple[TierPlan, TierResult]]:
        return list(zip(self.plans, self.results, strict=True))

    @property
    def refused(self) -> list[tuple[TierPlan, TierResult]]:
        return [(p, res) for p, res in self.pairs if res.outcome is TierOutcome.refused]

    @property
    def ran(self) -> list[tuple[TierPlan, TierResult]]:
        return [(p, res) for p, res in self.pairs if res.outcome is not TierOutcome.refused]


def overall(results: Sequence[TierResult]) -> TierOutcome:
    """A red tier wins (a known failure), then an unusable tier config, then a tier that did not run.

    Green only when every touched tier ran and passed: no tiers touched is also green."""
    outcomes = {r.outcome for r in results}
    for worst in (TierOutcome.failed, TierOutcome.error, TierOutcome.usage, TierOutcome.refused):
        if worst in outcomes:
            return worst
    return TierOutcome.passed


def exit_code(report: CheckReport) -> int:
    return overall(report.results).exit_code if report.touched else EXIT_OK


def _short(sha: str) -> str:
    return sha[:12]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _since(r: CheckReport) -> str:
    c = r.changes
    return f"since {c.base} (merge-base {_short(c.merge_base)})"


def _uncommitted_paths(changes: Sequence[Change]) -> set[str]:
    return {c.path for c in changes if c.source is not Source.committed}


def tested(r: CheckReport) -> str:
    """The commit tested and whether the work tree matched it: a verdict on a dirty tree is a verdict
    on files the reviewer cannot see in the merge request."""
    n = len(_uncommitted_paths(r.changes.changes))
    state = f"work tree dirty: {_plural(n, 'uncommitted file')}" if n else "work tree clean"
    return f"tested {r.changes.head_short or _short(r.changes.head)} ({state})"


def untouched_line(r: CheckReport) -> str:
    n = len({c.path for c in r.changes.changes})  # a path both committed and edited since counts once
    return (f"{PROG}: not sandbox-touching: {_plural(n, 'changed path')} {_since(r)}, {tested(r)}, "
            f"none matches a glob declared in {r.config.name}")


def recheck_command(r: CheckReport) -> str:
    """mr-check itself, to re-run every touched tier on a host that can (same options)."""
    return r.invocation.command()


# --- the handover: what a reviewer pastes into the merge request, unedited ------------------------

PROBE_POINTER = "For what this host lacks, run `sandbox-conformance probe` where mr-check ran."
ATTACH = "Run from the repository root on a host that can, and attach the last line it prints:"


def handover_heading(r: CheckReport) -> str:
    names = [p.tier.name for p, _ in r.refused]
    listed = ", ".join(f"`{n}`" for n in names[:-1]) + (" and " if len(names) > 1 else "") + f"`{names[-1]}`"
    return f"Sandbox conformance: not verified here: needs {listed} run on a host that can"


@dataclasses.dataclass(frozen=True)
class Handover:
    """One refused tier, as the handover says it."""
    tier: str
    what: str
    committed: tuple[Change, ...]  # listed; uncommitted work is only counted
    uncommitted: int
    why: str
    commands: tuple[str, ...]      # the tier's command, then every way on that is a command

    @classmethod
    def of(cls, p: TierPlan, res: TierResult, mode: str | None) -> Handover:
        committed = tuple(h.change for h in p.hits if h.change.source is Source.committed)
        commands = [display_command(p.tier, mode)]
        for way in res.ways_on:
            if way.startswith(f"{TOOL} "):
                cmd, _, note = way.partition("  # ")
                commands.append(f"# or{': ' + note if note else ''}\n{cmd.strip()}")
        return cls(p.tier.name, p.tier.describe(), committed,
                   len(_uncommitted_paths([h.change for h in p.hits])), res.plain_why, tuple(commands))

    def uncommitted_line(self) -> str:
        if not self.uncommitted:
            return ""
        if not self.committed:
            return (f"only {_plural(self.uncommitted, 'uncommitted file')}: commit them, so the reviewer "
                    "tests what they read")
        return f"plus {_plural(self.uncommitted, 'uncommitted file')}"


def _fence(body: str, lang: str = "sh") -> str:
    # A fence longer than any backtick run inside, so output quoting ``` cannot close it (CommonMark 4.5).
    ticks = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", body)), default=0))
    return f"{ticks}{lang}\n{body}\n{ticks}"


def _how_markdown(c: Change) -> str:
    return f"{c.status} from `{c.old_path}`" if c.old_path else str(c.status)


def handover_markdown(r: CheckReport) -> str | None:
    if not r.refused:
        return None
    out: list[str] = []
    for p, res in r.refused:
        h = Handover.of(p, res, r.mode)
        out.append(f"**`{h.tier}`** ({h.what}) covers:")
        out.append("\n".join(f"- `{c.path}` ({_how_markdown(c)})" for c in h.committed)
                   or "- no committed file")
        if h.uncommitted_line():
            out.append(h.uncommitted_line()[0].upper() + h.uncommitted_line()[1:] + ".")
        out += [f"Why not here: {h.why}.", ATTACH, _fence("\n".join(h.commands))]
    out += ["To re-check the whole change on such a host:", _fence(recheck_command(r)), PROBE_POINTER]
    return "\n\n".join(out)


def handover_text(r: CheckReport) -> str | None:
    if not r.refused:
        return None
    out = [handover_heading(r).replace("`", ""), ""]
    for p, res in r.refused:
        h = Handover.of(p, res, r.mode)
        out.append(f"Tier {h.tier} ({h.what}) covers:")
        out += [f"  - {c.describe()}" for c in h.committed] or ["  - no committed file"]
        if h.uncommitted_line():
            out.append(f"  {h.uncommitted_line()}")
        out += [f"Why not here: {h.why}.", ATTACH]
        out += [f"    {line}" for cmd in h.commands for line in cmd.splitlines()]
        out.append("")
    out += ["To re-check the whole change on such a host:", f"    {recheck_command(r)}", PROBE_POINTER]
    return "\n".join(out)


# --- the renderings ------------------------------------------------------------------------------

def _result_lines(res: TierResult) -> list[str]:
    """What a tier that ran said: the failures first, then the denoised tail."""
    lines: list[str] = []
    if res.runner_verdict:
        lines.append(f"runner: {res.runner_verdict}")
    if res.reason != res.runner_verdict:
        lines.append(f"{'why' if res.outcome is TierOutcome.refused else 'result'}: {res.reason}")
    lines += [f"way on: {w}" for w in res.ways_on]
    if res.failures:
        lines.append("failed:")
        lines += [f"  ! {f}" for f in res.failures]
    if res.outcome in (TierOutcome.failed, TierOutcome.error, TierOutcome.usage) and res.output_tail:
        lines.append("output (tail):")
        lines += [f"  | {t}" for t in res.output_tail]
    return lines


def render_text(r: CheckReport) -> str:
    if not r.touched:
        return untouched_line(r)
    verdict = overall(r.results)
    lines = [f"{PROG}: sandbox-touching change {_since(r)}, {tested(r)}: {len(r.plans)} tier(s) cover it; "
             f"commands run from the repository root {r.changes.root}"]
    for p, res in r.pairs:
        lines.append(f"{res.outcome:<8} {p.tier.name}: {display_command(p.tier, r.mode)}")
        lines.append(f"         files: {p.files}")
        lines += [f"         {x}" for x in _result_lines(res)]
    hand = handover_text(r)
    if hand:
        lines += ["", "Handover (paste into the merge request):", "", hand, ""]
    lines.append(f"{PROG}: {verdict} ({verdict.exit_code})")
    return "\n".join(lines)


def _ran_markdown(r: CheckReport) -> list[str]:
    lines = ["| verdict | tier | command | files |", "|---|---|---|---|"]
    for p, res in r.ran:
        # The witness report's own Markdown helpers (conformance/render.py): a `|` ends a table cell
        # even inside backticks, and a backtick in a path needs a longer fence.
        files = "<br>".join(md_code(h.change.describe()) for h in p.hits)
        lines.append(f"| {res.outcome} | {md_code(p.tier.name)} | {md_code(display_command(p.tier, r.mode))} "
                     f"| {files} |")
    for p, res in r.ran:
        lines += ["", f"- `{p.tier.name}`: {res.runner_verdict or res.reason}"]
        shown = res.failures or (res.output_tail if res.outcome is not TierOutcome.passed else ())
        if res.failures and res.reason != res.runner_verdict:
            shown = (res.reason, *shown)
        if shown:
            lines += ["", *("  " + x for x in _fence("\n".join(shown), "text").splitlines())]
    return lines


def render_markdown(r: CheckReport) -> str:
    if not r.touched:
        return untouched_line(r).replace(f"{PROG}: ", "**sandbox-conformance mr-check:** ", 1)
    verdict = overall(r.results)
    # A handover is headed by what it needs, never by the word REFUSED: that is the tool's verdict,
    # and the reader of a merge request needs the next step.
    heading = handover_heading(r) if verdict is TierOutcome.refused else f"Sandbox conformance: {verdict}"
    lines = [f"### {heading}", "",
             f"Sandbox-touching change {_since(r)}, {tested(r)}. Commands run from the repository root."]
    if r.ran:
        lines += ["", *_ran_markdown(r)]
    hand = handover_markdown(r)
    if hand:
        if verdict is not TierOutcome.refused:
            lines += ["", f"#### {handover_heading(r)}"]
        lines += ["", hand]
    return "\n".join(lines).rstrip("\n")


def _titled(hand: str | None, r: CheckReport) -> str | None:
    return None if hand is None else f"### {handover_heading(r)}\n\n{hand}"


def _change_json(c: Change) -> dict[str, Any]:
    return {"path": c.path, "status": str(c.status), "source": str(c.source), "old_path": c.old_path}


def to_json(r: CheckReport) -> dict[str, Any]:
    c = r.changes
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "touched": r.touched,
        "verdict": str(overall(r.results)) if r.touched else "NOT_TOUCHING",
        "exit": exit_code(r),
        "root": str(c.root),
        "config": str(r.config),
        "base": c.base,
        "base_commit": c.base_commit,
        "merge_base": c.merge_base,
        "head": c.head,
        "commit": c.head_short,
        "dirty": c.dirty,
        "uncommitted_files": sorted(_uncommitted_paths(c.changes)),
        "mode": r.mode,
        "recheck": recheck_command(r),
        "changes": [_change_json(x) for x in c.changes],
        "tiers": [],
        "handover": handover_text(r),
        "handover_markdown": _titled(handover_markdown(r), r),
    }
    for p, res in r.pairs:
        doc["tiers"].append({
            "name": p.tier.name,
            "kind": str(p.tier.kind),
            "description": p.tier.describe(),
            "command": display_command(p.tier, r.mode),
            "prepare": list(p.tier.prepare),
            "files": [{**_change_json(h.change), "globs": list(h.globs)} for h in p.hits],
            "outcome": str(res.outcome),
            "reason": res.reason,
            "why": res.plain_why if res.outcome is TierOutcome.refused else None,
            "ways_on": list(res.ways_on),
            "runner_verdict": res.runner_verdict,
            "exit_code": res.exit_code,
            "seconds": round(res.seconds, 3),
            "failures": list(res.failures),
            "output_tail": list(res.output_tail),
        })
    return doc


def render(r: CheckReport, fmt: ReportFormat) -> str:
    if fmt is ReportFormat.json:
        return json.dumps(to_json(r), indent=None if not r.touched else 2)
    if fmt is ReportFormat.markdown:
        return render_markdown(r)
    return render_text(r)
