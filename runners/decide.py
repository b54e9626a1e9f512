"""Where may the witness suite run: a pure function of the request and the probe findings.

No I/O, no exit: `run_cmd` is the only place that turns a `Decision` into an exit code. Tested as a
table in tests/test_runner_decide.py.

The rules (issue 4):
- Inside a sandbox: refuse under EVERY mode, naming the boundary the probes really saw. Nothing opens
  this: the suite would go red on the outer sandbox rather than tell anything about the one under test.
- On a deployment host (signature matched, or configured but uncheckable): `auto` refuses and names
  both ways on (`--mode container`, `--mode native`); an explicit mode is the user meaning it.
- No signature configured: `auto` proceeds, with a note saying the guard had nothing to check.
- `auto` picks native when the host is Linux, bwrap passes every ladder rung the reference launcher
  needs (a user namespace with its maps, a network namespace, a pid namespace with a fresh /proc), we
  are not sandboxed and this is not a deployment host; else container when an engine is reachable;
  else it refuses naming what is missing, with the way on each probe's cause calls for (issue 12: a
  host limitation the probe knows is a refusal, never a red run).
- The platform probe's container detection is read: named in the reasons, and in a sandbox refusal
  as one of the signals. It alone never refuses (a privileged CI container runs native fine; the
  ladder says whether bwrap works in it).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.processes.exits import Refusal

# Where the deployment probe looks for a signature; said in the note when none is configured.
SIGNATURE_HINT = ("declare one in /etc/sandbox-conformance/deployment.toml, "
                  "~/.config/sandbox-conformance/deployment.toml or $SANDBOX_CONFORMANCE_DEPLOYMENT_CONFIG")

# The probe ids `decide` reads; run_cmd collects exactly these.
NEEDED: tuple[str, ...] = ("platform", "bwrap", "userns", "userns.map", "netns", "pidns.proc",
                           "disable_userns", "sandboxed", "deployment", "container_engine", "systemd_user",
                           "cgroup.delegation")

# The ladder rungs the reference launcher cannot start a task without (conformance/bwrap_argv.py:
# --unshare-user always, --unshare-net for network none, --unshare-pid with --proc /proc for a
# private pid namespace). `disable_userns` is not among them: the launcher passes --disable-userns
# only where that probe saw it work, and the nested-userns witness then skips with the probe's reason.
LAUNCHER_RUNGS: tuple[str, ...] = ("userns", "userns.map", "netns", "pidns.proc")

# The way on for each ladder cause (probes/classify.py Cause ids). Causes that name no host setting
# (unclassified, earlier_rung, timeout, trial_failed, not_effective) have none: the evidence is the way.
CAUSE_WAY_ON: Mapping[str, str] = {
    # Two shapes (docs/findings.md): the caller confined by a profile without `userns,` (upstream
    # mediation, 6.7+), and Ubuntu's restriction of unconfined callers (its own sysctl).
    "apparmor": "give the process that runs the suite (and bwrap) an AppArmor profile with `userns,`; "
                "on Ubuntu, where unconfined processes are restricted: "
                "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
    "unprivileged_userns_clone": "allow unprivileged user namespaces: "
                                 "sysctl -w kernel.unprivileged_userns_clone=1",
    "max_user_namespaces": "allow user namespaces: sysctl -w user.max_user_namespaces=15000",
    "seccomp": "in a container: --security-opt seccomp=unconfined --cap-add SYS_ADMIN (or --privileged)",
    "no_cap_sys_admin": "in a container: --cap-add SYS_ADMIN (or --privileged)",
    "masked_proc": "run where nothing is mounted over /proc contents (docker: --security-opt "
                   "systempaths=unconfined; or unmount the masks in this mount namespace)",
    "readonly_proc": "mount /proc read-write where the suite runs (in a container: drop its read-only /proc)",
    "readonly_proc_sys": "make /proc/sys writable where the suite runs (docker: --security-opt "
                         "systempaths=unconfined)",
    "hidepid": "remount /proc without hidepid",
    "nested": "run sandbox-conformance outside the sandbox that disabled nested user namespaces",
    "wsl1": "use WSL2 (WSL1 has no Linux namespaces)",
    "setuid_bwrap": "use a non-setuid bwrap with unprivileged user namespaces allowed",
    "nproc": "raise RLIMIT_NPROC (ulimit -u) or end some of this user's processes",
    "pids_max": "raise pids.max of this cgroup",
    "no_bwrap": "install bubblewrap (>= 0.8): apt-get install bubblewrap",
    "bwrap_too_old": "install bubblewrap >= 0.8",
    "no_kernel_userns": "boot a kernel built with CONFIG_USER_NS=y",
}

# bwrap >= 0.8 has --disable-userns (it sets user.max_user_namespaces=1 in the sandbox's user
# namespace, so a nested unshare(CLONE_NEWUSER) fails with ENOSPC); older sandboxes cannot have
# turned nesting off.
DISABLE_USERNS_SINCE = (0, 8)


class Mode(enum.StrEnum):
    auto = enum.auto()
    native = enum.auto()
    container = enum.auto()
    vm = enum.auto()  # issue 5: a Debian kernel under qemu with a pure cgroup v2 hierarchy (runners/vm/)


class Request(NamedTuple):
    """What the user asked of `run`: the input `decide` weighs against the probe findings."""

    mode: Mode = Mode.auto
    delegate: bool = False  # re-execute a native run under `systemd-run --user -p Delegate=yes`


class Decision(NamedTuple):
    """What `decide` answered for this host: a mode and why, or a refusal with its reason and the ways on;
    either way, the notes the run's output must carry."""

    mode: Mode | None  # native or container; None when refused
    reasons: tuple[str, ...]  # why this mode (or, when refused, the refusal: first line is the reason)
    ways_on: tuple[str, ...] = ()  # refused only: what the user can do
    notes: tuple[str, ...] = ()  # things the run's output must say (no signature, explicit override)
    delegate: bool = False  # native under systemd-run --user -p Delegate=yes

    @property
    def refused(self) -> bool:
        return self.mode is None

    @property
    def reason(self) -> str:
        return self.reasons[0] if self.reasons else ""

    def chosen(self) -> Mode:
        """The mode to run in; a refused decision raises its Refusal (processes/exits.py), the one shape
        a "did not run" leaves by: the reason, the further reasons as `because`, the ways on."""
        if self.mode is None:
            raise Refusal(self.reason, self.ways_on, because=self.reasons[1:])
        return self.mode


