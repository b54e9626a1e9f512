"""Run one tier for mr-check through the runner, so the same modes and the same refusals apply.

- witness / cgroup tiers: `sandbox-conformance run [--mode M] [witness options] [-- pytest args]` as a
  subprocess; its exit code is the contract (0 green, 1 red, 2 bad input, 75 did not run), and the
  document it writes for `--verdict-json` (runners/run_verdict.py; here through its environment form)
  gives the verdict line, the refusal's reason and ways on (the handover's "why"), and each witness
  run's promise rows and summary line (a red tier's failures): read as data, never parsed from its
  prose while there is a document to read.
  The runner is our own child: on a cancellation it gets SIGTERM and stops in order
  (docs/cancellation.md), and SIGTERM is also its parent-death signal if mr-check is SIGKILLed.
- command tiers: the runner's own decision (`runners.decide.decide` over the same probes `run`
  collects) gates the user's command; a refusal there is a refusal here. The command then runs on
  this host from the repository root: `--mode container|vm` says where the runner puts the witness
  suite, so it does not apply to a command tier (gated under auto instead).
- a tier's `prepare` runs first, from the repository root; its failure is the tier's failure.

Every command printed for a tier (display_command) is the one that runs, prepare included.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
import re
import shlex
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypedDict

from sandbox_conformance.conformance.render import SAID_BELOW, grouped
from sandbox_conformance.mrcheck.config import Tier, TierKind
from sandbox_conformance.probes.finding import Finding
from sandbox_conformance.processes import cancel, owner
from sandbox_conformance.processes.children import Completed, Runner, run
from sandbox_conformance.processes.exits import EXIT_FAIL, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from sandbox_conformance.runners import run_verdict
from sandbox_conformance.runners.run_verdict import Leg, RunVerdict

PROG = "sandbox-conformance"
# The scratch directory a runner tier's verdict document is written to, with the owner's stamp so a
# SIGKILLed mr-check's is swept by the next run (processes/owner.py: `sbxc-KIND.` + the stamp).
SCRATCH_PREFIX = "sbxc-mr-check."
MODE_ENV = "SANDBOX_CONFORMANCE_MODE"  # commands/run.py reads the same variable
TAIL_LINES = 20
FAILURE_LINES = 30   # promise lines kept for a red tier; the rest are counted
LINE_CHARS = 400     # a BROKEN line quotes what the task saw, which can be long

# pytest selection of the cgroup witnesses inside the witness suite (each is marked `cgroup`,
# conformance/witnesses/limits.py). None would mean a suite without cgroup witnesses: a `cgroup` tier
# then refuses instead of running a suite that would not test what the tier promises, because
# mr-check never reports green for a tier that did not run.
CGROUP_SELECTION: tuple[str, ...] = ("-m", "cgroup")


class TierOutcome(enum.StrEnum):
    passed = "PASS"
    failed = "FAIL"       # the tier ran and went red
    error = "ERROR"       # the tier started but gave no verdict (timeout, harness error, odd exit)
    refused = "REFUSED"   # the tier could not run here: handover
    usage = "USAGE"       # the runner rejected the tier's options (bad profile path...): fix the config

    @property
    def exit_code(self) -> int:
        return {TierOutcome.passed: EXIT_OK, TierOutcome.failed: EXIT_FAIL, TierOutcome.error: EXIT_FAIL,
                TierOutcome.refused: EXIT_UNAVAILABLE, TierOutcome.usage: EXIT_USAGE}[self]


@dataclasses.dataclass(frozen=True)
class TierResult:
    outcome: TierOutcome
    reason: str                         # one line
    ways_on: tuple[str, ...] = ()
    runner_verdict: str | None = None   # the runner's last verdict line, verbatim
    exit_code: int | None = None        # of the runner or the command; None: killed on timeout
    seconds: float = 0.0
    output_tail: tuple[str, ...] = ()   # last lines of stdout+stderr, for a red or odd run
    failures: tuple[str, ...] = ()      # harness errors, then the promises that went BROKEN
    why: str = ""                       # a refusal in plain words, for the handover (no probe internals)

    @property
    def plain_why(self) -> str:
        return self.why or plain_words(self.reason)


_PARENTHESES = re.compile(r"\s*\([^()]*\)")
# `cgroup.delegation: unsupported: ...`: a probe's id and verdict, then its evidence (paths, files).
_PROBE_DETAIL = re.compile(r"[\s:;,]*\b[a-z_]+(?:\.[a-z_]+)*: (?:supported|denied|unsupported|detected|"
                           r"not_detected|unknown)\b.*$")


def plain_words(reason: str) -> str:
    """A refusal reason without its evidence: parenthesised details and `probe: verdict: ...` tails
    go (they are what `sandbox-conformance probe` shows), the sentence stays."""
    text = reason
    while (shorter := _PARENTHESES.sub("", text)) != text:
        text = shorter
    return _PROBE_DETAIL.sub("", text).strip(" :;,.") or reason


def runner_args(tier: Tier, mode: str | None) -> list[str]:
    """The arguments after `sandbox-conformance` that run a witness or cgroup tier."""
    args = ["run"]
    if mode:
        args += ["--mode", mode]
    if tier.profile:
        args += ["--profile", tier.profile]
    if tier.launcher:
        args += ["--launcher", tier.launcher]
    if tier.as_user:
        args += ["--as-user", tier.as_user]
    if tier.expected_skips:
        args += ["--expected-skips", tier.expected_skips]
    # A cgroup tier that only skipped would be green having tested nothing: always under --require,
    # so a mode whose set-up step proved no cgroup root is red, never a pass.
    if tier.require or tier.kind is TierKind.cgroup:
        args.append("--require")
    selection = CGROUP_SELECTION if tier.kind is TierKind.cgroup else ()
    pytest_args = [*selection, *tier.pytest_args]
    if pytest_args:
        args += ["--", *pytest_args]
    return args


def display_command(tier: Tier, mode: str | None) -> str:
    """The exact command a person runs from the repository root to run this tier, prepare first.

    The mode applies to witness and cgroup tiers only: a command tier always runs on this host."""
    if tier.kind is TierKind.command:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in tier.env.items())
        cmd = (env + " " if env else "") + shlex.join(tier.argv)
    else:
        args = runner_args(tier, mode)
        words = [shlex.quote(a) for a in (PROG, *args)]
        if tier.launcher_shown is not None:
            # `--launcher "$PWD/launch.sh"`: the word the shell expands to exactly what ran, from the root.
            words[1 + args.index("--launcher") + 1] = tier.launcher_shown
        cmd = " ".join(words)
    return f"{shlex.join(tier.prepare)} && {cmd}" if tier.prepare else cmd


def effective_mode(mode: str | None, environ: Mapping[str, str]) -> str | None:
    """The mode the runner will use: --mode, else the environment's, else None (auto)."""
    return mode or environ.get(MODE_ENV) or None


