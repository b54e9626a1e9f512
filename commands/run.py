"""`sandbox-conformance run`: decide native or container mode, run the witness suite there, or refuse.

This module parses and checks the options (exit 2 before any work) and hands them down as one value to
runners/orchestrate.py, which probes, decides, runs the mode (runners/modes.py) and ends with the
verdict.

`run [--mode auto|native|container] [--print-mode] [--delegate] [witness options] [-- pytest args]`;
SANDBOX_CONFORMANCE_MODE and SANDBOX_CONFORMANCE_PRINT_MODE=1 are the environment forms.

Exit 0 green, 1 the suite went red, 2 usage or input error, 75 did not run. Every run ends with one
verdict line on stderr, `sandbox-conformance: PASS mode=native exit=0 time=3.1s` (or REFUSED, FAIL,
ERROR, or KILLED-SIGTERM with exit 143 for a run stopped by a signal: docs/cancellation.md), so a run
read through a pipe still says how it went. `--print-mode` prints the mode and its
reasons on stdout and runs nothing (exit 0, or 75 when the decision is a refusal)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import Any

from sandbox_conformance.conformance import output
from sandbox_conformance.conformance.render import Format
from sandbox_conformance.processes import cancel, inputs, outputs
from sandbox_conformance.processes.exits import EXIT_USAGE, UsageError, check_as_user, check_seconds
from sandbox_conformance.runners import native, orchestrate, run_verdict, witness_args
from sandbox_conformance.runners.decide import Mode, Request

MODE_ENV = "SANDBOX_CONFORMANCE_MODE"
PRINT_MODE_ENV = "SANDBOX_CONFORMANCE_PRINT_MODE"
PROG = orchestrate.PROG



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
    if args.profile is not None or args.expected_skips is not None:
        # Read, and what they say in the witness command's words, before anything is probed: a mistake
        # in the profile is one line and exit 2 whatever the mode (the embedded profile is ours, and
        # tested).
        from sandbox_conformance.conformance import settings

        try:
            settings.check_named_files(args.profile, args.expected_skips)
        except settings.InvalidSettings as e:
            raise UsageError(str(e)) from None
    given = [flag for flag, value in (("--image", args.image), ("--base-image", args.base_image)) if value]
    if len(given) == 2:
        raise UsageError("--image and --base-image: one or the other (--base-image is what the Dockerfile "
                         "builds on, when no --image is given)")
    if given and request.mode in (Mode.native, Mode.vm):
        raise UsageError(f"{given[0]}: only container mode uses an image, and --mode {request.mode.value} "
                         "was asked for")
    if args.as_user is not None and request.mode is Mode.container:
        raise UsageError("--as-user: container mode already runs the suite as root and as its own "
                         "unprivileged user")
    check_as_user(args.as_user)  # the witness command's own check: root, a real user, its group
    check_seconds("--timeout", args.timeout)
    accel = os.environ.get("SANDBOX_CONFORMANCE_VM_ACCEL")
    if accel:
        from sandbox_conformance.runners.vm.qemu import Accel  # only then: qemu's module is not small

        if accel not in {a.value for a in Accel}:
            # Read by the VM mode only after probing and building its image: a typo said here instead.
            raise UsageError(f"SANDBOX_CONFORMANCE_VM_ACCEL={inputs.shown(accel)!r}: use "
                             f"{' or '.join(a.value for a in Accel)}")
    from sandbox_conformance.probes import deployment

    config = os.environ.get(deployment.ENV)
    if config is not None and (problem := deployment.check_config(config)):
        raise UsageError(f"{deployment.ENV}={inputs.shown(config)!r}: {problem}")
    if request.mode in (Mode.auto, Mode.native, Mode.container):
        # Where a native witness run makes its layouts, container mode its inputs and reports.
        outputs.check_temp_space()
    output.check_arguments(args)  # --format, -v, --log: the witness command's own rules
    witness_args.check(args)  # --only, --skip: known promise ids, none in both
    if args.verdict_json == "-":
        raise UsageError(f"{run_verdict.FLAG}: a file, not '-' (stdout carries the suite's own output)")
    _check_reports(args)


def _inputs(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """What no report may replace."""
    return [("--profile", args.profile), ("--expected-skips", args.expected_skips),
            ("--launcher", outputs.launcher_file(args.launcher))]


def _check_reports(args: argparse.Namespace) -> None:
    """The witness command's own check of its reports (processes/outputs.py check_reports), with the
    verdict document beside them, before anything is probed or launched here."""
    outputs.check_reports(
        [("--json", args.json, True), ("--junitxml", args.junitxml, False), ("--log", args.log, False),
         (run_verdict.FLAG, args.verdict_json, False)],
        _inputs(args),
    )


def _say(line: str) -> None:
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def _writable(args: argparse.Namespace, value: str | None) -> str | None:
    """--verdict-json's FILE when it can be written (else _validate says why, and no document is)."""
    if value is None or value == "-":
        return None
    try:
        outputs.check_target(run_verdict.FLAG, value)
        # A document written onto an input would replace it, even to say why not. Only its own
        # checks: a bad --json is a usage error the document is there to say.
        outputs.check_distinct(
            [("--json", args.json), ("--junitxml", args.junitxml), ("--log", args.log),
             (run_verdict.FLAG, value)],
            _inputs(args),
        )
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
    verdict = run_verdict.Verdict(str(requested), _writable(args, args.verdict_json), say=_say)
    try:
        cancel.begin()  # a signal since the process started (BEGINS_ITSELF)
        try:
            request, print_mode = _request(args, os.environ)
            verdict.mode = str(request.mode)
            _validate(args, request)
        except UsageError as e:
            _say(str(e))
            verdict.reason = str(e)
            return verdict.done(EXIT_USAGE)
        plan = orchestrate.Plan(request, print_mode, witness_args.WitnessOptions.from_args(args),
                                args.timeout, image=args.image, base_image=args.base_image,
                                markdown=args.format == Format.markdown, witness_main=_witness_main)
        return orchestrate.run(plan, verdict)
    except cancel.Cancelled as e:
        verdict.killed(e)  # the document first: commands/cli.py's cancel.finish prints the line
        raise


def _witness_main(values: dict[str, Any]) -> int:
    """The witness command, in the forked child runners/native.py Standby makes: its arguments as
    data (the options record and the pipe), never an argv parsed again."""
    from sandbox_conformance.commands import cli

    return cli.run_command(cli.witness_namespace(values))
