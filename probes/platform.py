"""Probe `platform`: OS, kernel, arch, WSL, and "are we in a container?" weighed like systemd-detect-virt.

Three tiers of container evidence, strongest first (systemd src/basic/virt.c detect_container):
  1. explicit declarations: PID 1's `container=` environment, /run/host/container-manager,
     /run/systemd/container. A container manager writes these on purpose.
  2. marker files: /run/.containerenv (podman), /.dockerenv (docker). Weak: they are just files an
     image can carry (this project's own CI machine has a stray /.dockerenv and is not a container).
  3. structure: our pid namespace is not the kernel's initial one (PROC_PID_INIT_INO, as systemd's
     running_in_pidns() checks), cgroup paths that name a manager (/docker/<id>, libpod-, /lxc/, ...).
Tiers that disagree are reported as a conflict (facts["conflict"]) instead of being silently resolved.

The weighing is the pure `decide(ContainerSignals)`; `gather(host)` does the reading."""

from __future__ import annotations

import os
import re
from typing import NamedTuple

from sandbox_conformance.probes.classify import wsl_of
from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.probes.host import Host

# <linux/proc_ns.h>: the inode numbers of the kernel's initial namespaces (stable since 3.8).
INIT_INO = {"ipc": 0xEFFFFFFF, "uts": 0xEFFFFFFE, "user": 0xEFFFFFFD, "pid": 0xEFFFFFFC,
            "cgroup": 0xEFFFFFFB, "time": 0xEFFFFFFA}
# cgroup path components container managers create (first match wins).
CGROUP_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"/libpod[-_]"), "podman"),
    (re.compile(r"/docker[-/][0-9a-f]{12,}"), "docker"),
    (re.compile(r"/actions_job/"), "docker"),
    (re.compile(r"/lxc(\.payload)?[./]"), "lxc"),
    (re.compile(r"/kubepods"), "kubernetes"),
    (re.compile(r"/cri-containerd-"), "containerd"),
)
MARKERS = (("/run/.containerenv", "podman"), ("/.dockerenv", "docker"))
# PID 1 of a private pid namespace that a sandbox, not a container manager, made (bwrap stays PID 1
# unless --as-pid-1; flatpak runs bwrap).
SANDBOX_PID1 = frozenset({"bwrap"})


class ContainerSignals(NamedTuple):
    declared: tuple[tuple[str, str], ...] = ()  # (source, manager name) from tier 1
    markers: tuple[tuple[str, str], ...] = ()  # (path, implied manager) from tier 2
    cgroup_hint: tuple[str, str] | None = None  # (cgroup line, manager)
    # namespace name -> is it the kernel's initial one? (only those we could read)
    initial_ns: tuple[tuple[str, bool], ...] = ()
    pid1_comm: str | None = None  # /proc/1/comm: in a bwrap sandbox's pid namespace PID 1 is bwrap

    @property
    def pidns_initial(self) -> bool | None:
        return dict(self.initial_ns).get("pid")

    @property
    def sandbox_pidns(self) -> bool:
        """A private pid namespace whose PID 1 is a sandbox tool, not a container's init."""
        return self.pidns_initial is False and self.pid1_comm in SANDBOX_PID1


class ContainerDecision(NamedTuple):
    verdict: Verdict
    container: str | None
    conflict: bool
    signals: tuple[str, ...]
    reason: str


def decide(s: ContainerSignals) -> ContainerDecision:
    """Pure: weigh the three tiers. A marker alone is never a confident "container"."""
    names: list[str] = [f"declared:{src}={name}" for src, name in s.declared]
    names += [f"marker:{path} (weak)" for path, _ in s.markers]
    if s.cgroup_hint:
        names.append(f"cgroup:{s.cgroup_hint[1]}")
    non_initial = [ns for ns, initial in s.initial_ns if not initial]
    names += [f"namespace:{ns} not initial" for ns in non_initial]
    if s.sandbox_pidns:
        names.append(f"pid1:{s.pid1_comm}")
    container_pidns = s.pidns_initial is False and not s.sandbox_pidns
    structural = s.cgroup_hint is not None or container_pidns
    structure_says_host = (s.pidns_initial is True or s.sandbox_pidns) and s.cgroup_hint is None
    where = (f"our pid namespace belongs to a {s.pid1_comm} sandbox (PID 1 is {s.pid1_comm})"
             if s.sandbox_pidns else "our pid namespace is the kernel's initial one")
    signals = tuple(names)

    if s.declared:
        name = s.declared[0][1]
        others = {n for _, n in s.declared} | {m for _, m in s.markers}
        if s.cgroup_hint:
            others.add(s.cgroup_hint[1])
        # Several signals naming the SAME manager agree; only a different name is a disagreement.
        conflict = bool(others - {name}) or structure_says_host
        why = f"declared by {s.declared[0][0]}"
        if conflict:
            others_seen = ", ".join(n for n in signals if not n.startswith("declared"))
            why += f"; other signals disagree: {others_seen}"
        return ContainerDecision(Verdict.detected, name, conflict, signals, f"container {name!r} {why}")

    if s.markers:
        path, name = s.markers[0]
        if structure_says_host:
            return ContainerDecision(
                Verdict.not_detected, None, True, signals,
                f"conflict: marker {path} present but {where} and no cgroup names a manager; "
                f"treating {path} as stray")
        if structural:
            hint = s.cgroup_hint[1] if s.cgroup_hint else None
            conflict = hint is not None and hint != name
            return ContainerDecision(Verdict.detected, hint or name, conflict, signals,
                                     f"container {hint or name!r}: marker {path} backed by "
                                     f"{'cgroup path' if hint else 'a non-initial pid namespace'}")
        return ContainerDecision(Verdict.unknown, None, False, signals,
                                 f"only the weak marker {path}; namespaces could not be read to confirm it")

    if s.cgroup_hint:
        return ContainerDecision(Verdict.detected, s.cgroup_hint[1], False, signals,
                                 f"container {s.cgroup_hint[1]!r} from the cgroup path {s.cgroup_hint[0]}")
    if s.sandbox_pidns:
        return ContainerDecision(Verdict.not_detected, None, False, signals,
                                 f"{where}, not a container manager's (the `sandboxed` probe covers it)")
    if s.pidns_initial is False:
        # systemd-detect-virt (running_in_pidns) says "container-other" here.
        return ContainerDecision(Verdict.detected, "container-other", False, signals,
                                 "not in the initial pid namespace and nothing names a manager")
    if s.pidns_initial is None:
        return ContainerDecision(Verdict.unknown, None, False, signals,
                                 "no declaration or marker, and /proc/self/ns/pid could not be read")
    return ContainerDecision(Verdict.not_detected, None, False, signals,
                             "no declaration, no marker, initial pid namespace")