def runner_env(verdict_file: Path | None = None) -> dict[str, str]:
    """The environment for the runner: ours, unfiltered, plus where it writes its verdict document.

    Unlike a probe, the runner must see everything the user set: SANDBOX_CONFORMANCE_* (mode,
    deployment signature, cgroup root), DOCKER_HOST, XDG_RUNTIME_DIR. Filtering them would hide a
    deployment signature from the guard, the false negative the guard exists to prevent. The runner
    builds minimal environments for what it launches itself."""
    env = dict(os.environ)
    # Our own packages must be importable from the tier's working directory (the user's repository)
    # even when sandbox-conformance runs from a checkout rather than an installed distribution.
    here = str(Path(__file__).resolve().parent.parent)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if here not in parts:
        env["PYTHONPATH"] = os.pathsep.join([here, *parts])
    # The environment form of --verdict-json: a scratch file of ours, read back for the tier's result.
    # Not in the argv: it changes nothing the run checks (the printed command is the same), and a
    # sweep kills a process whose command line names a dead owner's directory (processes/owner.py), which
    # a runner outliving a SIGKILLed mr-check by its orderly stop would be.
    env.pop(run_verdict.ENV, None)
    if verdict_file is not None:
        env[run_verdict.ENV] = str(verdict_file)
    return env


def runner_argv(tier: Tier, mode: str | None) -> list[str]:
    # -P: do not put the working directory (the user's repository) first on sys.path, so a
    # top-level `runners` or `probes` package of theirs cannot shadow ours (python(1), 3.11+).
    return [sys.executable, "-P", "-m", "sandbox_conformance", *runner_args(tier, mode)]