def _missing(probe: str) -> Finding:
    # A probe that did not report is `unknown`: never read as a pass.
    return Finding(probe, Verdict.unknown, "probe did not report")


def _refuse(reason: str, *, because: Sequence[str] = (), ways_on: Sequence[str] = (),
            notes: Sequence[str] = ()) -> Decision:
    return Decision(None, (reason, *because), tuple(ways_on), tuple(notes))


def _version(bwrap: Finding) -> tuple[int, ...] | None:
    vt = bwrap.facts.get("version_tuple")
    if not vt:
        return None
    try:
        return tuple(int(x) for x in vt)
    except (TypeError, ValueError):
        return None


def _container(plat: Finding) -> str | None:
    """"a docker container" when the platform probe detected one (its own weighing: a stray marker
    alone is a conflict, not a container), else None."""
    if plat.verdict is not Verdict.detected:
        return None
    return f"a {plat.facts.get('container') or 'container-other'} container"


def _engine_boundary(engine: Finding) -> str | None:
    """What the engine probe saw FROM HERE, as a boundary; None when the engine is reachable (then it
    is no boundary, and saying "unreachable" would be false)."""
    match engine.verdict:
        case Verdict.supported:
            return None
        case Verdict.denied:
            return "the container engine's socket refuses us from here"
        case Verdict.unsupported if not engine.facts.get("cli"):
            return "the container engine is unreachable from here (no docker or podman CLI on PATH)"
        case Verdict.unsupported:
            return "the container engine is unreachable from here (nothing listening)"
        case _:
            return "whether the container engine is reachable from here could not be told"


