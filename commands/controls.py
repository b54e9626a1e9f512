"""`sandbox-conformance controls`: prove every witness can go red, for the right reason (issue 6).

Runs the witness suite once as the baseline (reference sandbox, nothing perturbed), then once per
negative control (conformance/controls.py), and once with no sandbox at all; each run is a separate
`sandbox-conformance witness ... --junitxml FILE` process, run in parallel (--jobs). The verdicts
come from pytest's own results (conformance/controls_judge.py), never from exit statuses.

stdout: one line per control, the coverage table, a summary (or one JSON document with --json).
Exit 0 every control behaved and every witness is controlled or justified; 1 a control left a named
witness green, reddened it for the wrong reason or changed an undeclared witness (each named), or the
baseline itself is red; 2 bad input; 75 the baseline could not run (nothing can be controlled)."""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox_conformance.conformance import controls as catalogue
from sandbox_conformance.conformance import controls_judge as judge_mod
from sandbox_conformance.conformance import render
from sandbox_conformance.conformance.controls import Control
from sandbox_conformance.conformance.controls_judge import ControlStatus, ControlVerdict, Result
from sandbox_conformance.conformance.render import PLAIN, Style
from sandbox_conformance.kernel.cgroupfs import PROMISE_ENV
from sandbox_conformance.processes import cancel, outputs, owner
from sandbox_conformance.processes.children import Completed, Runner, minimal_env, run
from sandbox_conformance.processes.exits import (
    EXIT_FAIL,
    EXIT_OK,
    Refusal,
    UsageError,
    check_as_user,
    check_seconds,
)

if TYPE_CHECKING:
    from sandbox_conformance.runners.progress import Progress

REQUIRE_ENV = "SANDBOX_CONFORMANCE_REQUIRE"

# A witness run takes well under a second here (one launch serves every witness); the bound is for a
# wedged sandbox, and `witness` bounds each launch itself (--timeout).
RUN_TIMEOUT = 120.0
LAUNCH_TIMEOUT = 30.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON document instead of lines")
    p.add_argument(
        "--only",
        metavar="NAME,...",
        help=f"run only these controls (names from the catalogue, or {catalogue.UNSANDBOXED}); "
        "the coverage table is then partial and does not fail the run",
    )
    p.add_argument(
        "--as-user", metavar="NAME", help="(root only) launch every task as this unprivileged user"
    )
    p.add_argument("--jobs", type=int, default=2, metavar="N", help="witness runs in parallel (default 2)")
    p.add_argument(
        "--timeout",
        type=float,
        default=RUN_TIMEOUT,
        metavar="SECONDS",
        help=f"per witness run, whole process group killed (default {RUN_TIMEOUT:g})",
    )
    p.add_argument(
        "--launch-timeout",
        type=float,
        default=LAUNCH_TIMEOUT,
        metavar="SECONDS",
        help=f"per task launch, passed to each witness run's --timeout (default {LAUNCH_TIMEOUT:g}; "
        "a VM under software emulation needs more)",
    )


@dataclasses.dataclass(frozen=True)
class Run:
    """One witness run's JUnit results, or None with why there are none."""

    results: Mapping[str, Result] | None
    problem: str = ""
    argv: tuple[str, ...] = ()
    seconds: float = 0.0


WitnessRunner = Callable[[Sequence[str]], Run]


# SIGTERM if we die, not SIGKILL: each witness run is ours and removes its own layout on the way out.
_run_ours: Runner = functools.partial(run, die_with=signal.SIGTERM)