_TEST_ID = re.compile(r"^(?:ERROR|FAILED) \S+::\S+")
_BROKEN = re.compile(r": BROKEN(?::|$)")
HARNESS = "harness error: "


def _lines(done: Completed) -> list[str]:
    return done.stdout.splitlines() + done.stderr.splitlines()


def leg_failures(legs: Sequence[Leg]) -> tuple[str, ...]:
    """The reason a witness run went red, first, from the legs of its verdict document: each harness
    error once (with how many promises it left untested), then every promise row that says BROKEN,
    then the last leg's summary line. The same lines `failure_lines` finds in the witness's stdout
    for the same run (tests/test_mr_check.py holds the two to each other), without reading it."""
    harness: dict[str, int] = {}
    broken: dict[str, None] = {}
    for leg in legs:
        # The witness prints a row whose detail is one of its problems as render.SAID_BELOW and the
        # problem once after the table (render.said_once): those rows count for that problem.
        said_below = set(leg.problems)
        below = 0
        for label, verdict, detail in grouped(leg.promises):  # the order the table prints them in
            if detail in said_below:
                below += 1
            elif (i := detail.find(HARNESS)) != -1:
                harness[detail[i:]] = harness.get(detail[i:], 0) + 1
            elif verdict == "BROKEN":
                broken[f"{label}: BROKEN" + (f": {detail}" if detail else "")] = None
        for problem in leg.problems:
            if problem.startswith(HARNESS):
                harness[problem] = harness.get(problem, 0) + below
                below = 0
    return _failures(harness, broken, legs[-1].summary if legs else None)


def failure_lines(lines: Iterable[str]) -> tuple[str, ...]:
    """What `leg_failures` says, found in the witness command's own stdout lines (commands/witness.py;
    the `lines` form, conformance/render.py): each harness error once (with how many promises it left
    untested), then every promise line that says BROKEN, then the witness summary line. pytest's
    report around them (ids, warnings) says less and comes last, in the tail.

    Only the fallback, for a run that left no verdict document with legs: a tier whose runner died
    before writing one, or timed out, or whose witness wrote no report (it crashed, or refused). A
    tier's run is otherwise asked for its verdict document, which carries each witness run's rows and
    summary line from a scratch `--json` report of the run's own (runners/orchestrate.py)."""
    harness: dict[str, int] = {}
    broken: dict[str, None] = {}
    summary = None
    below = 0  # rows that point to the failure printed once after the table (render.SAID_BELOW)
    for line in lines:
        if line.startswith("witness: ") and " BROKEN, " in line:
            summary = line
        elif line.endswith(SAID_BELOW):
            below += 1
        elif (i := line.find(HARNESS)) != -1:
            text = line[i:]
            harness[text] = harness.get(text, 0) + (1 if i > 0 else below)
            below = 0
        elif _BROKEN.search(line):
            broken[line] = None
    return _failures(harness, broken, summary)


def _failures(harness: Mapping[str, int], broken: Iterable[str], summary: str | None) -> tuple[str, ...]:
    """The failure lines: harness errors with their counts, BROKEN rows (at most FAILURE_LINES, the
    rest counted), then the summary line when there is anything above it; each clipped."""
    out = [h + (f" ({n} promise{'s' if n != 1 else ''} not tested because of it)" if n else "")
           for h, n in harness.items()]
    out += list(broken)
    if len(out) > FAILURE_LINES:
        out = [*out[:FAILURE_LINES], f"... and {len(out) - FAILURE_LINES} more"]
    if out and summary:
        out.append(summary)
    return tuple(_clip(x) for x in out)


def _clip(line: str) -> str:
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS - 3] + "..."


def _denoise(lines: Iterable[str], *, drop_ids: bool) -> list[str]:
    """pytest's warnings summary, blank lines and (when the failures say it better) test ids go."""
    out: list[str] = []
    in_warnings = False
    for line in lines:
        if line.startswith("=") and "warnings summary" in line:
            in_warnings = True
            continue
        if in_warnings:
            if line.startswith("-- Docs:"):
                in_warnings = False
            if not line.startswith("="):
                continue
            in_warnings = False
        if line.strip() and not (drop_ids and _TEST_ID.match(line)):
            out.append(line)
    return out


