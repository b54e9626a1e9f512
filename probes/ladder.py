"""The user-namespace ladder: `userns`, `userns.map`, `netns`, `pidns.proc`, `disable_userns`.

Each rung is TRIED as the probed user (Host.trial_prefix: setpriv when --as-user) in a throwaway child
with a timeout.

Fast path: ONE combined trial, `bwrap --unshare-user --unshare-net --unshare-pid --proc /proc
--disable-userns` running the stdlib program in its `all` mode, started before anything else. When it
runs and what it saw answers every rung (its own user namespace, the uid/gid maps read back, lo up, a
fresh /proc, a nested unshare refused with ENOSPC), that is the ladder: one launch.

Slow path, when the combined trial fails, is not tried (no bwrap, a setuid one) or leaves a rung
unanswered: every rung its own trial, as the ladder always did, to name the cause:
  userns + userns.map  one `python3 -I -S` child: unshare(CLONE_NEWUSER), then setgroups/uid_map/gid_map;
  netns, pidns.proc, disable_userns  one throwaway bwrap each, running the same program.
The four launches are independent, so they run concurrently. All five ids are always reported; a
failing rung is classified by `probes.classify` from independent signals gathered here, never from
bwrap's stderr wording (kept as evidence). Every finding says which observation answered it
(`facts["observed_by"]`: "combined" or "rung"; evidence `observed_by`, and `combined trial` on the slow
path: what the combined trial did and why it did not answer)."""

from __future__ import annotations

import contextlib
import errno as errno_mod
import functools
import json
import os
import re
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandbox_conformance.probes import bwrap as bwrap_probe
from sandbox_conformance.probes.classify import (
    RUNGS,
    Cause,
    Rung,
    Signals,
    Step,
    TrialOutcome,
    classify,
    wsl_of,
)
from sandbox_conformance.probes.finding import Finding
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes.children import Background, Completed, minimal_env

INSIDE = Path(__file__).with_name("_inside_ladder.py")
USER_INIT_INO = 0xEFFFFFFD  # PROC_USER_INIT_INO, <linux/proc_ns.h>
# Mount points under /proc that are permanently-empty directories do not count as masks
# (fs/namespace.c mnt_already_visible skips them): binfmt_misc is registered that way.
_HARMLESS_PROC_MOUNTS = ("/proc/sys/fs/binfmt_misc",)
_STRERROR = {os.strerror(n): name for n, name in errno_mod.errorcode.items()}
_ERRNO_IN_PARENS = re.compile(r"\((E[A-Z0-9]+)\)")


# ---------------------------------------------------------------- signals (a function of Host)