def witness_runner(
    *,
    as_user: str | None,
    timeout: float,
    workdir: Path,
    launch_timeout: float = LAUNCH_TIMEOUT,
    runner: Runner = _run_ours,
    progress: Progress | None = None,
) -> WitnessRunner:
    """Runs `sandbox-conformance witness EXTRA... --junitxml F` in its own process (pytest keeps
    state per process, and a crashing control must not take the others down). `progress`: each run's
    start and end, on a terminal (runners/progress.py)."""
    counter = iter(range(1_000_000))

    def go(extra: Sequence[str]) -> Run:
        junit = workdir / f"run-{next(counter)}.xml"
        # --verbose: pytest's report stays in the captured stderr (read when a run goes wrong), and
        # these runs, red by design, leave no log in the state directory (conformance/output.py).
        argv = [sys.executable, "-m", "sandbox_conformance", "witness", "--verbose", "--junitxml", str(junit)]
        argv += ["--launch-timeout", str(min(launch_timeout, timeout))]
        if as_user:
            argv += ["--as-user", as_user]
        argv += list(extra)
        # minimal_env: no SANDBOX_CONFORMANCE_REQUIRE (a skip must stay a skip for the judge to see)
        # and no SANDBOX_CONFORMANCE_PERTURB leaking into the baseline. The cgroup root promise is
        # kept: every run must give its tasks the same leaves (the container and VM modes prove a
        # root and promise it through this variable only).
        promised = {k: os.environ[k] for k in (PROMISE_ENV,) if k in os.environ}
        # A witness run of ours, not a launcher: it resolves bwrap on the caller's PATH, as this command
        # and `witness` itself do (probes/host.py Host.which), not on the launchers' fixed one.
        if "PATH" in os.environ:
            promised["PATH"] = os.environ["PATH"]
        if progress is None:
            return _read(runner(argv, timeout=timeout, env=minimal_env(promised), cwd=str(workdir)), junit)
        what = " ".join(extra) or "(baseline)"
        with progress.stage(f"witness run {what if len(what) <= 60 else what[:57] + '...'}") as st:
            done: Completed = runner(argv, timeout=timeout, env=minimal_env(promised), cwd=str(workdir))
            st.result = "timed out" if done.timed_out else f"exit {done.returncode}"
        return _read(done, junit)

    return go


def _read(done: Completed, junit: Path) -> Run:
    why = ""
    if done.timed_out:
        why = f"timed out after {done.seconds:.0f}s (process group killed)"
    elif done.returncode not in (0, 1):
        why = f"`witness` exited {done.returncode}: {done.stderr_tail(2) or '(no stderr)'}"
    try:
        text = junit.read_text()
    except FileNotFoundError:
        return Run(
            None, why or f"no JUnit file: {done.stderr_tail(2) or '(no stderr)'}", done.argv, done.seconds
        )
    try:
        results = judge_mod.parse_junit(text)
    except judge_mod.UnreadableJUnit as e:
        return Run(None, f"unreadable JUnit file: {e}", done.argv, done.seconds)
    if why:
        return Run(None, why, done.argv, done.seconds)
    return Run(results, "", done.argv, done.seconds)


@dataclasses.dataclass(frozen=True)
class Planned:
    control: Control
    extra: tuple[str, ...]  # `witness` arguments
    collateral: tuple[catalogue.Collateral, ...]


def plan(
    chosen: Sequence[Control],
    *,
    disable_userns: bool,
    disable_userns_reason: str,
    cgroup_root: tuple[bool, str] = (False, "the cgroup.delegation probe was not consulted"),
    as_root: bool = True,
) -> tuple[list[Planned], list[ControlVerdict]]:
    """PURE: what to run for each chosen control on this host, and the ones that cannot apply."""
    todo: list[Planned] = []
    skipped: list[ControlVerdict] = []
    for c in chosen:
        why = catalogue.not_applicable(
            c,
            disable_userns=disable_userns,
            disable_userns_reason=disable_userns_reason,
            cgroup_root=cgroup_root[0],
            cgroup_root_reason=cgroup_root[1],
            as_root=as_root,
        )
        if why:
            skipped.append(judge_mod.not_applicable(c, why))
            continue
        prefix = catalogue.launcher_prefix(c, disable_userns=disable_userns)
        extra: tuple[str, ...] = ("--perturb", c.perturb) if c.perturb else ("--launcher", prefix or "")
        if c.launcher_args is not None:
            # The reference sandbox with one thing changed: its tasks get the harness's leaf too.
            extra += ("--harness-leaf",)
        if c.stdin:
            extra += ("--launcher-stdin",)
        todo.append(Planned(c, extra, catalogue.collateral(c, disable_userns=disable_userns)))
    return todo, skipped


def _choose(only: str | None) -> tuple[list[Control], bool]:
    """(the catalogue's controls to run, whether to run the unsandboxed baseline)."""
    if not only:
        return list(catalogue.CONTROLS), True
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = catalogue.by_name()
    unknown = [n for n in names if n not in known and n != catalogue.UNSANDBOXED]
    if unknown or not names:
        raise UsageError(
            f"--only: unknown control {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join([*known, catalogue.UNSANDBOXED])}"
        )
    return [known[n] for n in names if n in known], catalogue.UNSANDBOXED in names