class _Report(TypedDict):
    """TierResult's fields for a run that did not pass, passed on as keywords."""
    failures: tuple[str, ...]
    output_tail: tuple[str, ...]


class _Common(TypedDict, total=False):
    """TierResult's fields every outcome of one run shares, passed on as keywords."""
    runner_verdict: str | None
    exit_code: int | None
    seconds: float


def _report(done: Completed, doc: RunVerdict | None = None) -> _Report:
    """failures and output_tail for a run that did not pass: failures lead, the tail repeats none.
    The failures come from the verdict document's legs, or from the output when it has none."""
    lines = _lines(done)
    failures = leg_failures(doc.legs) if doc is not None and doc.legs else failure_lines(lines)
    shown = set(failures)
    tail = [ln for ln in _denoise(lines, drop_ids=bool(failures)) if _clip(ln) not in shown]
    # Behind the failures, pytest's last lines (counts, skips, the verdict) are enough.
    keep = TAIL_LINES // 4 if failures else TAIL_LINES
    return {"failures": failures, "output_tail": tuple(_clip(x) for x in tail[-keep:])}


def classify_runner(done: Completed, doc: RunVerdict | None) -> TierResult:
    """Pure: the runner's Completed and its verdict document (None when it wrote none: it died, or
    timed out, before its end) -> the tier's result. The exit code decides; the document says why.
    Anything but exit 0 is not green, whatever a document says; one whose exit is not the runner's
    (it was killed after writing it) is not read at all."""
    if doc is not None and doc.exit != done.returncode:
        doc = None
    reason = doc.reason if doc is not None else None
    ways = doc.ways_on if doc is not None else ()
    verdict = doc.line if doc is not None else None
    common: _Common = {"runner_verdict": verdict, "exit_code": done.returncode, "seconds": done.seconds}
    if done.timed_out:
        return TierResult(TierOutcome.error, f"the runner timed out after {done.seconds:.0f}s and was killed",
                          **_report(done, doc), **common)
    if done.not_found:
        return TierResult(TierOutcome.refused, f"could not start the runner: {done.stderr.strip()}", **common)
    last = done.stderr_tail(1) or f"exit {done.returncode}"
    match done.returncode:
        case 0:
            return TierResult(TierOutcome.passed, verdict or "the runner exited 0", **common)
        case 1:
            return TierResult(TierOutcome.failed, verdict or last, **_report(done, doc), **common)
        case 75:
            return TierResult(TierOutcome.refused, reason or last, ways, **common)
        case 2 if reason:
            return TierResult(TierOutcome.usage, f"the runner rejected the tier's options: {reason}",
                              **_report(done, doc), **common)
        case 2:
            return TierResult(TierOutcome.usage, f"the runner rejected the tier's options: {last}",
                              **_report(done, doc), **common)
        case _:
            return TierResult(TierOutcome.error, f"the runner exited {done.returncode}: {last}",
                              **_report(done, doc), **common)


# Every child of mr-check (the runner, a prepare step, a command tier) gets SIGTERM, not SIGKILL, as its
# parent-death signal: killed with SIGKILL, mr-check runs no handler, and a runner child told SIGTERM
# still stops in order (its witness child, container or VM, its layouts); the guardian SIGKILLs what
# is left after its grace (processes/guardian.py). On SIGTERM/SIGINT/SIGHUP, processes.children stops each
# group the same way: SIGTERM, processes.children.STOP_GRACE, SIGKILL.
run_child: Runner = functools.partial(run, die_with=signal.SIGTERM)

CgroupProbe = Callable[[], Finding]


def cgroup_delegation() -> Finding:
    """This host's cgroup.delegation finding: the probe the harness itself asks (conformance/harness.py)."""
    from sandbox_conformance.probes.collect import collect
    from sandbox_conformance.probes.host import Host

    [finding] = collect(Host(), only=["cgroup.delegation"])
    return finding