def _read(path: os.PathLike[str] | str) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None


def gather(host: Host) -> tuple[ContainerSignals, dict[str, str]]:
    evidence: dict[str, str] = {}
    declared: list[tuple[str, str]] = []
    # PID 1's environment: readable only with ptrace access to PID 1 (even root can be refused by
    # Yama/LSMs); when we ARE PID 1 our own environment is its environment.
    environ_path = host.proc / "1/environ"
    try:
        environ = environ_path.read_bytes().decode(errors="replace")
        for entry in environ.split("\0"):
            if entry.startswith("container="):
                declared.append(("pid1:container", entry.partition("=")[2]))
                evidence[str(environ_path)] = entry
    except (FileNotFoundError, ProcessLookupError):
        evidence[str(environ_path)] = "absent"
    except PermissionError:
        evidence[str(environ_path)] = "unreadable (EACCES)"
    else:
        evidence.setdefault(str(environ_path), "no container=")
    for path in ("/run/host/container-manager", "/run/systemd/container"):
        text = _read(host.path(path))
        if text is not None and text.strip():
            declared.append((path, text.strip().splitlines()[0]))
            evidence[path] = text.strip()
    markers = []
    for path, name in MARKERS:
        if host.path(path).exists():
            markers.append((path, name))
            evidence[path] = "present"
    hint = None
    for line in (_read(host.proc / "self/cgroup") or "").splitlines():
        for pattern, name in CGROUP_PATTERNS:
            if pattern.search(line):
                hint = (line, name)
                evidence["cgroup"] = line
                break
        if hint:
            break
    initial = []
    for ns, ino in INIT_INO.items():
        try:
            link = os.readlink(host.proc / "self/ns" / ns)
        except (FileNotFoundError, PermissionError):
            continue
        m = re.search(r"\[(\d+)\]", link)
        if m:
            initial.append((ns, int(m.group(1)) == ino))
            evidence[f"ns/{ns}"] = link
    comm = _read(host.proc / "1/comm")
    if comm is not None:
        evidence["/proc/1/comm"] = comm.strip()
    return (ContainerSignals(tuple(declared), tuple(markers), hint, tuple(initial),
                             comm.strip() if comm else None), evidence)


def os_release(host: Host) -> dict[str, str]:
    out: dict[str, str] = {}
    text = _read(host.path("/etc/os-release")) or _read(host.path("/usr/lib/os-release")) or ""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip().strip('"').strip("'")
    return out


def probe(host: Host) -> list[Finding]:
    signals, evidence = gather(host)
    decision = decide(signals)
    rel = os_release(host)
    kernel = (_read(host.proc / "sys/kernel/osrelease") or "").strip() or None
    wsl = wsl_of(kernel)
    os_name = rel.get("PRETTY_NAME") or rel.get("NAME") or "Linux"
    evidence["osrelease"] = str(kernel)
    facts = {
        "os": os_name, "os_id": rel.get("ID"), "os_version_id": rel.get("VERSION_ID"),
        "system": os.uname().sysname, "kernel": kernel, "arch": os.uname().machine, "wsl": wsl,
        "container": decision.container, "conflict": decision.conflict, "signals": list(decision.signals),
    }
    head = f"{os_name}, kernel {kernel}, {facts['arch']}" + (f", WSL{wsl}" if wsl else "")
    return [Finding("platform", decision.verdict, f"{head}: {decision.reason}", evidence, facts)]
