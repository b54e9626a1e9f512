"""One `sandbox-conformance run`, once its options are checked: probe, decide, run the mode, say how it ended.

    code = orchestrate.run(plan, verdict)    # commands/run.py, which parsed and checked the options

Where the run may end native, the witness process starts first, standing by (runners/native.py
Standby), so that its start-up overlaps the probes. The host is probed once (probes/collect.py) and
runners/decide.py answers a mode or a refusal; the mode runs behind runners/modes.py's one interface.
Every "did not run" travels as a Refusal (processes/exits.py): a refused decision at its boundary
(Decision.chosen), a mode that cannot be used here (ContainerUnusable, VmUnusable, the image not
built, systemd-run gone). It is said here, once, and written into the verdict document
(runners/run_verdict.py Verdict), which ends every path with the one verdict line.

When that document is asked for, it also carries each witness run's promise rows and summary line
(run_verdict.Leg), read from the witness's JSON report: the one `--json` asked for, or else a scratch
report of this run's own (REPORT_PREFIX), made before the witness starts and removed at the end."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from sandbox_conformance.conformance import output
from sandbox_conformance.conformance.render import refusal_markdown
from sandbox_conformance.probes.collect import collect
from sandbox_conformance.probes.finding import Finding
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes import owner
from sandbox_conformance.processes.exits import EXIT_OK, EXIT_UNAVAILABLE, VERDICT_WORDS, Refusal
from sandbox_conformance.runners import native, run_verdict
from sandbox_conformance.runners.decide import NEEDED, Decision, Mode, Request, decide
from sandbox_conformance.runners.modes import MODES, Context
from sandbox_conformance.runners.progress import HEARTBEAT, Progress
from sandbox_conformance.runners.run_verdict import Verdict
from sandbox_conformance.runners.witness_args import WitnessOptions

PROG = "sandbox-conformance run"
ENGINE = "container_engine"
# The scratch directory of the witness report a verdict document reads its legs from, stamped so a
# SIGKILLed run's is swept by the next (processes/owner.py: `sbxc-KIND.` + the stamp).
REPORT_PREFIX = "sbxc-run-report."
REPORT_NAME = "witness.json"  # a container's or a VM's legs are copied back beside it as witness-LABEL.json


class Plan(NamedTuple):
    """A checked `run`: what commands/run.py parsed, handed down as a value (nothing re-reads argv)."""

    request: Request
    print_mode: bool
    options: WitnessOptions  # the witness options every mode passes on
    timeout: float  # per witness run
    image: str | None = None
    base_image: str | None = None
    markdown: bool = False  # --format markdown: a refusal also goes to stdout, to paste
    # The witness command's main, for the standing-by child forked from this process (the commands
    # layer's, which this one cannot import).
    witness_main: Callable[[dict[str, Any]], int] | None = None


def render(decision: Decision, requested: Mode) -> list[str]:
    """`--print-mode`: the decision, as data (a refusal here is printed, not raised)."""
    if decision.refused:
        lines = [f"mode: refused (requested {requested})", f"  reason: {decision.reason}"]
        lines += [f"  because: {r}" for r in decision.reasons[1:]]
        lines += [f"  way on: {w}" for w in decision.ways_on]
    else:
        lines = [f"mode: {decision.mode}" + (" (delegated)" if decision.delegate else "")]
        lines += [f"  why: {r}" for r in decision.reasons]
    lines += [f"  note: {n}" for n in decision.notes]
    return lines


def findings_for(host: Host, mode: Mode = Mode.auto) -> list[Finding]:
    """What `decide` reads. With --mode native, all but the container engine: the decision does not need
    it (decide reads it only to word a refusal inside a sandbox, which run then asks for), and rootful
    `podman info` alone was ~0.3 s of the run's critical path (measured: 0.97 s with it, 0.69 s without)."""
    only = NEEDED if mode is not Mode.native else tuple(p for p in NEEDED if p != ENGINE)
    return collect(host, only=only)


def witness_setup(options: WitnessOptions) -> tuple[WitnessOptions, output.RunLog]:
    """The witness options every mode passes on, and the run's log. pytest's report of every witness
    run goes to one log of ours unless -v or --log was given (conformance/output.py RunLog): removed
    when the run passes, named when it does not."""
    log = output.RunLog.choose(verbose=options.verbose, log=options.log)
    if log.path is not None:
        options = options._replace(log=str(log.path))
    return options, log


def with_report(options: WitnessOptions, stack: contextlib.ExitStack) -> WitnessOptions:
    """The options with a witness report to read the legs from: the one --json asks for, else one in
    a scratch directory of ours that `stack` removes. `--json -` (the report on stdout, the user's) and
    no writable temporary directory leave the verdict document without legs."""
    if options.json is not None:
        return options
    try:
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"{REPORT_PREFIX}{owner.stamp()}."))
    except OSError:
        return options
    return options._replace(json=str(Path(scratch, REPORT_NAME)))