def cgroup_refusal(tier: Tier, mode: str | None, finding: Finding) -> TierResult | None:
    """PURE: a cgroup tier is handed over where its witnesses could only skip. Natively (auto, native)
    the tasks' leaves come from this host's delegated root, so without one nothing would be tested.
    A container or VM run proves its own root in its set-up step; there --require makes a skip red.
    `mode` is the effective one (--mode, else $SANDBOX_CONFORMANCE_MODE)."""
    if mode in ("container", "vm") or (finding.ok and finding.facts.get("root")):
        return None
    return TierResult(
        TierOutcome.refused,
        f"no usable cgroup root on this host, so the cgroup witnesses would only skip: "
        f"cgroup.delegation: {finding.verdict}: {finding.reason}",
        # The tier's own command under --mode vm: same profile, launcher and selection, so the way
        # on tests what the tier declares, not the reference profile.
        (f"{display_command(tier, 'vm')}  # a kernel under qemu with a pure cgroup v2 hierarchy",
         "set SANDBOX_CONFORMANCE_CGROUP_ROOT to a cgroup v2 subtree delegated to you (memory and pids "
         "enabled in its cgroup.subtree_control)"),
        why="this host has no cgroup v2 subtree delegated for the tests to put tasks in, so the cgroup "
            "witnesses could only skip")


def run_prepare(tier: Tier, root: Path, runner: Runner = run_child) -> TierResult | None:
    """The tier's prepare step, from the repository root, in the user's environment: None when it
    succeeded (or there is none), else the tier's result: red, with the step's output."""
    if not tier.prepare:
        return None
    done = runner(list(tier.prepare), timeout=tier.timeout, env=dict(os.environ), cwd=str(root))
    if done.ok:
        return None
    what = f"prepare `{shlex.join(tier.prepare)}`"
    common: _Common = {"exit_code": done.returncode, "seconds": done.seconds}
    report = _report(done)
    if done.timed_out:
        return TierResult(TierOutcome.error, f"{what} timed out after {done.seconds:.0f}s and was killed",
                          **common, **report)
    if done.not_found:
        return TierResult(TierOutcome.failed, f"{what} cannot start: {done.stderr.strip()}", **common,
                          **report)
    return TierResult(TierOutcome.failed, f"{what} exited {done.returncode}", **common, **report)


# --- command tiers -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Gate:
    """The runner's decision for this host, reduced to what a command tier needs."""
    mode: str | None            # "native" / "container"; None when refused
    reasons: tuple[str, ...]
    ways_on: tuple[str, ...] = ()


GateFn = Callable[[str | None], Gate]


@functools.lru_cache(maxsize=4)
def runner_gate(mode: str | None) -> Gate:
    """The one place a command tier asks the runner whether this host may run a sandbox.

    Calls the runner's pure decision over the same probes `sandbox-conformance run` collects, so a
    command tier is refused exactly where a witness tier would be (inside a sandbox, on a deployment
    host under auto, ...)."""
    from sandbox_conformance.probes.collect import collect
    from sandbox_conformance.probes.host import Host
    from sandbox_conformance.runners.decide import NEEDED, Mode, Request, decide

    wanted = mode or os.environ.get("SANDBOX_CONFORMANCE_MODE") or "auto"
    try:
        request_mode = Mode(wanted)
    except ValueError:
        return Gate(None, (f"unknown mode {wanted!r} (expected auto, native, container or vm)",))
    decision = decide(Request(mode=request_mode), collect(Host(), list(NEEDED)))
    if decision.refused:
        return Gate(None, decision.reasons, decision.ways_on)
    return Gate(str(decision.mode), decision.reasons)


def host_mode(mode: str | None, environ: Mapping[str, str]) -> str | None:
    """The mode a command tier is gated under. The user's command runs on this host whatever --mode
    says: container and vm choose where the runner puts the witness suite, and gating a command
    with them would refuse it for a reason that is not about this host. They fall back to auto, so
    the runner's guards (inside a sandbox, a deployment host) still apply; native means it."""
    wanted = effective_mode(mode, environ)
    return wanted if wanted in (None, "auto", "native") else "auto"


def command_env(tier: Tier) -> dict[str, str]:
    # The user's own command, run as if they had typed it: their environment, plus the tier's env.
    return {**os.environ, **tier.env}