def _sandbox_boundary(by: Mapping[str, Finding]) -> tuple[str, list[str]]:
    """The refusal reason inside a sandbox, naming what the probes really saw, never a guess: which
    probe decided it (the sandboxed probe's signals, the platform probe's container), then each
    boundary that is really there."""
    sb, engine, userns, bwrap = by["sandboxed"], by["container_engine"], by["userns"], by["bwrap"]
    signals = [str(s) for s in sb.facts.get("signals", ())]
    container = _container(by["platform"])
    parts: list[str] = []
    because: list[str] = []
    engine_boundary = _engine_boundary(engine)
    if engine_boundary is not None:
        parts.append(engine_boundary)
    because.append(f"container_engine: {engine.verdict}: {engine.reason}")
    cause = userns.facts.get("cause")
    # A nesting signal explains a refused userns only when the probe named no other cause: under
    # Docker's default seccomp profile the filter refused it (tests/test_host_shape_lab.py), and
    # "nested user namespaces are refused" would send the reader after the wrong boundary.
    nested = (cause == "nested"
              or (userns.verdict is not Verdict.supported and cause in (None, "unclassified")
                  and any("nest" in s for s in signals)))
    version = _version(bwrap)
    old_bwrap = version is not None and version < DISABLE_USERNS_SINCE
    if nested:
        parts.append("nested user namespaces are refused")
        because.append(f"userns: {userns.verdict}: {userns.reason}")
    elif old_bwrap:
        # bwrap < 0.8 has no --disable-userns, so nesting is not switched off here; say so rather
        # than claim a boundary that is not there.
        parts.append(f"bwrap {bwrap.facts.get('version')} is older than 0.8, so this sandbox cannot "
                     "have disabled nesting, but the suite would still test the outer sandbox, "
                     "not the one under test")
    elif userns.verdict is not Verdict.supported:
        parts.append(f"user namespaces are {userns.verdict} here" + (f" ({cause})" if cause else ""))
        because.append(f"userns: {userns.verdict}: {userns.reason}")
    outer = "the suite would test the outer sandbox, not the one under test"
    boundary = " and ".join(parts) if parts else outer
    if engine_boundary is None:
        # Reachable, and still refused: the sandbox decided it, not the engine.
        boundary += (f" ({engine.facts.get('cli') or 'the container engine'} is reachable from here: "
                     f"the engine is no boundary, the sandbox is)")
    decided = [f"sandboxed probe: {', '.join(signals) or sb.verdict}"]
    if container:
        decided.append(f"platform probe: {container}")
        because.append(f"platform: {by['platform'].reason}")
    because.append(f"sandboxed: {sb.reason}")
    return (f"running inside a sandbox (decided by the {'; '.join(decided)}): {boundary}; nesting is not "
            f"supported under any --mode", because)


def _not_linux(plat: Finding) -> str | None:
    """Why this is not a Linux kernel native mode can use, or None.

    The platform probe's `os` is the distribution's PRETTY_NAME ("Debian GNU/Linux 12 (bookworm)");
    the kernel is Linux when it could read /proc/sys/kernel/osrelease. WSL1 is a syscall
    translation layer without the namespaces bwrap needs."""
    system = plat.facts.get("system")
    if system is not None and system != "Linux":
        return f"this is {system}"
    if not plat.facts.get("kernel"):
        return f"no Linux kernel found ({plat.facts.get('os') or plat.verdict}: {plat.reason})"
    if str(plat.facts.get("wsl")) == "1":
        return "WSL1 has no Linux namespaces"
    return None


def _known_elsewhere(plat: Finding) -> bool:
    """The platform probe found, positively, a kernel other than Linux's or WSL1: a sandboxed unknown
    there is the platform's (no /proc to read). A platform probe that could not tell (crashed, or
    still running at the probes' deadline: no facts at all) is not that, nor is a Linux without /proc."""
    system = plat.facts.get("system")
    return (system is not None and system != "Linux") or str(plat.facts.get("wsl")) == "1"


class Blocker(NamedTuple):
    """One thing that keeps auto from choosing native, and what would lift it (None: nothing we can
    name beyond the probe's evidence)."""

    probe: str  # the probe id that says so ("not_linux" for the platform's kernel check)
    short: str  # "pidns.proc: denied (masked_proc)", for the one-line reason
    line: str  # with the probe's reason, for a `because` line
    way_on: str | None = None