def _validate(args: argparse.Namespace) -> None:
    if args.jobs < 1:
        raise UsageError("--jobs: expected at least 1")
    check_seconds("--timeout", args.timeout)
    check_seconds("--launch-timeout", args.launch_timeout)
    if args.launch_timeout >= args.timeout:
        raise UsageError(f"--launch-timeout {args.launch_timeout:g} must be below --timeout {args.timeout:g} "
                         "(a witness run is at least one launch)")
    check_as_user(args.as_user, group_by_name=False)


def _disable_userns(as_user: str | None) -> tuple[bool, str]:
    """The precondition probe the reference launcher itself uses (conformance/harness.py)."""
    from sandbox_conformance.conformance.preconditions import findings

    f = findings(as_user).get("disable_userns")
    if f is None:
        return False, "the disable_userns probe did not report"
    return bool(f.ok), f"{f.verdict}: {f.reason}"


def _cgroup_root(as_user: str | None) -> tuple[bool, str]:
    """The precondition probe that decides whether each task gets a cgroup leaf (conformance/harness.py)."""
    from sandbox_conformance.conformance.preconditions import findings

    f = findings(as_user).get("cgroup.delegation")
    if f is None:
        return False, "the cgroup.delegation probe did not report"
    return bool(f.ok and f.facts.get("root")), f"{f.verdict}: {f.reason}"


@dataclasses.dataclass(frozen=True)
class ControlsReport:
    baseline: Mapping[str, Result]
    baseline_problem: judge_mod.BaselineProblem | None
    verdicts: list[ControlVerdict]  # catalogue controls, in catalogue order
    planned: list[Planned]
    unsandboxed_planned: Planned | None
    unsandboxed: ControlVerdict | None
    unsandboxed_results: Mapping[str, Result] | None
    coverage: list[judge_mod.Coverage]
    partial: bool
    disable_userns: tuple[bool, str]
    cgroup_root: tuple[bool, str] = (False, "the cgroup.delegation probe was not consulted")

    @property
    def exit_code(self) -> int:
        bad = [v for v in self.verdicts if not v.ok]
        if self.unsandboxed is not None and not self.unsandboxed.ok:
            bad.append(self.unsandboxed)
        neither = [c for c in self.coverage if c.status == "NEITHER"] if not self.partial else []
        return EXIT_FAIL if bad or neither or self.baseline_problem else EXIT_OK


def execute(
    witness: WitnessRunner,
    chosen: Sequence[Control],
    *,
    with_unsandboxed: bool,
    disable_userns: tuple[bool, str],
    jobs: int,
    partial: bool,
    cgroup_root: tuple[bool, str] = (False, "the cgroup.delegation probe was not consulted"),
    as_root: bool = True,
) -> ControlsReport:
    base = witness(())
    problem = judge_mod.baseline_problems(base.results, base.problem)
    if problem is not None and problem.could_not_run:
        raise Refusal(
            "the baseline (reference sandbox, nothing perturbed) could not run: " + "; ".join(problem.lines),
            ways_on=["sandbox-conformance witness  # see why the reference sandbox does not run here"],
        )
    assert base.results is not None
    baseline = base.results
    todo, verdicts = plan(
        chosen,
        disable_userns=disable_userns[0],
        disable_userns_reason=disable_userns[1],
        cgroup_root=cgroup_root,
        as_root=as_root,
    )
    unsb: Planned | None = None
    if with_unsandboxed:
        passed = [t for t, r in baseline.items() if r.outcome is judge_mod.ControlOutcome.passed]
        other = {t: f"{r.outcome}" for t,
                 r in baseline.items() if r.outcome is not judge_mod.ControlOutcome.passed}
        c = catalogue.unsandboxed(passed, other, as_root=as_root)
        unsb = Planned(c, ("--launcher", c.prefix or "env"), c.collateral)
    jobs_list = [*todo, *([unsb] if unsb else [])]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="sbxc-control")
    try:
        # Every job submitted before a stop signal can unwind us (cancel.deferred): one raised inside
        # submit, between a worker's start and its registration, left that worker unknown to
        # concurrent.futures' exit handler, and the interpreter's exit joined it for ever (issue 28).
        with cancel.deferred():
            results = pool.map(lambda p: witness(p.extra), jobs_list)
        runs = dict(zip([p.control.name for p in jobs_list], results, strict=True))
    finally:
        # Cancelled (processes/cancel.py): the witness runs under way are being stopped; the queued
        # ones must not start on the way out.
        pool.shutdown(wait=True, cancel_futures=True)
    for p in todo:
        r = runs[p.control.name]
        verdicts.append(
            judge_mod.judge(
                p.control,
                baseline,
                r.results,
                collateral=[x.test for x in p.collateral],
                run_problem=r.problem,
            )
        )
    order = {c.name: i for i, c in enumerate(chosen)}
    verdicts.sort(key=lambda v: order[v.control])
    unsandboxed_verdict = None
    unsandboxed_results = None
    if unsb is not None:
        r = runs[unsb.control.name]
        unsandboxed_results = r.results
        unsandboxed_verdict = judge_mod.judge(
            unsb.control,
            baseline,
            r.results,
            collateral=[x.test for x in unsb.collateral],
            run_problem=r.problem,
        )
    cov = judge_mod.coverage(
        baseline,
        list(chosen),
        {v.control: v for v in verdicts},
        {catalogue.key(u.test): u.reason for u in catalogue.UNCONTROLLED},
        [c for c in catalogue.CONTROLS if c not in chosen],
    )
    return ControlsReport(
        baseline,
        problem,
        verdicts,
        todo,
        unsb,
        unsandboxed_verdict,
        unsandboxed_results,
        cov,
        partial,
        disable_userns,
        cgroup_root,
    )


