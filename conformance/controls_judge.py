"""Judge the negative controls from pytest's own results (JUnit XML), never from exit statuses.

PURE: text in, verdicts out. A control is OK when every witness it names went red BY AN ASSERTION
(a JUnit <failure> from an AssertionError; not an <error>, not a <skipped>, not a skip the require
switch turned into a failure, not a crash of the witness itself) and no other witness changed outcome
from the baseline unless the control declared it as collateral."""

from __future__ import annotations

import dataclasses
import enum
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence

from sandbox_conformance.conformance.controls import Control, key

# user_properties the plugin (conformance/plugin.py) attaches to a witness's report; junitxml writes
# them as <property> elements.
PROP_HARNESS = "sbxc_harness_error"
PROP_REQUIRED_SKIP = "sbxc_required_skip"
PROP_SAW = "sbxc_saw"


class ControlOutcome(enum.StrEnum):
    passed = enum.auto()
    assertion = enum.auto()  # failed by an AssertionError: the only way a control may redden a witness
    crashed = enum.auto()  # failed in the test body by another exception: a bug, not a red witness
    error = enum.auto()  # <error>: set-up/teardown error or harness error
    skipped = enum.auto()  # <skipped>, or a skip turned into a failure by the require switch


@dataclasses.dataclass(frozen=True)
class Result:
    test: str  # key(): `test_x[param]`
    outcome: ControlOutcome
    message: str = ""


class UnreadableJUnit(ValueError):
    """Not a JUnit document we can read."""


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:300] if (text or "").strip() else ""


def classify(case: ET.Element) -> Result:
    props = {p.get("name"): p.get("value") or "" for p in case.iter("property")}
    name = case.get("name") or "?"
    failure, error, skipped = case.find("failure"), case.find("error"), case.find("skipped")
    if PROP_HARNESS in props:
        return Result(name, ControlOutcome.error, "harness error: " + _first_line(props[PROP_HARNESS]))
    if error is not None:
        # pytest writes <error> for set-up and teardown errors, also after a <failure> in the body.
        return Result(name, ControlOutcome.error, _first_line(error.get("message") or error.text))
    if PROP_REQUIRED_SKIP in props:
        return Result(
            name, ControlOutcome.skipped,
            "skipped (failed only by the require switch): " + props[PROP_REQUIRED_SKIP]
        )
    if failure is not None:
        message = failure.get("message") or failure.text or ""
        # pytest's <failure message> is "ExceptionType: text"; the plugin also records what an
        # assertion saw. Anything but an AssertionError is the witness crashing.
        if PROP_SAW in props or message.startswith("AssertionError"):
            return Result(name, ControlOutcome.assertion, _first_line(props.get(PROP_SAW) or message))
        return Result(name, ControlOutcome.crashed, _first_line(message))
    if skipped is not None:
        return Result(name, ControlOutcome.skipped, _first_line(skipped.get("message") or skipped.text))
    return Result(name, ControlOutcome.passed)


def parse_junit(text: str) -> dict[str, Result]:
    """Every <testcase> by key(); a name seen twice (two modules) is a UnreadableJUnit: ambiguous."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise UnreadableJUnit(f"not XML: {e}") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise UnreadableJUnit(f"not JUnit XML: root element <{root.tag}>")
    out: dict[str, Result] = {}
    for case in root.iter("testcase"):
        r = classify(case)
        if r.test in out:
            raise UnreadableJUnit(f"two testcases named {r.test}")
        out[r.test] = r
    return out


class ControlStatus(enum.StrEnum):
    ok = enum.auto()
    failed = enum.auto()
    not_applicable = enum.auto()


@dataclasses.dataclass(frozen=True)
class ControlVerdict:
    control: str
    status: ControlStatus
    problems: tuple[str, ...] = ()  # one line each: why the control failed
    reddened: tuple[str, ...] = ()  # named witnesses that went red by an assertion
    collateral_seen: tuple[str, ...] = ()  # declared collateral that did change
    reason: str = ""  # not_applicable: why

    @property
    def ok(self) -> bool:
        return self.status is not ControlStatus.failed


def not_applicable(control: Control, reason: str) -> ControlVerdict:
    return ControlVerdict(control.name, ControlStatus.not_applicable, reason=reason)


def _describe(r: Result | None) -> str:
    if r is None:
        return "did not run"
    return f"{r.outcome}" + (f" ({r.message})" if r.message else "")


def judge(
    control: Control,
    baseline: Mapping[str, Result],
    results: Mapping[str, Result] | None,
    *,
    collateral: Iterable[str] = (),
    run_problem: str = "",
) -> ControlVerdict:
    """One control's verdict. `collateral`: the node ids declared for this host (controls.collateral).
    `results` None: the control's run gave no JUnit results; `run_problem` says why."""
    if results is None:
        return ControlVerdict(
            control.name, ControlStatus.failed,
            (f"no JUnit results from the witness run: {run_problem or '?'}",)
        )
    problems: list[str] = []
    reddened: list[str] = []
    named = [key(t) for t in control.reddens]
    for t in named:
        b, r = baseline.get(t), results.get(t)
        if b is None:
            problems.append(f"{t}: no such witness in the baseline (renamed, or deselected by the profile?)")
            continue
        if b.outcome is not ControlOutcome.passed:
            problems.append(f"{t}: did not pass in the baseline ({_describe(b)}): red proves nothing")
            continue
        if r is not None and r.outcome is ControlOutcome.assertion:
            reddened.append(t)
        elif r is not None and r.outcome is ControlOutcome.passed:
            problems.append(f"{t}: left green")
        else:
            problems.append(f"{t}: red for the wrong reason: {_describe(r)}")
    declared = {key(t) for t in collateral}
    seen: list[str] = []
    for t in sorted(set(baseline) | set(results)):
        if t in named:
            continue
        b, r = baseline.get(t), results.get(t)
        if _same(b, r):
            continue
        if t in declared:
            seen.append(t)
            continue
        problems.append(f"{t}: undeclared collateral: {_describe(b)} in the baseline, {_describe(r)} here")
    return ControlVerdict(
        control.name,
        ControlStatus.failed if problems else ControlStatus.ok,
        tuple(problems),
        tuple(reddened),
        tuple(seen),
    )