class LegReports:
    """The legs of the verdict document, as the mode names each witness run's report on this host
    (runners/modes.py Context.leg_report): a report that is not there, or not one, makes no leg."""

    def __init__(self, options: WitnessOptions) -> None:
        self.legs: list[run_verdict.Leg] = []
        # A --json of the user's, as it was before this run: a native witness that died before writing
        # leaves the previous run's there, which is not this run's leg (each report is written to a
        # temp file and renamed over it, processes/outputs.py: a new one is a new inode).
        self._json = options.json
        self._before = _identity(options.json)

    def __call__(self, label: str, path: str) -> None:
        if path == self._json and self._before is not None and _identity(path) == self._before:
            return
        leg = run_verdict.read_leg(label, path)
        if leg is not None:
            self.legs.append(leg)


def _identity(path: str | None) -> tuple[int, int, int] | None:
    if path is None or path == "-":
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


def rerun_argv(plan: Plan) -> list[str]:
    """This run's own options, without --delegate, for the re-execution under systemd-run."""
    return ["--mode", "native", "--timeout", str(plan.timeout), *plan.options.argv()]


def run(plan: Plan, verdict: Verdict) -> int:
    request = plan.request
    with contextlib.ExitStack() as stack:
        if verdict.path is not None and not plan.print_mode:
            # Before the witness starts standing by: it is handed its options once.
            plan = plan._replace(options=with_report(plan.options, stack))
        standby: native.Standby | None = None
        setup: tuple[WitnessOptions, output.RunLog] | None = None
        if not plan.print_mode and request.mode in (Mode.auto, Mode.native) and not request.delegate:
            # The witness process starts now and waits for the decision (runners/native.py Standby):
            # its start-up overlaps the probes instead of following them.
            setup = witness_setup(plan.options)
            standby = stack.enter_context(native.Standby(setup[0], timeout=plan.timeout,
                                                         witness_main=plan.witness_main))
        findings = {f.probe: f for f in findings_for(Host(), request.mode)}
        decision = decide(request, findings)
        if ENGINE not in findings and decision.mode is None:
            # Refused: the reason names what the engine is from here, so it is asked for after all.
            findings.update({f.probe: f for f in collect(Host(), only=(ENGINE,))})
            decision = decide(request, findings)
        if standby is not None and (decision.mode is not Mode.native or decision.delegate):
            standby.discard()
        if plan.print_mode:
            print("\n".join(render(decision, request.mode)), flush=True)
            return EXIT_UNAVAILABLE if decision.refused else EXIT_OK
        return _decided(plan, verdict, findings, decision, standby, setup)


def _decided(plan: Plan, verdict: Verdict, findings: dict[str, Finding], decision: Decision,
             standby: native.Standby | None, setup: tuple[WitnessOptions, output.RunLog] | None) -> int:
    verdict.notes = tuple(decision.notes)
    try:
        mode = decision.chosen()
    except Refusal as e:
        verdict.refused(e)
        for n in decision.notes:
            verdict.say(f"note: {n}")
        _markdown_refusal(plan, verdict)
        if setup is not None:
            setup[1].finish(EXIT_UNAVAILABLE)  # made for the witness run that was not: empty, removed
        return verdict.done(EXIT_UNAVAILABLE)

    verdict.mode = str(mode)
    for r in decision.reasons:
        verdict.say(f"mode {mode}: {r}")
    for n in decision.notes:
        verdict.say(f"note: {n}")

    options, log = setup if setup is not None else witness_setup(plan.options)
    # On a terminal only: the run's start, heartbeat and end (runners/progress.py). The one Progress
    # goes down to the modes, whose long steps (image build, boot, set-up, each leg) are its stages.
    progress = Progress(PROG)
    stage = progress.begin(f"{mode} run", heartbeat=HEARTBEAT)
    reports = LegReports(options)
    context = Context(options, rerun_argv(plan), plan.timeout, findings, verdict.say, progress,
                      standby=standby, delegate=decision.delegate, image=plan.image,
                      base_image=plan.base_image, leg_report=reports)
    try:
        code = MODES[mode](context)
    except Refusal as e:
        verdict.refused(e)
        code = EXIT_UNAVAILABLE
    verdict.legs = tuple(reports.legs)
    stage.end(VERDICT_WORDS.get(code, "ERROR"))
    for kept in log.finish(code):
        verdict.say(f"pytest's report: {kept}")
    _markdown_refusal(plan, verdict, code)
    return verdict.done(code)


def _markdown_refusal(plan: Plan, verdict: Verdict, code: int = EXIT_UNAVAILABLE) -> None:
    """With --format markdown, the run's own refusal on stdout, to paste into a merge request (the
    lines on stderr stay). A witness run that refused printed its own."""
    if plan.markdown and code == EXIT_UNAVAILABLE and verdict.reason is not None:
        text = refusal_markdown(PROG, verdict.reason, because=verdict.because,
                                ways_on=verdict.ways_on, notes=verdict.notes)
        print("\n".join(text), flush=True)