# ---- output ---------------------------------------------------------------------------------------------


def _verdict_lines(label: str, v: ControlVerdict, must: int, style: Style = PLAIN) -> list[str]:
    if v.status is ControlStatus.not_applicable:
        return [f"{label}: {style.paint('not applicable here', 'yellow')}: {v.reason}"]
    if v.status is ControlStatus.ok:
        extra = f"; declared collateral seen: {', '.join(v.collateral_seen)}" if v.collateral_seen else ""
        return [f"{label}: {style.paint('OK', 'green')}: {len(v.reddened)}/{must} named witness(es) red by "
                f"an assertion{extra}"]
    return [f"{label}: {style.paint('FAILED', 'bold', 'red')}", *(f"  - {p}" for p in v.problems)]


def human(report: ControlsReport, controls: Mapping[str, Control], style: Style = PLAIN) -> list[str]:
    """The lines a person reads; `style` colours the verdict words (a terminal only: main)."""
    lines: list[str] = []
    counts: dict[str, int] = {}
    for r in report.baseline.values():
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    lines.append(
        f"baseline: {len(report.baseline)} witnesses: "
        + ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))
    )
    if report.baseline_problem:
        lines += [f"  - {p}" for p in report.baseline_problem.lines]
    for v in report.verdicts:
        lines += _verdict_lines(f"control {v.control}", v, len(controls[v.control].reddens), style)
    if report.unsandboxed is not None and report.unsandboxed_planned is not None:
        c = report.unsandboxed_planned.control
        lines += _verdict_lines(f"{c.name} ({c.what})", report.unsandboxed, len(c.reddens), style)
    lines.append("")
    lines.append(
        f"coverage ({len(report.coverage)} witnesses{', partial: --only' if report.partial else ''}):"
    )
    width = max((len(cov.test) for cov in report.coverage), default=0)
    for cov in report.coverage:
        detail = ", ".join(cov.controls) if cov.controls else cov.detail
        lines.append(f"  {cov.status:<10} {cov.test:<{width}}  {detail}")
    ok = sum(1 for v in report.verdicts if v.status is ControlStatus.ok)
    failed = [v.control for v in report.verdicts if v.status is ControlStatus.failed]
    na = sum(1 for v in report.verdicts if v.status is ControlStatus.not_applicable)
    if report.unsandboxed is not None and not report.unsandboxed.ok:
        failed.append(catalogue.UNSANDBOXED)
    by_status: dict[str, int] = {}
    for cov in report.coverage:
        by_status[cov.status] = by_status.get(cov.status, 0) + 1
    lines.append(
        f"controls: {ok} OK, {len(failed)} FAILED{' (' + ', '.join(failed) + ')' if failed else ''}, "
        f"{na} not applicable; coverage: "
        + ", ".join(f"{n} {s}" for s, n in sorted(by_status.items()))
        + f": {style.verdict('PASS' if report.exit_code == EXIT_OK else 'FAIL')}"
    )
    return lines