def _bwrap_way_on(bwrap: Finding) -> str | None:
    path = bwrap.facts.get("path")
    if bwrap.facts.get("executable") is False and path:
        return f"make {path} executable (chmod 0755 {path}) or reinstall bubblewrap"
    if bwrap.verdict is Verdict.unsupported and not path:
        return CAUSE_WAY_ON["no_bwrap"]
    return None


def _native_blockers(by: Mapping[str, Finding]) -> list[Blocker]:
    """What keeps auto from choosing native, one each (empty: native is fine)."""
    out: list[Blocker] = []
    not_linux = _not_linux(by["platform"])
    if not_linux:
        out.append(Blocker("platform", "not Linux", f"not Linux: {not_linux}", "run on Linux"))
    bwrap = by["bwrap"]
    if bwrap.verdict is not Verdict.supported:
        out.append(Blocker("bwrap", f"bwrap: {bwrap.verdict}", f"bwrap: {bwrap.verdict}: {bwrap.reason}",
                           _bwrap_way_on(bwrap)))
    for rung in LAUNCHER_RUNGS:
        f = by[rung]
        if f.verdict is not Verdict.supported:
            cause = f.facts.get("cause")
            short = f"{rung}: {f.verdict}" + (f" ({cause})" if cause else "")
            # A rung untried for want of a runnable bwrap: the bwrap blocker's way on is the one
            # (an installed bwrap with a broken mode needs chmod, not apt-get install).
            way = None if cause == "no_bwrap" and bwrap.verdict is not Verdict.supported \
                else CAUSE_WAY_ON.get(str(cause))
            out.append(Blocker(rung, short, f"{short}: {f.reason}", way))
    sb = by["sandboxed"]
    if sb.verdict is not Verdict.not_detected:
        out.append(Blocker("sandboxed", f"sandboxed: {sb.verdict}", f"sandboxed: {sb.verdict}: {sb.reason}"))
    return out


def _refusal_ways_on(blockers: Sequence[Blocker], engine: Finding) -> list[str]:
    """The ways on a probe's causes call for, each once, then the container alternative."""
    ways = [b.way_on for b in blockers if b.way_on]
    if not ways:
        ways = ["see `sandbox-conformance probe` for each blocker's evidence"]
    engine_way = ("make the container engine's socket usable (join its group, or a rootless engine) so "
                  "--mode container can run" if engine.verdict is Verdict.denied
                  else "or start docker/podman so --mode container can run")
    return [*dict.fromkeys(ways), engine_way]


def _engine_refusal(engine: Finding) -> str:
    if engine.verdict is Verdict.unsupported and not engine.facts.get("cli"):
        what = "no container engine CLI (docker or podman) on PATH"
    elif engine.verdict is Verdict.denied:
        what = "the container engine's socket refused us"
    else:
        what = "the container engine is not reachable"
    return f"{what} ({engine.verdict}: {engine.reason})"


def decide(request: Request, findings: Sequence[Finding] | Mapping[str, Finding]) -> Decision:
    by = dict(findings) if isinstance(findings, Mapping) else {f.probe: f for f in findings}
    by = {pid: by.get(pid) or _missing(pid) for pid in NEEDED}

    # 1. Inside a sandbox: no mode opens this.
    if by["sandboxed"].verdict is Verdict.detected:
        reason, because = _sandbox_boundary(by)
        ways = ["run sandbox-conformance on the host, outside the sandbox"]
        # A container that only lacks a setting has a way on of its own beside leaving it.
        if str(by["userns"].facts.get("cause")) in ("seccomp", "no_cap_sys_admin"):
            ways.append(CAUSE_WAY_ON[str(by["userns"].facts["cause"])])
        return _refuse(reason, because=because, ways_on=ways)

    # 2. The mode: what was asked for, or what auto finds; each may refuse.
    notes: list[str] = []
    # Could not tell whether we are inside a sandbox, on Linux: inside one that hands us an engine's
    # socket, a container would run outside it (step 1's rule). Auto picks nothing; a mode asked for
    # runs, saying so. Elsewhere (macOS, WSL1) there is no /proc to read: that unknown is the platform's.
    sb = by["sandboxed"]
    if sb.verdict is Verdict.unknown and not _known_elsewhere(by["platform"]):
        line = f"could not tell whether this runs inside a sandbox (sandboxed: unknown: {sb.reason})"
        if request.mode is Mode.auto:
            return _refuse(f"{line}; auto will not pick a mode here", ways_on=WAYS_ON_UNKNOWN_SANDBOX)
        notes.append(f"{line}; running because --mode {request.mode.value} was given")
    guard = _deployment(by["deployment"], notes)
    chosen = MODE_CHOOSERS[request.mode](by, guard, notes)
    if isinstance(chosen, Decision):
        return chosen
    resolved, reasons = chosen

    # 3. What the chosen mode still needs, and what it will not test here.
    if request.delegate:
        refused = _delegation_refused(by, resolved, reasons, notes)
        if refused is not None:
            return refused
    if resolved is Mode.native:
        notes += _native_notes(by, delegate=request.delegate)
    return Decision(resolved, tuple(reasons), (), tuple(notes), delegate=request.delegate)


