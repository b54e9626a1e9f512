"""`sandbox-conformance run`: decide native or container mode, run the witness suite there, or refuse.

`run [--mode auto|native|container] [--print-mode] [--delegate] [witness options] [-- pytest args]`;
SANDBOX_CONFORMANCE_MODE and SANDBOX_CONFORMANCE_PRINT_MODE=1 are the environment forms.

Exit 0 green, 1 the suite went red, 2 usage or input error, 75 did not run. Every run ends with one
verdict line on stderr, `sandbox-conformance: PASS mode=native exit=0 time=3.1s` (or REFUSED, FAIL,
ERROR, or KILLED-SIGTERM with exit 143 for a run stopped by a signal: docs/cancellation.md), so a run
read through a pipe still says how it went. `--print-mode` prints the mode and its
reasons on stdout and runs nothing (exit 0, or 75 when the decision is a refusal)."""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sandbox_conformance.conformance import output
from sandbox_conformance.conformance.render import Format, refusal_markdown
from sandbox_conformance.probes.collect import collect
from sandbox_conformance.probes.finding import Finding
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes import cancel, inputs, outputs
from sandbox_conformance.processes.exits import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    VERDICT_WORDS,
    UsageError,
    check_seconds,
    group_problem,
)
from sandbox_conformance.processes.run import run
from sandbox_conformance.runners import native, run_verdict, witness_args
from sandbox_conformance.runners.decide import NEEDED, Decision, Mode, Request, decide
from sandbox_conformance.runners.progress import HEARTBEAT, Progress

MODE_ENV = "SANDBOX_CONFORMANCE_MODE"
PRINT_MODE_ENV = "SANDBOX_CONFORMANCE_PRINT_MODE"
PROG = "sandbox-conformance run"



def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=[m.value for m in Mode], default=None,
                   help=f"where to run the suite (default: ${MODE_ENV} or auto)")
    p.add_argument("--print-mode", action="store_true", default=None,
                   help=f"print the resolved mode and its reasons, run nothing (or {PRINT_MODE_ENV}=1)")
    p.add_argument("--delegate", action="store_true",
                   help="native: re-execute under `systemd-run --user -p Delegate=yes` for a cgroup subtree")
    p.add_argument("--image", metavar="NAME",
                   help="container: use this image instead of building the Dockerfile")
    p.add_argument("--base-image", metavar="NAME",
                   help="container: the Dockerfile's BASE build argument (e.g. an imported debootstrap)")
    p.add_argument("--timeout", type=float, default=1800.0, metavar="SECONDS",
                   help="per witness run (default 1800)")
    p.add_argument(run_verdict.FLAG, metavar="FILE", dest="verdict_json",
                   help="write how the run ended as JSON, refusals included: verdict, mode, exit, reason, "
                        f"ways on (or ${run_verdict.ENV}; docs/json-documents.md)")
    witness_args.add_arguments(p)