def _verdict_json(v: ControlVerdict, c: Control, planned: Planned | None) -> dict[str, Any]:
    how: dict[str, Any]
    if c.perturb:
        how = {"perturb": c.perturb}
    else:
        how = {
            "launcher": planned.extra[1] if planned else catalogue.launcher_prefix(c, disable_userns=False)
        }
    return {
        "name": c.name,
        "what": c.what,
        **how,
        "status": str(v.status),
        "must_redden": [catalogue.key(t) for t in c.reddens],
        "reddened": list(v.reddened),
        "declared_collateral": [
            {"test": catalogue.key(x.test), "reason": x.reason}
            for x in (planned.collateral if planned else c.collateral)
        ],
        "collateral_seen": list(v.collateral_seen),
        "problems": list(v.problems),
        "reason": v.reason,
    }


def to_json(report: ControlsReport, controls: Mapping[str, Control]) -> dict[str, Any]:
    planned = {p.control.name: p for p in report.planned}
    unsb = None
    if report.unsandboxed is not None and report.unsandboxed_planned is not None:
        p = report.unsandboxed_planned
        unsb = _verdict_json(report.unsandboxed, p.control, p)
    unsb_results = report.unsandboxed_results or {}
    return {
        "version": 1,
        "exit": report.exit_code,
        "disable_userns": {"works": report.disable_userns[0], "reason": report.disable_userns[1]},
        "cgroup_root": {"usable": report.cgroup_root[0], "reason": report.cgroup_root[1]},
        "baseline": {
            "problems": list(report.baseline_problem.lines) if report.baseline_problem else [],
            "witnesses": {
                t: {"outcome": str(r.outcome), "message": r.message} for t, r in report.baseline.items()
            },
        },
        "controls": [_verdict_json(v, controls[v.control], planned.get(v.control)) for v in report.verdicts],
        "unsandboxed": unsb,
        "coverage": [
            {
                "test": c.test,
                "status": c.status,
                "controls": list(c.controls),
                "detail": c.detail,
                "unsandboxed": str(unsb_results[c.test].outcome) if c.test in unsb_results else None,
            }
            for c in report.coverage
        ],
        "partial": report.partial,
    }


def main(args: argparse.Namespace) -> int:
    _validate(args)
    # Its scratch and every witness run's layouts and reports are made there (a full disk was 75,
    # "did not run", once the baseline could not write its report: issue 28).
    outputs.check_temp_space()
    chosen, with_unsandboxed = _choose(args.only)
    from sandbox_conformance.probes.host import Host

    if Host().which("bwrap") is None:
        raise Refusal(
            "no bwrap on PATH: the reference sandbox, which every control perturbs, cannot run",
            ways_on=["apt-get install bubblewrap"],
        )
    disable_userns = _disable_userns(args.as_user)
    owner.sweep_once()  # what a SIGKILLed run left (processes/owner.py)
    with tempfile.TemporaryDirectory(prefix=f"sbxc-controls-{owner.stamp()}-") as tmp:
        from sandbox_conformance.runners.progress import Progress

        witness = witness_runner(
            as_user=args.as_user,
            timeout=args.timeout,
            workdir=Path(tmp),
            launch_timeout=args.launch_timeout,
            progress=Progress("sandbox-conformance controls"),
        )
        report = execute(
            witness,
            chosen,
            with_unsandboxed=with_unsandboxed,
            disable_userns=disable_userns,
            jobs=args.jobs,
            partial=bool(args.only),
            cgroup_root=_cgroup_root(args.as_user),
            as_root=args.as_user is None and os.geteuid() == 0,
        )
    controls = catalogue.by_name()
    if args.json:
        print(json.dumps(to_json(report, controls), indent=2))
    else:
        for line in human(report, controls, Style(render.use_colour(sys.stdout, os.environ))):
            print(line)
    return required(report)


def required(report: ControlsReport, env: Mapping[str, str] = os.environ) -> int:
    """Under SANDBOX_CONFORMANCE_REQUIRE=1 a control that could not mean anything here, or a witness
    that never ran, is a failure: CI that must prove everything cannot pass on what it skipped."""
    if env.get(REQUIRE_ENV, "") in ("", "0") or report.exit_code != EXIT_OK:
        return report.exit_code
    missing = [
        f"control {v.control} not applicable: {v.reason}"
        for v in report.verdicts
        if v.status is ControlStatus.not_applicable
    ]
    if not report.partial:  # with --only the coverage table is partial by request
        missing += [f"witness {c.test} not run: {c.detail}" for c in report.coverage if c.status == "not_run"]
    for m in missing:
        print(f"controls: required ({REQUIRE_ENV}=1): {m}", file=sys.stderr)
    return EXIT_FAIL if missing else EXIT_OK