class _Guard(NamedTuple):
    """What the deployment guard found: whether this counts as a deployment host, and the line that
    says so ("" when it does not)."""

    host: bool
    line: str


# A mode chosen: the mode and why, or the refusal.
_Chosen = tuple[Mode, list[str]] | Decision

WAYS_ON_UNKNOWN_SANDBOX = (
    "see `sandbox-conformance probe` for what the sandboxed probe could not read or run",
    "--mode native or --mode container: run here, knowing this is the host",
)
WAYS_ON_DEPLOYMENT = ("--mode container: run the suite in a privileged container on this host",
                      "--mode native: run it natively here, meaning it")


def _deployment(dep: Finding, notes: list[str]) -> _Guard:
    if dep.verdict is Verdict.detected:
        matches = ", ".join(str(m) for m in dep.facts.get("matches", ())) or dep.reason
        return _Guard(True, f"this is a deployment host (signature matched: {matches})")
    if dep.verdict is Verdict.not_detected:
        return _Guard(False, "")
    if dep.facts.get("configured") is False and not dep.facts.get("errors"):
        where = dep.facts.get("declare_at")
        hint = f"declare one at {where} (schema: README, 'The deployment guard')" if where else SIGNATURE_HINT
        notes.append(f"no deployment signature configured: the guard had nothing to check; {hint}")
        return _Guard(False, "")
    # Configured but an arm could not run, a malformed signature file, or the probe itself failed: the
    # dangerous answer is the false negative, so this counts as a deployment host under auto.
    return _Guard(True, f"the deployment signature could not be checked ({dep.reason})")


def _auto(by: Mapping[str, Finding], guard: _Guard, notes: list[str]) -> _Chosen:
    if guard.host:
        return _refuse(f"{guard.line}; auto will not pick a mode here", ways_on=WAYS_ON_DEPLOYMENT,
                       notes=notes)
    engine, plat = by["container_engine"], by["platform"]
    container = _container(plat)
    blockers = _native_blockers(by)
    if not blockers:
        reasons = ["auto: Linux, bwrap creates user, network and pid namespaces (with a fresh /proc) "
                   "here, not sandboxed, not a deployment host"]
        if container:
            reasons.append(f"inside {container} (platform: {plat.reason}): the suite tests bwrap as "
                           "this container lets it run")
        return Mode.native, reasons
    if engine.verdict is Verdict.supported:
        reasons = [f"auto: native is not possible here, and {engine.facts.get('cli') or 'the engine'} "
                   f"is reachable ({engine.reason})", *(f"native: {b.line}" for b in blockers)]
        if container:
            reasons.append(f"inside {container} (platform: {plat.reason}): the native blockers are "
                           "this container's limits")
        return Mode.container, reasons
    where = f", inside {container}" if container else ""
    return _refuse(f"auto found neither a native sandbox ({'; '.join(b.short for b in blockers)}) "
                   f"nor a reachable container engine{where}",
                   because=[*(f"native: {b.line}" for b in blockers),
                            *([f"platform: {plat.reason}"] if container else []),
                            f"container: {_engine_refusal(engine)}"],
                   ways_on=_refusal_ways_on(blockers, engine),
                   notes=notes)


