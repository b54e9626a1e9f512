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
import os
import pwd
import shutil
import signal
import sys
import time
from collections.abc import Mapping

from probes import cancel
from probes.collect import collect
from probes.finding import Finding
from probes.host import Host
from probes.run import run
from runners import container, native, vm_mode, witness_args
from runners.decide import NEEDED, Decision, Mode, Request, decide
from runners.errors import EXIT_DID_NOT_RUN, EXIT_FAIL, EXIT_OK, EXIT_USAGE, UsageError, check_writable

MODE_ENV = "SANDBOX_CONFORMANCE_MODE"
PRINT_MODE_ENV = "SANDBOX_CONFORMANCE_PRINT_MODE"
PROG = "sandbox-conformance run"

VERDICTS = {EXIT_OK: "PASS", EXIT_FAIL: "FAIL", EXIT_DID_NOT_RUN: "REFUSED", EXIT_USAGE: "ERROR"}


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
        if path is not None and not os.path.isfile(path):
            raise UsageError(f"{flag} {path}: no such file")
    if args.as_user is not None:
        if request.mode is Mode.container:
            raise UsageError("--as-user: container mode already runs the suite as root and as its own "
                             "unprivileged user")
        try:
            pwd.getpwnam(args.as_user)
        except KeyError:
            raise UsageError(f"--as-user: no such user {args.as_user!r}") from None
    if args.timeout <= 0:
        raise UsageError("--timeout: expected a positive number of seconds")
    for flag, value in (("--junitxml", args.junitxml), ("--json", args.json)):
        if value is not None and value != "-":
            # The witness command's own check, before anything is probed or launched here.
            check_writable(flag, value)


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
    probes/cancel.py, with the mode known at that moment)."""

    def __init__(self, requested: Mode) -> None:
        self.started = time.monotonic()
        self.mode = str(requested)

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        self._mode = mode
        cancel.set_label(mode)

    def done(self, code: int, word: str | None = None) -> int:
        word = word or VERDICTS.get(code, "ERROR")
        print(f"sandbox-conformance: {word} mode={self.mode} exit={code} "
              f"time={time.monotonic() - self.started:.1f}s", file=sys.stderr, flush=True)
        return code


def _say(line: str) -> None:
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def _witness_code(rc: int | None) -> int:
    """The witness command's code as ours: a crash or a timeout is a red run, never a pass."""
    if rc is None:
        _say("the witness suite timed out")
        return EXIT_FAIL
    if rc in (EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_DID_NOT_RUN):
        return rc
    _say(f"the witness suite exited {rc}")
    return EXIT_FAIL


def findings_for(host: Host) -> list[Finding]:
    return collect(host, only=NEEDED)


def main(args: argparse.Namespace) -> int:
    environ = os.environ
    requested = Mode(args.mode) if args.mode in [m.value for m in Mode] else Mode.auto
    verdict = _Verdict(requested)
    try:
        request, print_mode = _request(args, environ)
        verdict.mode = str(request.mode)
        _validate(args, request)
    except UsageError as e:
        _say(str(e))
        return verdict.done(EXIT_USAGE)

    findings = {f.probe: f for f in findings_for(Host())}
    decision = decide(request, findings)
    if print_mode:
        print("\n".join(render(decision, request.mode)), flush=True)
        return EXIT_DID_NOT_RUN if decision.refused else EXIT_OK

    if decision.refused:
        _say(f"refused: {decision.reason}")
        for r in decision.reasons[1:]:
            _say(f"  because: {r}")
        for w in decision.ways_on:
            _say(f"  way on: {w}")
        for n in decision.notes:
            _say(f"note: {n}")
        return verdict.done(EXIT_DID_NOT_RUN)

    assert decision.mode is not None
    verdict.mode = str(decision.mode)
    for r in decision.reasons:
        _say(f"mode {decision.mode}: {r}")
    for n in decision.notes:
        _say(f"note: {n}")

    options = witness_args.WitnessOptions.from_args(args)
    if decision.mode is Mode.vm:
        return verdict.done(vm_mode.run_vm(options, timeout=args.timeout, say=_say))
    if decision.mode is Mode.native:
        if decision.delegate:
            return verdict.done(_run_delegated(args))
        return verdict.done(_witness_code(native.run_native(options, timeout=args.timeout)))
    return verdict.done(_run_container(args, options, findings.get("container_engine")))


def _rerun_argv(args: argparse.Namespace) -> list[str]:
    """This run's own options, without --delegate, for the re-execution under systemd-run."""
    out = ["--mode", "native", "--timeout", str(args.timeout)]
    opts = witness_args.WitnessOptions.from_args(args)
    return out + opts.argv()


def _run_delegated(args: argparse.Namespace) -> int:
    systemd_run = shutil.which("systemd-run")
    if systemd_run is None:  # the probe found it a moment ago; say so rather than crash
        _say("refused: systemd-run disappeared since the probe")
        return EXIT_DID_NOT_RUN
    argv = native.delegate_argv(_rerun_argv(args), systemd_run=systemd_run)
    _say("re-executing under " + " ".join(argv[:6]))
    # The user manager is found through XDG_RUNTIME_DIR / DBUS_SESSION_BUS_ADDRESS: pass ours on.
    # SIGTERM if we die: systemd-run then stops the transient unit it waits for (not tested here: no
    # systemd on the machine this was written on).
    return _witness_code(run(argv, timeout=args.timeout + 60, env=dict(os.environ), capture=False,
                             die_with=signal.SIGTERM).returncode)


def _run_container(args: argparse.Namespace, options: witness_args.WitnessOptions,
                   engine_finding: Finding | None) -> int:
    engine = container.Engine.from_facts(engine_finding.facts if engine_finding else {}, os.environ)
    try:
        image = args.image
        if image is None:
            if not (container.REPO / "Dockerfile").is_file():
                raise container.ContainerError(f"no Dockerfile at {container.REPO}: container mode needs the "
                                               "checkout (or --image NAME)")
            _say(f"container: building {container.DEFAULT_TAG} with {engine.kind} "
                 f"(BASE={args.base_image or 'the Dockerfile default'})")
            image = container.build_image(engine, tag=container.DEFAULT_TAG, base=args.base_image,
                                          timeout=1800)
        legs = container.run_container(engine, options, image=image, timeout=args.timeout, say=_say)
    except container.ContainerError as e:
        _say(f"refused: {e}")
        return EXIT_DID_NOT_RUN
    for leg in legs:
        _say(f"container: as {leg.label}: {VERDICTS.get(_witness_code(leg.returncode), 'ERROR')}")
    return container.combine(legs)