def _same(a: Result | None, b: Result | None) -> bool:
    # ControlOutcome only: messages carry per-run paths and nonces.
    return (a.outcome if a else None) == (b.outcome if b else None)


@dataclasses.dataclass(frozen=True)
class BaselineProblem:
    could_not_run: bool  # exit 75: nothing could be witnessed
    lines: tuple[str, ...]


def baseline_problems(baseline: Mapping[str, Result] | None, run_problem: str = "") -> BaselineProblem | None:
    """None when the baseline is usable: it ran, and every witness passed or skipped (a skip: the
    promise cannot be witnessed here; the controls that name it say so). No witness passed at all
    means the reference sandbox did not run: nothing can be controlled (exit 75)."""
    if baseline is None:
        return BaselineProblem(True, (f"the baseline gave no JUnit results: {run_problem or '?'}",))
    if not any(r.outcome is ControlOutcome.passed for r in baseline.values()):
        first = next((r for r in baseline.values() if r.message), None)
        why = f": {first.test}: {_describe(first)}" if first else ""
        return BaselineProblem(True, (f"no witness passed in the baseline{why}",))
    red = [
        f"{t}: red in the baseline, with no perturbation: {_describe(r)}"
        for t, r in sorted(baseline.items())
        if r.outcome not in (ControlOutcome.passed, ControlOutcome.skipped)
    ]
    return BaselineProblem(False, tuple(red)) if red else None


@dataclasses.dataclass(frozen=True)
class Coverage:
    test: str
    status: str  # controlled, justified, NEITHER, not_run, unselected
    controls: tuple[str, ...]  # controls that named it and turned it red by an assertion
    detail: str


def coverage(
    baseline: Mapping[str, Result],
    controls: Sequence[Control],
    verdicts: Mapping[str, ControlVerdict],
    uncontrolled: Mapping[str, str],
    unselected: Sequence[Control] = (),
) -> list[Coverage]:
    """Each witness of the baseline with the controls that turned it red, or its reason not to be.
    A witness the baseline skipped cannot be controlled here: `not_run`, with the skip's reason."""
    out: list[Coverage] = []
    for t, b in baseline.items():
        by = tuple(c.name for c in controls if c.name in verdicts and t in verdicts[c.name].reddened)
        named = tuple(c.name for c in controls if t in {key(x) for x in c.reddens})
        elsewhere = tuple(c.name for c in unselected if t in {key(x) for x in c.reddens})
        if by:
            out.append(Coverage(t, "controlled", by, ""))
        elif b.outcome is ControlOutcome.skipped:
            out.append(Coverage(t, "not_run", (), f"skipped in the baseline: {b.message}"))
        elif t in uncontrolled:
            out.append(Coverage(t, "justified", (), uncontrolled[t]))
        elif named and all(
            n in verdicts and verdicts[n].status is ControlStatus.not_applicable for n in named
        ):
            # Every control of it means nothing on this host (an unprivileged task is refused the host's
            # sysctls by file modes, whatever the sandbox shows): not run here, with why, as a skip is.
            why = verdicts[named[0]].reason
            out.append(Coverage(t, "not_run", (), f"its controls are not applicable here: {why}"))
        elif elsewhere and not named:
            out.append(
                Coverage(t, "unselected", (), f"controlled by {', '.join(elsewhere)} (not run: --only)")
            )
        elif named:
            out.append(Coverage(t, "NEITHER", (), f"named by {', '.join(named)}, which did not turn it red"))
        else:
            out.append(Coverage(t, "NEITHER", (), "no control turns it red and no reason is given"))
    return out
