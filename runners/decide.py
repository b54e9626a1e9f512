"""Where may the witness suite run: a pure function of the request and the probe findings.

No I/O, no exit: `run_cmd` is the only place that turns a `Decision` into an exit code. Tested as a
table in tests/test_runner_decide.py.

The rules (issue 4):
- Inside a sandbox: refuse under EVERY mode, naming the boundary the probes really saw. Nothing opens
  this: the suite would go red on the outer sandbox rather than tell anything about the one under test.
- On a deployment host (signature matched, or configured but uncheckable): `auto` refuses and names
  both ways on (`--mode container`, `--mode native`); an explicit mode is the user meaning it.
- No signature configured: `auto` proceeds, with a note saying the guard had nothing to check.
- `auto` picks native when the host is Linux, bwrap creates a user and a network namespace here, we
  are not sandboxed and this is not a deployment host; else container when an engine is reachable;
  else it refuses naming what is missing.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence

from probes.finding import Finding, Verdict

# Where the deployment probe looks for a signature; said in the note when none is configured.
SIGNATURE_HINT = ("declare one in /etc/sandbox-conformance/deployment.toml, "
                  "~/.config/sandbox-conformance/deployment.toml or $SANDBOX_CONFORMANCE_DEPLOYMENT_CONFIG")

# The probe ids `decide` reads; run_cmd collects exactly these.
NEEDED: tuple[str, ...] = ("platform", "bwrap", "userns", "userns.map", "netns", "sandboxed", "deployment",
                           "container_engine", "systemd_user", "cgroup.delegation")

# bwrap >= 0.8 has --disable-userns (it sets user.max_user_namespaces=1 in the sandbox's user
# namespace, so a nested unshare(CLONE_NEWUSER) fails with ENOSPC); older sandboxes cannot have
# turned nesting off.
DISABLE_USERNS_SINCE = (0, 8)


class Mode(enum.StrEnum):
    auto = enum.auto()
    native = enum.auto()
    container = enum.auto()
    vm = enum.auto()  # issue 5: a Debian kernel under qemu with a pure cgroup v2 hierarchy (runners/vm.py)


@dataclasses.dataclass(frozen=True)
class Request:
    mode: Mode = Mode.auto
    delegate: bool = False  # re-execute a native run under `systemd-run --user -p Delegate=yes`


@dataclasses.dataclass(frozen=True)
class Decision:
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


def _sandbox_boundary(by: Mapping[str, Finding]) -> tuple[str, list[str]]:
    """The refusal reason inside a sandbox, naming what the probes really saw, never a guess."""
    sb, engine, userns, bwrap = by["sandboxed"], by["container_engine"], by["userns"], by["bwrap"]
    signals = [str(s) for s in sb.facts.get("signals", ())]
    parts: list[str] = []
    because: list[str] = []
    if engine.verdict is not Verdict.supported:
        parts.append("the container engine is unreachable")
        because.append(f"container_engine: {engine.verdict}: {engine.reason}")
    nested = (userns.facts.get("cause") == "nested"
              or (userns.verdict is not Verdict.supported and any("nest" in s for s in signals)))
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
        parts.append(f"user namespaces are {userns.verdict} here")
        because.append(f"userns: {userns.verdict}: {userns.reason}")
    outer = "the suite would test the outer sandbox, not the one under test"
    boundary = " and ".join(parts) if parts else outer
    sig = f" (signals: {', '.join(signals)})" if signals else ""
    because.append(f"sandboxed: {sb.reason}")
    return f"running inside a sandbox{sig}: {boundary}; nesting is not supported under any --mode", because


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


def _native_blockers(by: Mapping[str, Finding]) -> list[str]:
    """What keeps auto from choosing native, one line each (empty: native is fine)."""
    out: list[str] = []
    not_linux = _not_linux(by["platform"])
    if not_linux:
        out.append(f"not Linux: {not_linux}")
    if by["bwrap"].verdict is not Verdict.supported:
        out.append(f"bwrap: {by['bwrap'].verdict}: {by['bwrap'].reason}")
    for rung in ("userns", "userns.map", "netns"):
        f = by[rung]
        if f.verdict is not Verdict.supported:
            out.append(f"{rung}: {f.verdict}: {f.reason}")
    sb = by["sandboxed"]
    if sb.verdict is not Verdict.not_detected:
        out.append(f"sandboxed: {sb.verdict}: {sb.reason}")
    return out


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
    mode = request.mode

    # 1. Inside a sandbox: no mode opens this.
    if by["sandboxed"].verdict is Verdict.detected:
        reason, because = _sandbox_boundary(by)
        return _refuse(reason, because=because,
                       ways_on=["run sandbox-conformance on the host, outside the sandbox"])

    notes: list[str] = []
    dep = by["deployment"]
    deployment_host = False
    if dep.verdict is Verdict.detected:
        deployment_host = True
        matches = ", ".join(str(m) for m in dep.facts.get("matches", ())) or dep.reason
        dep_line = f"this is a deployment host (signature matched: {matches})"
    elif dep.verdict is Verdict.not_detected:
        dep_line = ""
    elif dep.facts.get("configured") is False and not dep.facts.get("errors"):
        where = dep.facts.get("declare_at")
        hint = f"declare one at {where} (schema: README, 'The deployment guard')" if where else SIGNATURE_HINT
        notes.append(f"no deployment signature configured: the guard had nothing to check; {hint}")
        dep_line = ""
    else:
        # Configured but an arm could not run, a malformed signature file, or the probe itself
        # failed: the dangerous answer is the false negative, so this counts as a deployment host
        # under auto.
        deployment_host = True
        dep_line = f"the deployment signature could not be checked ({dep.reason})"

    ways_on_deployment = ["--mode container: run the suite in a privileged container on this host",
                          "--mode native: run it natively here, meaning it"]
    engine = by["container_engine"]

    if mode is Mode.auto:
        if deployment_host:
            return _refuse(f"{dep_line}; auto will not pick a mode here", ways_on=ways_on_deployment,
                           notes=notes)
        blockers = _native_blockers(by)
        if not blockers:
            resolved = Mode.native
            reasons = ["auto: Linux, bwrap creates a user and a network namespace here, not sandboxed, "
                       "not a deployment host"]
        elif engine.verdict is Verdict.supported:
            resolved = Mode.container
            reasons = [f"auto: native is not possible here, and {engine.facts.get('cli') or 'the engine'} "
                       f"is reachable ({engine.reason})", *(f"native: {b}" for b in blockers)]
        else:
            return _refuse("auto found neither a native sandbox nor a reachable container engine",
                           because=[*(f"native: {b}" for b in blockers),
                                    f"container: {_engine_refusal(engine)}"],
                           ways_on=["install bubblewrap (>= 0.8) and allow unprivileged user namespaces",
                                    "or start docker/podman so --mode container can run"],
                           notes=notes)
    elif mode is Mode.native:
        not_linux = _not_linux(by["platform"])
        if not_linux:
            return _refuse(f"native mode needs a Linux kernel: {not_linux}",
                           ways_on=["--mode container with docker or podman"], notes=notes)
        resolved = Mode.native
        reasons = ["--mode native given"]
        if dep_line:
            notes.append(f"{dep_line}; running natively because --mode native was given")
    elif mode is Mode.vm:
        # `auto` never picks the VM (slow under TCG, and it tests a borrowed kernel, not this one):
        # only an explicit --mode vm gets here. qemu and the image are checked by runners/vm_mode.py,
        # which refuses with 75 naming what is missing.
        not_linux = _not_linux(by["platform"])
        if not_linux:
            return _refuse(f"vm mode shares this host's / with the guest over 9p and needs a Linux host: "
                           f"{not_linux}", ways_on=["--mode container with docker or podman"], notes=notes)
        resolved = Mode.vm
        reasons = ["--mode vm given: the suite runs in a Debian kernel under qemu with a pure cgroup v2 "
                   "hierarchy, the host's / shared read-only"]
        if dep_line:
            notes.append(f"{dep_line}; running in a VM because --mode vm was given")
    else:
        if engine.verdict is not Verdict.supported:
            return _refuse(f"container mode cannot run: {_engine_refusal(engine)}",
                           ways_on=["start the docker or podman daemon, or set DOCKER_HOST/CONTAINER_HOST",
                                    "or --mode native"], notes=notes)
        resolved = Mode.container
        reasons = [f"--mode container given; engine {engine.facts.get('cli') or '?'} reachable"]
        if dep_line:
            notes.append(f"{dep_line}; running in a container because --mode container was given")

    if request.delegate:
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
    cg = by["cgroup.delegation"]
    if resolved is Mode.native and not request.delegate and cg.verdict is not Verdict.supported:
        notes.append(f"the cgroup witnesses cannot run natively here (cgroup.delegation: {cg.verdict}: "
                     f"{cg.reason}); --mode vm boots a kernel with a pure cgroup v2 hierarchy where they can")
    return Decision(resolved, tuple(reasons), (), tuple(notes), delegate=request.delegate)
