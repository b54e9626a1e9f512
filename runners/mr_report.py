"""mr-check's pure half: which tiers a change touches, the overall verdict, and the three renderings.

No I/O here. `plan` matches changed paths against the declared globs; `overall` turns the tier
results into one outcome (never green when a touched tier did not run); `render_*` print it as
text, Markdown (to paste into a merge request) or one JSON document (schema 1).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runners.mr_config import Tier
from runners.mr_git import Change, Changes
from runners.mr_globs import matches
from runners.mr_tiers import Outcome, TierResult, display_command

SCHEMA = 1
PROG = "sandbox-conformance mr-check"


class Format(enum.StrEnum):
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
class Report:
    changes: Changes
    config: Path
    mode: str | None
    plans: tuple[TierPlan, ...]
    results: tuple[TierResult, ...]  # parallel to plans

    @property
    def touched(self) -> bool:
        return bool(self.plans)

    @property
    def pairs(self) -> list[tuple[TierPlan, TierResult]]:
        return list(zip(self.plans, self.results, strict=True))


def overall(results: Sequence[TierResult]) -> Outcome:
    """A red tier wins (a known failure), then an unusable tier config, then a tier that did not run.

    Green only when every touched tier ran and passed: no tiers touched is also green."""
    outcomes = {r.outcome for r in results}
    for worst in (Outcome.failed, Outcome.error, Outcome.usage, Outcome.refused):
        if worst in outcomes:
            return worst
    return Outcome.passed


def exit_code(report: Report) -> int:
    return overall(report.results).exit_code if report.touched else 0


def _short(sha: str) -> str:
    return sha[:12]


def _since(r: Report) -> str:
    c = r.changes
    return f"since {c.base} (merge-base {_short(c.merge_base)})"


def untouched_line(r: Report) -> str:
    n = len({c.path for c in r.changes.changes})  # a path both committed and edited since counts once
    return (f"{PROG}: not sandbox-touching: {n} changed path{'s' if n != 1 else ''} {_since(r)}, "
            f"none matches a glob declared in {r.config.name}")


def recheck_command(r: Report) -> str:
    """mr-check itself, to re-run every touched tier on a host that can (same base, same mode)."""
    return shlex.join([PROG.split()[0], "mr-check", "--base", r.changes.base,
                       *(["--mode", r.mode] if r.mode else [])])


def _handover_fields(p: TierPlan, res: TierResult, mode: str | None) -> tuple[str, str, str]:
    why = res.reason.rstrip(".")
    if res.ways_on:
        why += " (ways on: " + "; ".join(w.rstrip(".") for w in res.ways_on) + ")"
    return p.tier.describe(), display_command(p.tier, mode), why


def handover_text(r: Report) -> str | None:
    refused = [(p, res) for p, res in r.pairs if res.outcome is Outcome.refused]
    if not refused:
        return None
    paras = []
    for p, res in refused:
        what, cmd, why = _handover_fields(p, res, r.mode)
        paras.append(
            f"Sandbox conformance NOT verified for this change: {p.files} touch the sandbox and are covered "
            f"by tier \"{p.tier.name}\" ({what}), which could not run on the host where mr-check ran: {why}. "
            f"Run it from the repository root on a host that can, and attach its verdict line: {cmd}")
    paras.append(f"To re-check the whole change on such a host: {recheck_command(r)}")
    return "\n\n".join(paras)


def handover_markdown(r: Report) -> str | None:
    refused = [(p, res) for p, res in r.pairs if res.outcome is Outcome.refused]
    if not refused:
        return None
    paras = []
    for p, res in refused:
        what, cmd, why = _handover_fields(p, res, r.mode)
        files = ", ".join(f"`{h.change.path}` ({h.change.how()})" for h in p.hits)
        paras.append(
            f"**Sandbox conformance not verified here.** {files} touch the sandbox and are covered by tier "
            f"`{p.tier.name}` ({what}), which could not run on the host where `mr-check` ran: {why}. "
            f"Run it from the repository root on a host that can, and attach its verdict line:\n\n"
            f"```sh\n{cmd}\n```")
    paras.append(f"To re-check the whole change on such a host: `{recheck_command(r)}`")
    return "\n\n".join(paras)


def render_text(r: Report) -> str:
    if not r.touched:
        return untouched_line(r)
    verdict = overall(r.results)
    lines = [f"{PROG}: sandbox-touching change {_since(r)}: {len(r.plans)} tier(s) cover it"]
    for p, res in r.pairs:
        lines.append(f"{res.outcome:<8} {p.tier.name}: {display_command(p.tier, r.mode)}")
        lines.append(f"         files: {p.files}")
        if res.runner_verdict:
            lines.append(f"         runner: {res.runner_verdict}")
        if res.reason != res.runner_verdict:
            lines.append(f"         {'why' if res.outcome is Outcome.refused else 'result'}: {res.reason}")
        lines += [f"         way on: {w}" for w in res.ways_on]
        if res.outcome in (Outcome.failed, Outcome.error, Outcome.usage) and res.output_tail:
            lines.append("         output (tail):")
            lines += [f"           | {t}" for t in res.output_tail]
    hand = handover_text(r)
    if hand:
        lines += ["", "Handover (paste into the merge request):", "", hand, ""]
    lines.append(f"{PROG}: {verdict} ({verdict.exit_code})")
    return "\n".join(lines)


def _cell(text: str) -> str:
    # A `|` ends a table cell even inside backticks (GitHub-flavoured Markdown, "Tables").
    return text.replace("|", "\\|")


def render_markdown(r: Report) -> str:
    if not r.touched:
        return untouched_line(r).replace(f"{PROG}: ", "**sandbox-conformance mr-check:** ", 1)
    verdict = overall(r.results)
    lines = [f"### Sandbox conformance: {verdict}", "",
             f"Sandbox-touching change {_since(r)}.", "",
             "| verdict | tier | command | files |", "|---|---|---|---|"]
    for p, res in r.pairs:
        files = "<br>".join(f"`{_cell(h.change.describe())}`" for h in p.hits)
        lines.append(f"| {res.outcome} | `{_cell(p.tier.name)}` | `{_cell(display_command(p.tier, r.mode))}` "
                     f"| {files} |")
    lines.append("")
    for p, res in r.pairs:
        if res.outcome is not Outcome.refused:
            lines.append(f"- `{p.tier.name}`: {res.runner_verdict or res.reason}")
    hand = handover_markdown(r)
    if hand:
        lines += ["", hand]
    return "\n".join(lines).rstrip("\n")


def _change_json(c: Change) -> dict[str, Any]:
    return {"path": c.path, "status": str(c.status), "source": str(c.source), "old_path": c.old_path}


def to_json(r: Report) -> dict[str, Any]:
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
        "mode": r.mode,
        "changes": [_change_json(x) for x in c.changes],
        "tiers": [],
        "handover": handover_text(r),
    }
    for p, res in r.pairs:
        doc["tiers"].append({
            "name": p.tier.name,
            "kind": str(p.tier.kind),
            "description": p.tier.describe(),
            "command": display_command(p.tier, r.mode),
            "files": [{**_change_json(h.change), "globs": list(h.globs)} for h in p.hits],
            "outcome": str(res.outcome),
            "reason": res.reason,
            "ways_on": list(res.ways_on),
            "runner_verdict": res.runner_verdict,
            "exit_code": res.exit_code,
            "seconds": round(res.seconds, 3),
            "output_tail": list(res.output_tail),
        })
    return doc


def render(r: Report, fmt: Format) -> str:
    if fmt is Format.json:
        return json.dumps(to_json(r), indent=None if not r.touched else 2)
    if fmt is Format.markdown:
        return render_markdown(r)
    return render_text(r)