def _native(by: Mapping[str, Finding], guard: _Guard, notes: list[str]) -> _Chosen:
    plat = by["platform"]
    not_linux = _not_linux(plat)
    if not_linux:
        return _refuse(f"native mode needs a Linux kernel: {not_linux}",
                       ways_on=["--mode container with docker or podman"], notes=notes)
    reasons = ["--mode native given"]
    container = _container(plat)
    if container:
        reasons.append(f"inside {container} (platform: {plat.reason})")
    if guard.line:
        notes.append(f"{guard.line}; running natively because --mode native was given")
    # The user means it; still say which known host limitation the reference launcher will meet, so a
    # red run is never a mystery.
    for b in _native_blockers(by):
        if b.probe in ("bwrap", *LAUNCHER_RUNGS):
            notes.append(f"--mode native given although {b.line}: the reference launcher's tasks "
                         "cannot start here")
    return Mode.native, reasons


def _vm(by: Mapping[str, Finding], guard: _Guard, notes: list[str]) -> _Chosen:
    # `auto` never picks the VM (slow under TCG, and it tests a borrowed kernel, not this one): only an
    # explicit --mode vm gets here. qemu and the image are checked by runners/vm/mode.py, which refuses
    # with 75 naming what is missing.
    not_linux = _not_linux(by["platform"])
    if not_linux:
        return _refuse(f"vm mode shares this host's / with the guest over 9p and needs a Linux host: "
                       f"{not_linux}", ways_on=["--mode container with docker or podman"], notes=notes)
    reasons = ["--mode vm given: the suite runs in a Debian kernel under qemu with a pure cgroup v2 "
               "hierarchy, the host's / shared read-only"]
    if guard.line:
        notes.append(f"{guard.line}; running in a VM because --mode vm was given")
    return Mode.vm, reasons


def _container_mode(by: Mapping[str, Finding], guard: _Guard, notes: list[str]) -> _Chosen:
    engine = by["container_engine"]
    if engine.verdict is not Verdict.supported:
        return _refuse(f"container mode cannot run: {_engine_refusal(engine)}",
                       ways_on=["start the docker or podman daemon, or set DOCKER_HOST/CONTAINER_HOST",
                                "or --mode native"], notes=notes)
    reasons = [f"--mode container given; engine {engine.facts.get('cli') or '?'} reachable"]
    if guard.line:
        notes.append(f"{guard.line}; running in a container because --mode container was given")
    return Mode.container, reasons


MODE_CHOOSERS = {Mode.auto: _auto, Mode.native: _native, Mode.vm: _vm, Mode.container: _container_mode}


def _delegation_refused(by: Mapping[str, Finding], resolved: Mode, reasons: Sequence[str],
                        notes: list[str]) -> Decision | None:
    if resolved is not Mode.native:
        return _refuse(f"--delegate asks for a native run under systemd-run, but the mode is {resolved}",
                       because=reasons, ways_on=["drop --delegate", "or --mode native --delegate"],
                       notes=notes)
    su = by["systemd_user"]
    if su.verdict is not Verdict.supported:
        return _refuse(f"--delegate needs a reachable systemd user manager: {su.verdict}: {su.reason}",
                       ways_on=["run without --delegate (cgroup witnesses then skip with the probe's "
                                "reason)",
                                "log in with a systemd user session (or enable lingering) and retry"],
                       notes=notes)
    return None


def _native_notes(by: Mapping[str, Finding], *, delegate: bool) -> list[str]:
    """What a native run will not test here, said before it starts."""
    notes = []
    nested = by["disable_userns"]
    if nested.verdict is not Verdict.supported:
        cause = nested.facts.get("cause")
        way = CAUSE_WAY_ON.get(str(cause))
        notes.append(f"disable_userns: {nested.verdict}" + (f" ({cause})" if cause else "")
                     + f": {nested.reason}; the reference launcher runs without --disable-userns, so the "
                     "nested-user-namespace witness is not tested (a failure under --require)"
                     + (f"; way on: {way}" if way else ""))
    cg = by["cgroup.delegation"]
    if not delegate and cg.verdict is not Verdict.supported:
        notes.append(f"the cgroup witnesses cannot run natively here (cgroup.delegation: {cg.verdict}: "
                     f"{cg.reason}); --mode vm boots a kernel with a pure cgroup v2 hierarchy where they can")
    return notes
