"""The modes `run` can run the witness suite in, behind one interface: `MODES[mode](context) -> code`.

    code = MODES[decision.chosen()](context)    # runners/orchestrate.py

A mode starts the witness command where it runs (this host, through the standing-by child or
`systemd-run` for a delegated cgroup subtree; a container; a VM), waits for it and returns its exit
code as ours (0 green, 1 red, 2 bad input, 75 the witness itself did not run). A mode that cannot be
used here raises its Refusal (processes/exits.py) with the reason and the ways on; it never returns
75 for itself, and never prints a `refused:` line: runners/orchestrate.py says it, once, and writes it
into the verdict document. Each mode's own code is imported only when it is chosen (container mode's
engine, the VM's qemu), so a native run imports neither.

A new mode: a function here taking a Context, a line in MODES, and its Mode in runners/decide.py."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable, Mapping
from typing import NamedTuple

from sandbox_conformance.probes.finding import Finding
from sandbox_conformance.processes.children import run
from sandbox_conformance.processes.exits import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    VERDICT_WORDS,
    Refusal,
)
from sandbox_conformance.runners import native
from sandbox_conformance.runners.decide import Mode
from sandbox_conformance.runners.progress import Progress
from sandbox_conformance.runners.witness_args import WitnessOptions


def _unread(label: str, path: str) -> None:
    """Context.leg_report's default: no verdict document reads the legs."""


class Context(NamedTuple):
    """What a mode is given: the witness options it passes on, and what the run already knows."""

    options: WitnessOptions  # as the witness command takes them, the run's log included
    rerun: list[str]  # native, delegated: this run's own arguments for the run under systemd-run
    timeout: float  # per witness run
    findings: Mapping[str, Finding]  # probed once by the run: never probed again here
    say: Callable[[str], None]  # one line of the run's, on stderr
    progress: Progress  # the run's one Progress: a mode's long steps are its stages
    standby: native.Standby | None = None  # native: the witness process waiting for the word to go
    delegate: bool = False  # native: under `systemd-run --user -p Delegate=yes`
    image: str | None = None  # container: the image to use instead of building the Dockerfile
    base_image: str | None = None  # container: the Dockerfile's BASE
    # (label, path) of each witness run's JSON report once it is on this host, for the verdict
    # document's legs (runners/orchestrate.py LegReports): native's one, a container's or VM's each.
    leg_report: Callable[[str, str], None] = _unread


Run = Callable[[Context], int]


def witness_code(rc: int | None, say: Callable[[str], None]) -> int:
    """The witness command's code as ours: a crash or a timeout is a red run, never a pass."""
    if rc is None:
        say("the witness suite timed out")
        return EXIT_FAIL
    if rc in (EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_UNAVAILABLE):
        return rc
    say(f"the witness suite exited {rc}")
    return EXIT_FAIL


NATIVE_LEG = "native"  # the label of native mode's one witness run


def run_native(ctx: Context) -> int:
    if ctx.delegate:
        code = _run_delegated(ctx)
    else:
        assert ctx.standby is not None  # made for every request that can end native, delegation aside
        code = witness_code(ctx.standby.go(ctx.findings.values()), ctx.say)
    # Delegated too: the run under systemd-run gives its witness the same --json (rerun_argv).
    report = ctx.options.json
    if report is not None and report != "-":
        ctx.leg_report(NATIVE_LEG, report)
    return code


def _run_delegated(ctx: Context) -> int:
    systemd_run = shutil.which("systemd-run")
    if systemd_run is None:  # the probe found it a moment ago; say so rather than crash
        raise Refusal("systemd-run disappeared since the probe")
    argv = native.delegate_argv(ctx.rerun, systemd_run=systemd_run)
    ctx.say("re-executing under " + " ".join(argv[:6]))
    # The user manager is found through XDG_RUNTIME_DIR / DBUS_SESSION_BUS_ADDRESS: pass ours on.
    # SIGTERM if we die: systemd-run then stops the transient unit it waits for (not tested here: no
    # systemd on the machine this was written on).
    return witness_code(run(argv, timeout=ctx.timeout + 60, env=dict(os.environ), capture=False,
                            die_with=signal.SIGTERM).returncode, ctx.say)


def run_container(ctx: Context) -> int:
    from sandbox_conformance.runners import container

    engine_finding = ctx.findings.get("container_engine")
    engine = container.Engine.from_facts(engine_finding.facts if engine_finding else {}, os.environ)
    # ContainerUnusable (a build, a start, an install that failed) is a Refusal: it goes up as it is.
    image = ctx.image or container.build_image(engine, base=ctx.base_image, say=ctx.say,
                                               progress=ctx.progress)
    legs = container.run_container(engine, ctx.options, image=image, timeout=ctx.timeout, say=ctx.say,
                                   progress=ctx.progress)
    for leg in legs:
        word = VERDICT_WORDS.get(witness_code(leg.returncode, ctx.say), "ERROR")
        ctx.say(f"container: as {leg.label}: {word}")
        if leg.report is not None:
            ctx.leg_report(leg.label, leg.report)
    return container.combine(legs)


def run_vm(ctx: Context) -> int:
    from sandbox_conformance.runners.vm import mode as vm_mode

    return vm_mode.run_vm(ctx.options, timeout=ctx.timeout, say=ctx.say, progress=ctx.progress,
                          leg_report=ctx.leg_report)


MODES: dict[Mode, Run] = {Mode.native: run_native, Mode.container: run_container, Mode.vm: run_vm}