def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except (FileNotFoundError, PermissionError, NotADirectoryError, ProcessLookupError):
        return None
    except OSError as e:
        if e.errno == errno_mod.EINVAL:  # attr/current with no LSM providing it
            return None
        raise


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def parse_status(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo (fs/proc_namespace.c).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def proc_mounts(mountinfo: str) -> tuple[tuple[str, ...], str | None]:
    """(mount points over /proc contents that can hide something, hidepid value of /proc) from
    /proc/self/mountinfo."""
    masks: list[str] = []
    hidepid: str | None = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rfields = left.split(), right.split()
        if len(fields) < 6 or len(rfields) < 3:
            continue
        mountpoint = _unescape(fields[4])
        options = fields[5].split(",") + rfields[2].split(",")
        if mountpoint == "/proc" and rfields[0] == "proc":
            for opt in options:
                if opt.startswith("hidepid="):
                    hidepid = opt.partition("=")[2]
        elif mountpoint.startswith("/proc/") and not any(
                mountpoint == h or mountpoint.startswith(h + "/") for h in _HARMLESS_PROC_MOUNTS):
            masks.append(mountpoint)
    return tuple(masks), hidepid


def readonly_at(mountinfo: str, path: str) -> bool | None:
    """Is the mount serving `path` read-only, per mount or per superblock (either refuses a write
    with EROFS: mnt_want_write / sb_rdonly, fs/namespace.c)? None: no mount in the table covers it.
    The serving mount is the one with the longest mount point at or above `path`; of a stack on one
    mount point, the last listed (mounted on top)."""
    best: tuple[int, bool] | None = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rfields = left.split(), right.split()
        if len(fields) < 6 or len(rfields) < 2:
            continue
        point = _unescape(fields[4])
        if not (path == point or point == "/" or path.startswith(point.rstrip("/") + "/")):
            continue
        ro = "ro" in fields[5].split(",") or (len(rfields) > 2 and "ro" in rfields[2].split(","))
        if best is None or len(point) >= best[0]:
            best = (len(point), ro)
    return None if best is None else best[1]


def _readonly(host: Host, mountinfo: str | None, path: str) -> bool | None:
    """The mount table first; where it could not be read, statvfs(2)'s ST_RDONLY on the path."""
    if mountinfo:
        found = readonly_at(mountinfo, path)
        if found is not None:
            return found
    try:
        return bool(os.statvfs(host.proc / path.removeprefix("/proc/")).f_flag & os.ST_RDONLY)
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        return None


def _ns_inode(host: Host, name: str) -> int | None:
    try:
        link = os.readlink(host.proc / "self/ns" / name)
    except (FileNotFoundError, PermissionError):
        return None
    m = re.search(r"\[(\d+)\]", link)
    return int(m.group(1)) if m else None


def _pids(host: Host) -> tuple[int | None, int | None, str | None]:
    """The tightest pids.max on our cgroup path that is reached or nearest: (max, current, path)."""
    text = _read(host.proc / "self/cgroup") or ""
    candidates: list[Path] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if "pids" in controllers.split(","):
            base = host.sys / "fs/cgroup/pids"
        elif parts[0] == "0" and controllers == "":
            base = host.sys / "fs/cgroup"
        else:
            continue
        node = base / rel.lstrip("/")
        while True:
            candidates.append(node)
            if node == base:
                break
            node = node.parent
    best: tuple[int | None, int | None, str | None] = (None, None, None)
    for node in candidates:
        limit = _int(_read(node / "pids.max"))
        current = _int(_read(node / "pids.current"))
        if limit is None or current is None:
            continue  # "max", or no such file
        if best[0] is None or limit - current < best[0] - (best[1] or 0):
            best = (limit, current, str(node))
    return best


def _nproc_limit(host: Host) -> int | None:
    for line in (_read(host.proc / "self/limits") or "").splitlines():
        if line.startswith("Max processes"):
            return _int(line.split()[2])  # "unlimited" -> None
    return None


def count_processes(host: Host, uid: int) -> int:
    """Processes whose real uid is `uid`: what RLIMIT_NPROC counts (kernel/fork.c copy_process
    checks the real uid's ucount). Only read when a trial failed with EAGAIN."""
    count = 0
    for entry in host.proc.iterdir():
        if not entry.name.isdigit():
            continue
        for line in (_read(entry / "status") or "").splitlines():
            if line.startswith("Uid:"):
                count += line.split()[1] == str(uid)
                break
    return count


def apparmor_userns(host: Host) -> bool | None:
    """Does the kernel's AppArmor mediate user-namespace creation? Upstream (6.7+) lists it in the
    namespaces mask (security/apparmor/apparmorfs.c aa_sfs_entry_ns: "userns_create"); Ubuntu's
    kernels also have a namespaces/userns_create file. None: securityfs not mounted or not readable
    here, or no AppArmor."""
    features = host.sys / "kernel/security/apparmor/features"
    try:
        if not features.is_dir():
            return None
        mask = _read(features / "namespaces/mask") or ""
        return "userns_create" in mask.split() or (features / "namespaces/userns_create").exists()
    except PermissionError:
        return None


def gather_signals(host: Host, info: bwrap_probe.BwrapInfo | None = None) -> Signals:
    proc = host.proc
    status = parse_status(_read(proc / "self/status") or "")
    label = _read(proc / "self/attr/apparmor/current") or _read(proc / "self/attr/current")
    mountinfo = _read(proc / "self/mountinfo")
    masks, hidepid = proc_mounts(mountinfo or "")
    user_ino = _ns_inode(host, "user")
    pids_max, pids_current, pids_cgroup = _pids(host)
    cap_eff = status.get("CapEff")
    return Signals(
        euid=host.euid,
        cap_eff=int(cap_eff, 16) if cap_eff else None,
        seccomp=_int(status.get("Seccomp")),
        no_new_privs=(status["NoNewPrivs"] == "1") if "NoNewPrivs" in status else None,
        unprivileged_userns_clone=_int(_read(proc / "sys/kernel/unprivileged_userns_clone")),
        max_user_namespaces=_int(_read(proc / "sys/user/max_user_namespaces")),
        apparmor_restrict=_int(_read(proc / "sys/kernel/apparmor_restrict_unprivileged_userns")),
        apparmor_label=label,
        apparmor_userns=apparmor_userns(host),
        userns_initial=None if user_ino is None else user_ino == USER_INIT_INO,
        kernel_userns=(proc / "self/ns/user").is_symlink() or (proc / "self/ns/user").exists(),
        proc_masks=masks,
        hidepid=hidepid,
        # /proc/self is where the map writes go; /proc/sys/user holds max_user_namespaces.
        proc_readonly=_readonly(host, mountinfo, "/proc/self"),
        proc_sys_readonly=_readonly(host, mountinfo, "/proc/sys/user"),
        wsl=wsl_of(_read(proc / "sys/kernel/osrelease")),
        bwrap_setuid=bool(info and info.setuid),
        nproc_limit=_nproc_limit(host),
        pids_max=pids_max,
        pids_current=pids_current,
        pids_cgroup=pids_cgroup,
    )


def with_trial_context(signals: Signals, report: Mapping[str, Any] | None) -> Signals:
    """The process-level signals as the TRIAL user saw them (the userns child reports them before it
    unshares): with --as-user our own CapEff says nothing about theirs."""
    if not report:
        return signals
    status = report.get("status") or {}
    changes: dict[str, Any] = {}
    if status.get("CapEff"):
        changes["cap_eff"] = int(status["CapEff"], 16)
    if status.get("Seccomp"):
        changes["seccomp"] = _int(status["Seccomp"])
    if status.get("NoNewPrivs"):
        changes["no_new_privs"] = status["NoNewPrivs"] == "1"
    if "uid" in report:
        changes["euid"] = int(report["uid"])
    if report.get("apparmor"):
        changes["apparmor_label"] = report["apparmor"]
    if "nproc_limit" in report:
        changes["nproc_limit"] = report["nproc_limit"]
    return signals._replace(**changes)


# ---------------------------------------------------------------- trials

def interpreter(host: Host) -> str:
    """An interpreter the trial user can execute: the system one, not a pyenv/venv under /root."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    return sys.executable


def errno_from_stderr(stderr: str) -> str | None:
    """Best effort: bwrap ends its errors with strerror(errno) (die_with_error) or, for some, an
    explicit "(ENOSPC)". The locale is C for trials, so strerror text maps back to the name."""
    for line in reversed(stderr.strip().splitlines()):
        m = _ERRNO_IN_PARENS.search(line)
        if m and m.group(1) in errno_mod.errorcode.values():
            return m.group(1)
        tail = line.rsplit(": ", 1)[-1].strip()
        if tail in _STRERROR:
            return _STRERROR[tail]
    return None


def _report(done: Completed) -> dict[str, Any] | None:
    for line in reversed(done.stdout.strip().splitlines()):
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict):
                return doc
    return None


def _launch(host: Host, argv: list[str]) -> Completed:
    full = [*host.trial_prefix, *argv]
    try:
        return host.trial(full, timeout=host.timeout, env=minimal_env({"LC_ALL": "C"}), cwd="/")
    except BlockingIOError:
        # fork() itself failed with EAGAIN (RLIMIT_NPROC or pids.max): that is a finding, not a crash.
        return Completed(tuple(full), None, "", "fork: Resource temporarily unavailable (EAGAIN)", 0.0,
                         not_found=True)


@functools.cache
def _inside_text() -> str:
    return INSIDE.read_text()


def _program(host: Host, mode: str) -> list[str]:
    return [interpreter(host), "-I", "-S", "-c", _inside_text(), mode]


BWRAP_ARGS: dict[Rung, tuple[str, ...]] = {
    # --ro-bind / / gives the program its interpreter; everything else is the rung under test.
    Rung.netns: ("--unshare-user", "--unshare-net", "--die-with-parent", "--ro-bind", "/", "/"),
    Rung.pidns_proc: ("--unshare-user", "--unshare-pid", "--die-with-parent", "--ro-bind", "/", "/",
                      "--proc", "/proc"),
    Rung.disable_userns: ("--unshare-user", "--disable-userns", "--die-with-parent", "--ro-bind", "/", "/"),
}
_MODE = {Rung.netns: "netns", Rung.pidns_proc: "pidns", Rung.disable_userns: "nested"}


def _failed_launch(done: Completed, step: Step) -> TrialOutcome:
    if done.timed_out:
        return TrialOutcome(False, step, timed_out=True, detail=f"{done.seconds:.1f}s")
    if done.not_found:
        return TrialOutcome(False, Step.launch, errno_from_stderr(done.stderr) or "ENOENT")
    return TrialOutcome(False, step, errno_from_stderr(done.stderr))


def userns_outcomes(done: Completed) -> tuple[TrialOutcome, TrialOutcome, dict[str, Any] | None]:
    """The userns child's report -> (userns outcome, userns.map outcome, report)."""
    report = _report(done)
    if report is None or "unshare" not in report:
        first = _failed_launch(done, Step.no_report)
        return first, TrialOutcome(False, untried=Cause.earlier_rung), report
    if report["unshare"] is not None:
        return (TrialOutcome(False, Step.unshare, report["unshare"]),
                TrialOutcome(False, untried=Cause.earlier_rung), report)
    for step in (Step.setgroups, Step.uid_map, Step.gid_map):
        if report.get(str(step)) is not None:
            return TrialOutcome(True), TrialOutcome(False, step, report[str(step)]), report
    return TrialOutcome(True), TrialOutcome(True), report


def bwrap_outcome(rung: Rung, done: Completed, outer: Mapping[str, str | None] | None = None
                  ) -> tuple[TrialOutcome, dict[str, Any] | None]:
    """`outer`: our own namespace links ("net", "pid"): a trial that reports the same one ran in no new
    namespace, however lo and /proc/self look (in our own pid namespace with our own /proc, /proc/self
    is our pid too)."""
    report = _report(done)
    if report is None:
        return _failed_launch(done, Step.bwrap if done.returncode not in (0, None) else Step.no_report), None
    outer = outer or {}
    key = {Rung.netns: ("net", "net"), Rung.pidns_proc: ("pid_ns", "pid")}.get(rung)
    if key is not None and outer.get(key[1]) and report.get(key[0]) == outer[key[1]]:
        not_new = f"{key[1]} namespace {outer[key[1]]} is ours"
        return TrialOutcome(False, Step.ns_not_new, detail=not_new), report
    if rung is Rung.netns and not report.get("lo_up"):
        return TrialOutcome(False, Step.lo_down, detail=f"interfaces {report.get('interfaces')}"), report
    if rung is Rung.pidns_proc and not report.get("fresh_proc"):
        return TrialOutcome(False, Step.proc_not_fresh), report
    if rung is Rung.disable_userns:
        nested = report.get("nested_unshare")
        if nested is None:
            return TrialOutcome(False, Step.nested_allowed), report
        if nested != "ENOSPC":
            return TrialOutcome(False, Step.nested_other, nested), report
    return TrialOutcome(True), report


def _evidence(done: Completed | None, report: Mapping[str, Any] | None,
              extra: Mapping[str, str]) -> dict[str, str]:
    ev: dict[str, str] = dict(extra)
    if done is not None:
        # The argv without the program text: a person wants the command line, not 4 kB of Python.
        argv = [a if len(a) < 200 else "<_inside_ladder.py>" for a in done.argv]
        ev["argv"] = " ".join(argv)
        ev["returncode"] = str(done.returncode)
        ev["seconds"] = f"{done.seconds:.3f}"
        if done.stderr.strip():
            ev["stderr"] = done.stderr_tail()
    if report is not None:
        ev["report"] = json.dumps(report, sort_keys=True)
    return ev


def _signal_evidence(s: Signals) -> dict[str, str]:
    return {
        "euid": str(s.euid),
        "CapEff": f"{s.cap_eff:016x}" if s.cap_eff is not None else "unknown",
        "Seccomp": str(s.seccomp), "NoNewPrivs": str(s.no_new_privs),
        "kernel.unprivileged_userns_clone": str(s.unprivileged_userns_clone),
        "user.max_user_namespaces": str(s.max_user_namespaces),
        "kernel.apparmor_restrict_unprivileged_userns": str(s.apparmor_restrict),
        "apparmor_label": str(s.apparmor_label),
        "apparmor userns mediation": str(s.apparmor_userns),
        "userns_initial": str(s.userns_initial),
        "proc_masks": ",".join(s.proc_masks) or "none",
        "hidepid": str(s.hidepid), "wsl": str(s.wsl), "bwrap_setuid": str(s.bwrap_setuid),
        "/proc read-only": str(s.proc_readonly), "/proc/sys read-only": str(s.proc_sys_readonly),
        "RLIMIT_NPROC": str(s.nproc_limit), "pids.max": f"{s.pids_max} (current {s.pids_current})",
    }


# ---------------------------------------------------------------- the fast path: one combined trial

# One bwrap with every rung's flags at once, running the `all` mode: on a healthy host this single
# launch answers the five rungs (issue 15: the ladder is walked rung by rung only when it fails, to
# name the cause). Same program, same --ro-bind / / as the rung trials.
COMBINED_ARGS: tuple[str, ...] = (
    "--unshare-user", "--unshare-net", "--unshare-pid", "--disable-userns", "--die-with-parent",
    "--ro-bind", "/", "/",
    "--proc", "/proc",
)
COMBINED = "combined"  # facts["observed_by"]: the combined trial answered this rung
RUNG_TRIAL = "rung"  # ... its own rung trial did (the slow path)
_COMBINED_WHAT = ("one bwrap --unshare-user --unshare-net --unshare-pid --proc /proc --disable-userns "
                  "(the combined trial)")


def _ns_link(host: Host, name: str) -> str | None:
    try:
        return os.readlink(host.proc / "self/ns" / name)
    except OSError:
        return None


def _combined_candidate(host: Host) -> tuple[str | None, str]:
    """(the bwrap to run the combined trial with, or None and why not). A setuid bwrap creates its
    namespaces with privilege (bubblewrap.c acquire_privs), so its success would say nothing about an
    unprivileged user namespace: only the rung trials can answer there."""
    path = host.which("bwrap")
    if path is None:
        return None, "no bwrap on PATH"
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return None, f"{path}: {errno_mod.errorcode.get(e.errno or 0, e)}"
    if mode & stat.S_ISUID:
        return None, f"{path} is setuid"
    return path, ""


def _map_rows(text: object) -> list[list[str]]:
    if not isinstance(text, str) or text.startswith("!"):
        return []
    return [line.split() for line in text.splitlines() if len(line.split()) == 3]


def combined_observations(report: Mapping[str, Any] | None, outer_userns: str | None,
                          outer: Mapping[str, str | None] | None = None
                          ) -> tuple[dict[Rung, str], dict[Rung, str]]:
    """The combined trial's report -> (rung: the observation that answers it, rung: why it does not).
    Pure. Each rung must be answered by the same fact its own trial would check. `outer`: our own
    "net" and "pid" namespace links (bwrap_outcome)."""
    answered: dict[Rung, str] = {}
    missing: dict[Rung, str] = {}
    if report is None:
        return answered, {r: "no report" for r in RUNGS}
    inner = report.get("userns")
    if isinstance(inner, str) and inner.startswith("user:[") and outer_userns and inner != outer_userns:
        answered[Rung.userns] = f"the trial ran in user namespace {inner}, ours is {outer_userns}"
    else:
        missing[Rung.userns] = f"user namespace {inner} vs ours {outer_userns}"
    uid_rows, gid_rows = _map_rows(report.get("uid_map_read")), _map_rows(report.get("gid_map_read"))
    setgroups = report.get("setgroups_read")
    uid = str(report.get("uid"))
    # Unmapped, getuid() reads as the overflow uid (user_namespaces(7)); a mapped one is listed.
    if uid_rows and gid_rows and setgroups in ("deny", "!ENOENT") and any(r[0] == uid for r in uid_rows):
        answered[Rung.userns_map] = (f"setgroups {setgroups}, uid_map {' '.join(uid_rows[0])}, "
                                     f"gid_map {' '.join(gid_rows[0])} read back inside (uid {uid})")
    else:
        missing[Rung.userns_map] = (f"setgroups {setgroups}, uid_map {report.get('uid_map_read')!r}, "
                                    f"gid_map {report.get('gid_map_read')!r}, uid {uid}")
    if report.get("lo_up") is True:
        answered[Rung.netns] = (f"lo up (flags {report.get('lo_flags')}) in {report.get('net')}, "
                                f"interfaces {report.get('interfaces')}")
    else:
        missing[Rung.netns] = f"lo not up ({report.get('lo_error') or report.get('lo_flags')})"
    if report.get("fresh_proc") is True:
        answered[Rung.pidns_proc] = (f"/proc/self -> {report.get('proc_self')}, our pid {report.get('pid')} "
                                     f"in {report.get('pid_ns')}")
    else:
        missing[Rung.pidns_proc] = f"/proc/self -> {report.get('proc_self')}, pid {report.get('pid')}"
    if report.get("nested_unshare") == "ENOSPC":
        answered[Rung.disable_userns] = "a nested unshare(CLONE_NEWUSER) got ENOSPC"
    else:
        missing[Rung.disable_userns] = f"nested unshare(CLONE_NEWUSER) -> {report.get('nested_unshare')}"
    outer = outer or {}
    for rung, key, ours in ((Rung.netns, "net", outer.get("net")),
                            (Rung.pidns_proc, "pid_ns", outer.get("pid"))):
        if ours and report.get(key) == ours:
            answered.pop(rung, None)
            missing[rung] = f"the trial ran in our own namespace {ours}"
    return answered, missing


def _combined_summary(done: Completed | None, why_not: str, missing: Mapping[Rung, str]) -> str:
    """One line for the slow path's evidence: what the combined trial did, and why it did not answer."""
    if done is None:
        return f"not tried: {why_not}"
    if done.timed_out:
        return f"timed out after {done.seconds:.1f}s"
    head = f"exit {done.returncode}" + (f": {done.stderr_tail()}" if done.stderr.strip() else "")
    if why_not:
        return f"{head}; not used: {why_not}"
    if done.returncode != 0:
        return head  # bwrap (or the program) failed: its words say more than five "no report"s
    if set(missing.values()) == {"no report"}:
        return f"{head}; no report"
    gaps = "; ".join(f"{r}: {w}" for r, w in missing.items())
    return f"{head}; did not answer {gaps}" if gaps else head


# ---------------------------------------------------------------- the probe

def probe(host: Host, *, fast: bool = True) -> list[Finding]:
    """The five rungs. fast=False walks the rungs without trying the combined trial first (tests)."""
    combined: Background[Completed] | None = None
    bwrap_path, why_not = _combined_candidate(host) if fast else (None, "fast path off")
    if bwrap_path is not None:
        # Started before `bwrap --version`: on a healthy host this is the only launch the ladder makes.
        combined = Background(_launch, host, [bwrap_path, *COMBINED_ARGS, "--", *_program(host, "all")])
    info = bwrap_probe.inspect(host)
    outer_userns = _ns_link(host, "user")
    done = combined.result() if combined is not None else None
    report = _report(done) if done is not None else None
    answered, missing = combined_observations(report, outer_userns,
                                              {"net": _ns_link(host, "net"), "pid": _ns_link(host, "pid")})
    if done is not None:
        # The combined trial counts only where its bwrap is the one the bwrap probe vouches for and the
        # rung trials would use: same path, runs, not setuid, no file caps, knows --disable-userns.
        if info.path != bwrap_path or info.error is not None:
            why_not = f"bwrap probe: {info.path}: {info.error}"
        elif info.setuid or info.caps:
            why_not = f"bwrap is {'setuid' if info.setuid else 'file caps ' + str(info.caps)}"
        elif not info.disable_userns:
            why_not = f"bwrap {info.version} lacks --disable-userns"
    if done is not None and not why_not and not missing:
        return _fast_findings(host, done, report, answered, outer_userns)
    return _slow_findings(host, info, _combined_summary(done, why_not, missing))


def _fast_findings(host: Host, done: Completed, report: Mapping[str, Any] | None,
                   answered: Mapping[Rung, str], outer_userns: str | None) -> list[Finding]:
    findings = []
    for rung in RUNGS:
        result = classify(Signals(), rung, TrialOutcome(True))
        extra = {"observed_by": _COMBINED_WHAT, "observed": answered[rung], "step": "", "errno": "None"}
        if rung is Rung.userns:
            extra["userns_outer"] = str(outer_userns)
        findings.append(Finding(
            str(rung), result.verdict, result.reason, _evidence(done, report, extra),
            {"cause": None, "also": [], "errno": None, "user": host.user, "step": None,
             "observed_by": COMBINED},
        ))
    return findings


def _slow_findings(host: Host, info: bwrap_probe.BwrapInfo, combined: str) -> list[Finding]:
    """Every rung its own trial, as before the fast path: the first failing rung names the cause."""
    runs: dict[Rung | str, Completed] = {}
    # The four launches are independent: the userns child, then one bwrap per bwrap rung.
    tasks: dict[Rung | str, Background[Completed]] = {
        "userns": Background(_launch, host, _program(host, "userns"))}
    for rung, args in BWRAP_ARGS.items():
        if info.path is None or info.error is not None:
            continue
        if rung is Rung.disable_userns and not info.disable_userns:
            continue
        tasks[rung] = Background(_launch, host, [info.path, *args, "--", *_program(host, _MODE[rung])])
    signals = gather_signals(host, info)
    outer = {"net": _ns_link(host, "net"), "pid": _ns_link(host, "pid")}
    for key, task in tasks.items():
        runs[key] = task.result()

    first, second, ureport = userns_outcomes(runs["userns"])
    signals = with_trial_context(signals, ureport)
    outcomes: dict[Rung, TrialOutcome] = {Rung.userns: first, Rung.userns_map: second}
    reports: dict[Rung, dict[str, Any] | None] = {Rung.userns: ureport, Rung.userns_map: ureport}
    for rung in BWRAP_ARGS:
        if rung in runs:
            outcomes[rung], reports[rung] = bwrap_outcome(rung, runs[rung], outer)
        elif info.path is None or info.error is not None:
            why = f"{info.path}: {info.error}" if info.path else ""
            outcomes[rung], reports[rung] = TrialOutcome(False, untried=Cause.no_bwrap, detail=why), None
        else:
            outcomes[rung] = TrialOutcome(False, untried=Cause.bwrap_too_old, detail=info.version or "")
            reports[rung] = None

    if any(o.errno == "EAGAIN" for o in outcomes.values()) and signals.nproc_limit is not None:
        signals = signals._replace(nproc_used=count_processes(host, signals.euid))
    succeeded = frozenset(r for r, o in outcomes.items() if o.ok)
    sig_ev = _signal_evidence(signals)
    findings: list[Finding] = []
    earlier: Rung | None = None
    for rung in RUNGS:
        outcome = outcomes[rung]
        result = classify(signals, rung, outcome, earlier_failed=earlier, succeeded=succeeded)
        done = runs.get("userns" if rung in (Rung.userns, Rung.userns_map) else rung)
        tried = done is not None and outcome.untried is None
        extra = {"step": str(outcome.step) if outcome.step else "", "errno": str(outcome.errno),
                 "observed_by": "its own rung trial" if tried else "not tried",
                 "combined trial": combined}
        if not outcome.ok:
            extra.update(sig_ev)
        findings.append(Finding(
            str(rung), result.verdict, result.reason, _evidence(done, reports.get(rung), extra),
            {"cause": str(result.cause) if result.cause else None, "also": [str(c) for c in result.also],
             "errno": outcome.errno,
             "user": host.user, "step": str(outcome.step) if outcome.step else None,
             "observed_by": RUNG_TRIAL if tried else None},
        ))
        if not outcome.ok and earlier is None:
            earlier = rung
    return findings