def _request(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[Request, bool]:
    raw = args.mode or environ.get(MODE_ENV) or "auto"
    try:
        mode = Mode(raw)
    except ValueError:
        raise UsageError(f"{MODE_ENV}={raw!r}: expected one of {', '.join(m.value for m in Mode)}") from None
    print_mode = bool(args.print_mode) or environ.get(PRINT_MODE_ENV, "") not in ("", "0")
    delegate = args.delegate and environ.get(native.DELEGATED_ENV, "") in ("", "0")
    return Request(mode, delegate), print_mode


def _validate(args: argparse.Namespace, request: Request) -> None:
    for flag, path in (("--profile", args.profile), ("--expected-skips", args.expected_skips)):
        if path is not None:
            try:
                inputs.read_bytes(path)  # a regular file within bounds (processes/inputs.py)
            except inputs.UnusableInput as e:
                raise UsageError(f"{flag} {path}: {e}") from None
    if args.as_user is not None:
        if request.mode is Mode.container:
            raise UsageError("--as-user: container mode already runs the suite as root and as its own "
                             "unprivileged user")
        try:
            user = pwd.getpwnam(args.as_user)
        except KeyError:
            raise UsageError(f"--as-user: no such user {args.as_user!r}") from None
        problem = group_problem(user)
        if problem:
            raise UsageError(f"--as-user {args.as_user}: {problem}")
    check_seconds("--timeout", args.timeout)
    if request.mode in (Mode.auto, Mode.native, Mode.container):
        # Where a native witness run makes its layouts, container mode its inputs and reports.
        outputs.check_temp_space()
    output.check_arguments(args)  # --format, -v, --log: the witness command's own rules
    witness_args.check(args)  # --only, --skip: known promise ids, none in both
    if args.verdict_json == "-":
        raise UsageError(f"{run_verdict.FLAG}: a file, not '-' (stdout carries the suite's own output)")
    for flag, value in (("--junitxml", args.junitxml), ("--json", args.json),
                        (run_verdict.FLAG, args.verdict_json)):
        if value is not None:
            # The witness command's own check, before anything is probed or launched here.
            outputs.check_target(flag, value, stdout_ok=flag == "--json")
    _check_distinct(args)


def _check_distinct(args: argparse.Namespace) -> None:
    """No output replaces an input or another output (processes/outputs.py)."""
    outputs.check_distinct(
        [("--json", args.json), ("--junitxml", args.junitxml), ("--log", args.log),
         (run_verdict.FLAG, args.verdict_json)],
        [("--profile", args.profile), ("--expected-skips", args.expected_skips),
         ("--launcher", outputs.launcher_file(args.launcher))],
    )


def render(decision: Decision, requested: Mode) -> list[str]:
    if decision.refused:
        lines = [f"mode: refused (requested {requested})", f"  reason: {decision.reason}"]
        lines += [f"  because: {r}" for r in decision.reasons[1:]]
        lines += [f"  way on: {w}" for w in decision.ways_on]
    else:
        lines = [f"mode: {decision.mode}" + (" (delegated)" if decision.delegate else "")]
        lines += [f"  why: {r}" for r in decision.reasons]
    lines += [f"  note: {n}" for n in decision.notes]
    return lines


class _Verdict:
    """Prints the one verdict line, whatever path the run leaves by (a cancelled run's is printed by
    processes/cancel.py, with the mode known at that moment), and writes the same as JSON for
    --verdict-json (runners/run_verdict.py), with the refusal's reason and ways on."""

    def __init__(self, requested: Mode, path: str | None = None) -> None:
        self.started = time.monotonic()
        self.requested = str(requested)
        self.mode = str(requested)
        self.path = path
        self.reason: str | None = None
        self.because: tuple[str, ...] = ()
        self.ways_on: tuple[str, ...] = ()
        self.notes: tuple[str, ...] = ()

    def say(self, line: str) -> None:
        """_say, for the modes: the first refusal said is the run's reason."""
        if self.reason is None and line.startswith("refused: "):
            self.reason = line.removeprefix("refused: ")
        _say(line)

    def refused(self, reason: str, ways_on: Sequence[str] = ()) -> None:
        self.say(f"refused: {reason}")
        for w in ways_on:
            self.say(f"  way on: {w}")
        self.ways_on += tuple(ways_on)

    def killed(self, exc: cancel.Cancelled) -> None:
        """A cancelled run's document; processes/cancel.py prints its line once the clean-up is done."""
        seconds = time.monotonic() - self.started
        word = f"KILLED-{exc.name}"
        self._write(word, exc.exit_code, seconds,
                    f"sandbox-conformance: {word} mode={self.mode} exit={exc.exit_code} time={seconds:.1f}s")

    def _write(self, word: str, code: int, seconds: float, line: str) -> None:
        if self.path is None:
            return
        doc = run_verdict.RunVerdict(word, self.mode, self.requested, code, seconds, line, self.reason,
                                     self.because, self.ways_on, self.notes)
        try:
            run_verdict.write(self.path, doc)
        except OSError as e:
            _say(f"{run_verdict.FLAG} {self.path}: not written: {e.strerror}")

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        self._mode = mode
        cancel.set_label(mode)

    def done(self, code: int, word: str | None = None) -> int:
        word = word or VERDICT_WORDS.get(code, "ERROR")
        if code == EXIT_UNAVAILABLE and self.reason is None:
            # The witness child refused on its own (its stderr is the user's, not ours to read).
            self.reason = "the witness command did not run: its own `refused:` line above says why"
        seconds = time.monotonic() - self.started
        line = f"sandbox-conformance: {word} mode={self.mode} exit={code} time={seconds:.1f}s"
        self._write(word, code, seconds, line)
        print(line, file=sys.stderr, flush=True)
        return code


def _say(line: str) -> None:
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def _witness_code(rc: int | None) -> int:
    """The witness command's code as ours: a crash or a timeout is a red run, never a pass."""
    if rc is None:
        _say("the witness suite timed out")
        return EXIT_FAIL
    if rc in (EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_UNAVAILABLE):
        return rc
    _say(f"the witness suite exited {rc}")
    return EXIT_FAIL


ENGINE = "container_engine"


def findings_for(host: Host, mode: Mode = Mode.auto) -> list[Finding]:
    """What `decide` reads. With --mode native, all but the container engine: the decision does not need
    it (decide reads it only to word a refusal inside a sandbox, which _main then asks for), and rootful
    `podman info` alone was ~0.3 s of the run's critical path (measured: 0.97 s with it, 0.69 s without)."""
    only = NEEDED if mode is not Mode.native else tuple(p for p in NEEDED if p != ENGINE)
    return collect(host, only=only)


def _writable(args: argparse.Namespace, value: str | None) -> str | None:
    """--verdict-json's FILE when it can be written (else _validate says why, and no document is)."""
    if value is None or value == "-":
        return None
    try:
        outputs.check_target(run_verdict.FLAG, value)
        _check_distinct(args)  # a document written onto an input would replace it, even to say why not
    except UsageError:
        return None
    return value


# A stop signal from the process's start (commands/__init__.py) to here is raised in main, once the
# verdict document can say how the run ended (commands/cli.py; processes/cancel.py begin).
BEGINS_ITSELF = True


def main(args: argparse.Namespace) -> int:
    requested = Mode(args.mode) if args.mode in [m.value for m in Mode] else Mode.auto
    if args.verdict_json is None:
        # The environment form (mr-check's: a path in our argv would be a dead owner's directory that
        # a sweep kills us for naming, processes/owner.py kill_naming); checked as the option is.
        args.verdict_json = os.environ.get(run_verdict.ENV) or None
    verdict = _Verdict(requested, _writable(args, args.verdict_json))
    try:
        cancel.begin()  # a signal since the process started (BEGINS_ITSELF)
        return _main(args, verdict)
    except cancel.Cancelled as e:
        verdict.killed(e)  # the document first: commands/cli.py's cancel.finish prints the line
        raise


def _main(args: argparse.Namespace, verdict: _Verdict) -> int:
    environ = os.environ
    try:
        request, print_mode = _request(args, environ)
        verdict.mode = str(request.mode)
        _validate(args, request)
    except UsageError as e:
        _say(str(e))
        verdict.reason = str(e)
        return verdict.done(EXIT_USAGE)

    with contextlib.ExitStack() as stack:
        standby: native.Standby | None = None
        setup: tuple[witness_args.WitnessOptions, output.RunLog] | None = None
        if not print_mode and request.mode in (Mode.auto, Mode.native) and not request.delegate:
            # The witness process starts now and waits for the decision (runners/native.py Standby):
            # its start-up overlaps the probes instead of following them.
            setup = _witness_setup(args)
            standby = stack.enter_context(native.Standby(setup[0], timeout=args.timeout,
                                                         witness_main=_witness_main))
        findings = {f.probe: f for f in findings_for(Host(), request.mode)}
        decision = decide(request, findings)
        if ENGINE not in findings and decision.mode is None:
            # Refused: the reason names what the engine is from here, so it is asked for after all.
            findings.update({f.probe: f for f in collect(Host(), only=(ENGINE,))})
            decision = decide(request, findings)
        if standby is not None and (decision.mode is not Mode.native or decision.delegate):
            standby.discard()
        return _decided(args, verdict, request, print_mode, findings, decision, standby, setup)


def _witness_main(values: dict[str, Any]) -> int:
    """The witness command, in the forked child runners/native.py Standby makes: its arguments as
    data (the options record and the pipe), never an argv parsed again."""
    from sandbox_conformance.commands import cli

    return cli.run_command(cli.witness_namespace(values))


def _witness_setup(args: argparse.Namespace) -> tuple[witness_args.WitnessOptions, output.RunLog]:
    """The witness options every mode passes on, and the run's log. pytest's report of every witness
    run goes to one log of ours unless -v or --log was given (conformance/output.py RunLog): removed
    when the run passes, named when it does not."""
    options = witness_args.WitnessOptions.from_args(args)
    log = output.RunLog.choose(verbose=options.verbose, log=options.log)
    if log.path is not None:
        options = options._replace(log=str(log.path))
    return options, log


def _decided(args: argparse.Namespace, verdict: _Verdict, request: Request, print_mode: bool,
             findings: dict[str, Finding], decision: Decision, standby: native.Standby | None,
             setup: tuple[witness_args.WitnessOptions, output.RunLog] | None) -> int:
    if print_mode:
        print("\n".join(render(decision, request.mode)), flush=True)
        return EXIT_UNAVAILABLE if decision.refused else EXIT_OK

    verdict.notes = tuple(decision.notes)
    if decision.refused:
        _say(f"refused: {decision.reason}")
        for r in decision.reasons[1:]:
            _say(f"  because: {r}")
        for w in decision.ways_on:
            _say(f"  way on: {w}")
        for n in decision.notes:
            _say(f"note: {n}")
        verdict.reason, verdict.because = decision.reason, tuple(decision.reasons[1:])
        verdict.ways_on = tuple(decision.ways_on)
        _markdown_refusal(args, verdict)
        if setup is not None:
            setup[1].finish(EXIT_UNAVAILABLE)  # made for the witness run that was not: empty, removed
        return verdict.done(EXIT_UNAVAILABLE)

    assert decision.mode is not None
    verdict.mode = str(decision.mode)
    for r in decision.reasons:
        _say(f"mode {decision.mode}: {r}")
    for n in decision.notes:
        _say(f"note: {n}")

    options, log = setup if setup is not None else _witness_setup(args)
    # On a terminal only: the run's start, heartbeat and end (runners/progress.py). The one Progress
    # goes down to the modes, whose long steps (image build, boot, set-up, each leg) are its stages.
    progress = Progress(PROG)
    stage = progress.begin(f"{decision.mode} run", heartbeat=HEARTBEAT)

    def ended(code: int) -> int:
        stage.end(VERDICT_WORDS.get(code, "ERROR"))
        for kept in log.finish(code):
            _say(f"pytest's report: {kept}")
        _markdown_refusal(args, verdict, code)
        return verdict.done(code)

    if decision.mode is Mode.vm:
        from sandbox_conformance.runners.vm import (
            mode as vm_mode,  # each mode's code is imported only when chosen
        )

        return ended(vm_mode.run_vm(options, timeout=args.timeout, say=verdict.say, progress=progress))
    if decision.mode is Mode.native:
        if decision.delegate:
            return ended(_run_delegated(args, say=verdict.say))
        assert standby is not None  # made for every request that can end native, delegation aside
        return ended(_witness_code(standby.go(findings.values())))
    return ended(_run_container(args, options, findings.get("container_engine"), verdict, progress))


def _markdown_refusal(args: argparse.Namespace, verdict: _Verdict, code: int = EXIT_UNAVAILABLE) -> None:
    """With --format markdown, the run's own refusal on stdout, to paste into a merge request (the
    lines on stderr stay). A witness run that refused printed its own."""
    if args.format == Format.markdown and code == EXIT_UNAVAILABLE and verdict.reason is not None:
        text = refusal_markdown(PROG, verdict.reason, because=verdict.because,
                                ways_on=verdict.ways_on, notes=verdict.notes)
        print("\n".join(text), flush=True)


def _rerun_argv(args: argparse.Namespace) -> list[str]:
    """This run's own options, without --delegate, for the re-execution under systemd-run."""
    out = ["--mode", "native", "--timeout", str(args.timeout)]
    opts = witness_args.WitnessOptions.from_args(args)
    return out + opts.argv()


def _run_delegated(args: argparse.Namespace, say: Callable[[str], None] = _say) -> int:
    systemd_run = shutil.which("systemd-run")
    if systemd_run is None:  # the probe found it a moment ago; say so rather than crash
        say("refused: systemd-run disappeared since the probe")
        return EXIT_UNAVAILABLE
    argv = native.delegate_argv(_rerun_argv(args), systemd_run=systemd_run)
    _say("re-executing under " + " ".join(argv[:6]))
    # The user manager is found through XDG_RUNTIME_DIR / DBUS_SESSION_BUS_ADDRESS: pass ours on.
    # SIGTERM if we die: systemd-run then stops the transient unit it waits for (not tested here: no
    # systemd on the machine this was written on).
    return _witness_code(run(argv, timeout=args.timeout + 60, env=dict(os.environ), capture=False,
                             die_with=signal.SIGTERM).returncode)


def _run_container(args: argparse.Namespace, options: witness_args.WitnessOptions,
                   engine_finding: Finding | None, verdict: _Verdict,
                   progress: Progress | None = None) -> int:
    from sandbox_conformance.runners import container

    engine = container.Engine.from_facts(engine_finding.facts if engine_finding else {}, os.environ)
    try:
        image = args.image or container.build_image(engine, base=args.base_image, say=_say, progress=progress)
        legs = container.run_container(engine, options, image=image, timeout=args.timeout, say=_say,
                                       progress=progress)
    except container.ContainerUnusable as e:
        verdict.refused(str(e), e.ways_on)
        return EXIT_UNAVAILABLE
    for leg in legs:
        _say(f"container: as {leg.label}: {VERDICT_WORDS.get(_witness_code(leg.returncode), 'ERROR')}")
    return container.combine(legs)