def run_command_tier(tier: Tier, root: Path, mode: str | None, runner: Runner = run_child,
                     gate: GateFn = runner_gate) -> TierResult:
    g = gate(host_mode(mode, os.environ))
    if g.mode is None:
        reason = g.reasons[0] if g.reasons else "the runner refused"
        return TierResult(TierOutcome.refused, reason, g.ways_on)
    if g.mode != "native":
        # A command of the user's runs their sandbox on this host; a container decision means native
        # is not possible here (or was not asked for), so the command would test nothing we can vouch for.
        return TierResult(TierOutcome.refused,
                          f"the runner would only run in a {g.mode} here ({'; '.join(g.reasons)}), "
                          "and a command tier runs on this host",
                          ("run the command on a host where `sandbox-conformance run --print-mode` "
                           "says native",
                           "or --mode native to mean it here"),
                          why=f"the runner would only run in a {g.mode} here, and a command tier runs on "
                              "this host")
    failed = run_prepare(tier, root, runner)
    if failed is not None:
        return failed
    done = runner(tier.argv, timeout=tier.timeout, env=command_env(tier), cwd=str(root))
    return classify_command(done)


def classify_command(done: Completed) -> TierResult:
    common: _Common = {"exit_code": done.returncode, "seconds": done.seconds}
    if done.not_found:
        return TierResult(TierOutcome.refused,
                          f"the command cannot start on this host: {done.stderr.strip()}",
                          ("install what it needs, or run it where it is installed",), **common)
    if done.timed_out:
        return TierResult(TierOutcome.error,
                          f"the command timed out after {done.seconds:.0f}s and was killed",
                          **_report(done), **common)
    if done.returncode == 0:
        return TierResult(TierOutcome.passed, "the command exited 0", **common)
    return TierResult(TierOutcome.failed, f"the command exited {done.returncode}", **_report(done), **common)


def run_runner_tier(tier: Tier, root: Path, mode: str | None, runner: Runner = run_child,
                    cgroup_probe: CgroupProbe = cgroup_delegation, gate: GateFn = runner_gate) -> TierResult:
    if tier.kind is TierKind.cgroup:
        refused = cgroup_refusal(tier, effective_mode(mode, os.environ), cgroup_probe())
        if refused is not None:
            return refused
    if tier.prepare:
        # The runner decides only after prepare would have run: ask its decision first, so a prepare
        # step never runs where the runner refuses (inside a sandbox, on a deployment host).
        g = gate(mode)
        if g.mode is None:
            return TierResult(TierOutcome.refused, g.reasons[0] if g.reasons else "the runner refused",
                              g.ways_on)
    failed = run_prepare(tier, root, runner)
    if failed is not None:
        return failed
    owner.sweep_once()  # before our first stamped directory: what a SIGKILLed run left
    try:
        scratch = tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{owner.stamp()}.")
    except OSError:
        # No writable temp directory (a read-only host, as inside an agent's sandbox), so nowhere for
        # the runner's verdict document: its decision asked here says why it would refuse, and a run
        # past it is judged by its exit code and output alone.
        if not tier.prepare and (g := gate(mode)).mode is None:
            return TierResult(TierOutcome.refused, g.reasons[0] if g.reasons else "the runner refused",
                              g.ways_on)
        done = runner(runner_argv(tier, mode), timeout=tier.timeout, env=runner_env(), cwd=str(root))
        return classify_runner(done, None)
    with scratch:
        verdict_file = Path(scratch.name, "verdict.json")
        try:
            done = runner(runner_argv(tier, mode), timeout=tier.timeout, env=runner_env(verdict_file),
                          cwd=str(root))
        except cancel.Cancelled:
            # processes.children has stopped the runner (SIGTERM, grace, SIGKILL) before re-raising: say how
            # it ended, as `run` shows its witness child's line, before this command's own KILLED line.
            stopped = run_verdict.read(verdict_file)
            print(f"{PROG} mr-check: tier {tier.name}: "
                  + (stopped.line if stopped else "the runner ended without a verdict (killed)"),
                  file=sys.stderr, flush=True)
            raise
        return classify_runner(done, run_verdict.read(verdict_file))


def run_tier(tier: Tier, root: Path, mode: str | None, runner: Runner = run_child,
             gate: GateFn = runner_gate) -> TierResult:
    if tier.kind is TierKind.command:
        return run_command_tier(tier, root, mode, runner, gate)
    return run_runner_tier(tier, root, mode, runner, gate=gate)

