"""The user-namespace ladder on fake hosts: every classifier branch, from files in tmp_path and a fake
runner that answers each trial the way the real shape would (bwrap's real stderr lines from 0.8.0).

A forced failure makes the fake's combined trial fail too (one bwrap with every rung's flags fails
where any of them does), so these scenarios exercise the slow path: each rung its own trial."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from sandbox_conformance.probes import bwrap as bwrap_probe
from sandbox_conformance.probes import ladder
from sandbox_conformance.probes.classify import (
    RUNGS,
    Cause,
    Rung,
    Signals,
    Step,
    TrialOutcome,
    apparmor_enforcing,
    apparmor_mode,
    classify,
    wsl_of,
)
from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes.children import Completed

S, D, U, UNK = Verdict.supported, Verdict.denied, Verdict.unsupported, Verdict.unknown
ROOT_CAPS = "000001ffffffffff"
DOCKER_CAPS = "00000000a80425fb"  # Docker's default set: no CAP_SYS_ADMIN (bit 21)
NO_CAPS = "0000000000000000"
USER_INIT = 0xEFFFFFFD
PLAIN_MOUNTINFO = (
    "22 1 0:21 / / rw,relatime - ext4 /dev/sda1 rw\n"
    "23 22 0:22 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
    "24 23 0:23 / /proc/sys/fs/binfmt_misc rw,relatime - binfmt_misc binfmt_misc rw\n"
)
# Docker's masked and read-only paths (moby oci/defaults.go), as a container's mountinfo shows them.
DOCKER_MOUNTINFO = PLAIN_MOUNTINFO + "".join(
    f"{30 + i} 23 0:5 /null {p} rw,nosuid - devtmpfs udev rw\n"
    for i, p in enumerate(("/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sys", "/proc/bus")))
HIDEPID_MOUNTINFO = PLAIN_MOUNTINFO.replace("proc proc rw", "proc proc rw,hidepid=invisible")
# Issue 12's shapes, as `unshare -m` builds them on a real kernel (tests/test_host_shapes_proc.py):
# `mount -o bind,ro /proc/sys /proc/sys`, `mount -o remount,bind,ro /proc`, and hidepid on top of a
# masked file.
RO_PROC_SYS_MOUNTINFO = PLAIN_MOUNTINFO + (
    "25 23 0:22 /sys /proc/sys ro,nosuid,nodev,noexec,relatime - proc proc rw\n")
RO_PROC_MOUNTINFO = PLAIN_MOUNTINFO.replace("/proc rw,nosuid", "/proc ro,nosuid")
HIDEPID_MASKED_MOUNTINFO = HIDEPID_MOUNTINFO + "25 23 0:6 /null /proc/keys rw,nosuid - devtmpfs udev rw\n"

# bwrap 0.8.0's own stderr lines for these shapes (kept as evidence; the classifier must not need them).
NO_PERMISSION = ("bwrap: No permissions to creating new namespace, likely because the kernel does not "
                 "allow non-privileged user namespaces. On e.g. debian this can be enabled with "
                 "'sysctl kernel.unprivileged_userns_clone=1'.")
ENOSPC_LINE = ("bwrap: Creating new namespace failed: nesting depth or /proc/sys/user/max_*_namespaces "
               "exceeded (ENOSPC)")
UID_MAP_EPERM = "bwrap: setting up uid map: Permission denied"
PROC_EPERM = "bwrap: Can't mount proc on /newroot/proc: Operation not permitted"
NS_EPERM = "bwrap: Creating new namespace failed: Operation not permitted"
NS_EINVAL = "bwrap: Creating new namespace failed: Invalid argument"
NS_EAGAIN = "bwrap: Creating new namespace failed: Resource temporarily unavailable"
TMPFS_EPERM = "bwrap: Failed to mount tmpfs: Operation not permitted"
# bwrap 0.8.0 on 6.18 under a read-only /proc/sys and a read-only /proc (observed, issue 12).
RO_SYS_LINE = "bwrap: cannot open /proc/sys/user/max_user_namespaces: Read-only file system"
RO_MAP_LINE = "bwrap: setting up uid map: Read-only file system"
# bwrap 0.8.0 under an AppArmor profile without `userns,` (Debian 6.12, tests/test_host_shape_apparmor.py).
NS_EACCES = "bwrap: Creating new namespace failed: Permission denied"
DENY_LABEL = "sbxc-lab-deny (enforce)"


@dataclasses.dataclass(frozen=True)
class Shape:
    euid: int = 1000
    cap_eff: str = NO_CAPS
    seccomp: int = 0
    no_new_privs: int = 0
    unprivileged_userns_clone: int | None = None
    max_user_namespaces: int | None = 15000
    apparmor_restrict: int | None = None
    apparmor_label: str | None = None
    # securityfs's apparmor/features/namespaces/mask; None: no securityfs (no features directory).
    apparmor_ns_mask: str | None = None
    userns_ino: int = USER_INIT
    mountinfo: str = PLAIN_MOUNTINFO
    osrelease: str = "6.1.0-18-amd64"
    nproc: str = "63445"
    pids: tuple[int, int] | None = None  # (pids.max, pids.current) of our v1 pids cgroup
    bwrap: str | None = "0.8.0"
    bwrap_setuid: bool = False
    processes: int = 0  # /proc/<pid> entries owned by euid

    def status(self) -> dict[str, str]:
        return {"Uid": f"{self.euid}\t{self.euid}\t{self.euid}\t{self.euid}", "CapEff": self.cap_eff,
                "Seccomp": str(self.seccomp), "NoNewPrivs": str(self.no_new_privs)}


def done(stdout: str = "", stderr: str = "", rc: int | None = 0, **kw: Any) -> Completed:
    return Completed(("fake",), rc, stdout, stderr, 0.01, **kw)


def fail(stderr: str) -> Completed:
    return done("", stderr + "\n", 1)


Answer = Completed | Mapping[str, Any] | Callable[[Sequence[str]], Completed]


class FakeRunner:
    """Answers trials by mode (the last argv word of the inside program) and bwrap --version.
    A Mapping answer is merged into the default report; a Completed is returned as is."""

    def __init__(self, shape: Shape, answers: Mapping[str, Answer]) -> None:
        self.shape, self.answers, self.calls = shape, dict(answers), []

    def default(self, mode: str) -> dict[str, Any]:
        if mode == "userns":
            return {"uid": self.shape.euid, "gid": self.shape.euid, "status": self.shape.status(),
                    "apparmor": self.shape.apparmor_label,
                    "nproc_limit": int(self.shape.nproc) if self.shape.nproc.isdigit() else None,
                    "unshare": None, "setgroups": None, "uid_map": None, "gid_map": None}
        return {"netns": {"interfaces": ["lo"], "lo_up": True},
                "pidns": {"pid": 2, "proc_self": "2", "fresh_proc": True},
                "nested": {"nested_unshare": "ENOSPC", "max_user_namespaces": "2147483647"}}[mode]

    def combined(self, argv: tuple[str, ...]) -> Completed:
        """The combined trial (mode `all`): an explicit "all" answer, else what the rung answers imply.
        A rung forced to fail with a Completed (bwrap's words, a timeout) fails it the same way; a
        refused unshare or map write in the userns answer is bwrap's own clone or map write refused; a
        Mapping for a bwrap rung (lo down, nested allowed) is what the combined program sees too."""
        answer = self.answers.get("all")
        if callable(answer):
            return answer(argv)
        if isinstance(answer, Completed):
            return answer
        report: dict[str, Any] = {
            "uid": self.shape.euid, "gid": self.shape.euid, "status": self.shape.status(),
            "setgroups_read": "deny", "uid_map_read": f"{self.shape.euid} {self.shape.euid} 1",
            "gid_map_read": f"{self.shape.euid} {self.shape.euid} 1", "overflowuid": "65534",
            "net": "net:[4026532300]", "lo_flags": 73, "pid_ns": "pid:[4026532301]",
            **self.default("netns"), **self.default("pidns"), **self.default("nested"),
            "userns": "user:[4026532302]"}
        for mode in ("netns", "pidns", "nested"):
            rung = self.answers.get(mode)
            if callable(rung):
                return rung(argv)
            if isinstance(rung, Completed):
                return rung
            report.update(rung or {})
        userns = self.answers.get("userns")
        if callable(userns):
            return userns(argv)
        if isinstance(userns, Completed):
            return userns
        refused = [k for k in ("unshare", "setgroups", "uid_map", "gid_map") if (userns or {}).get(k)]
        if refused:
            return fail(f"bwrap: (fake) {refused[0]} refused: {userns[refused[0]]}")  # type: ignore[index]
        return done(json.dumps({**report, **(answer or {})}) + "\n")._replace(argv=argv)

    def __call__(self, argv: Sequence[str], *, timeout: float, input: str | None = None,
                 env: Mapping[str, str] | None = None, cwd: str | None = None) -> Completed:
        assert timeout > 0, "every trial has a timeout"
        argv = tuple(argv)
        self.calls.append(argv)
        if argv[-1] == "--version":
            answer = self.answers.get("version")
            if answer is None:
                return done(f"bubblewrap {self.shape.bwrap}\n")
            return answer(argv) if callable(answer) else answer  # type: ignore[return-value]
        mode = argv[-1]
        if mode == "all":
            return self.combined(argv)
        answer = self.answers.get(mode, {})
        if callable(answer):
            return answer(argv)
        if isinstance(answer, Completed):
            return answer
        return done(json.dumps({**self.default(mode), **answer}) + "\n")


def fake_host(tmp_path: Path, shape: Shape = Shape(), answers: Mapping[str, Answer] | None = None,
              as_user: str | None = None) -> tuple[Host, FakeRunner]:
    proc, sys_, bin_ = tmp_path / "proc", tmp_path / "sys", tmp_path / "bin"
    for d in (proc / "self/ns", proc / "self/attr/apparmor", proc / "sys/kernel", proc / "sys/user", bin_):
        d.mkdir(parents=True, exist_ok=True)
    (proc / "self/status").write_text("".join(f"{k}:\t{v}\n" for k, v in shape.status().items()))
    (proc / "self/mountinfo").write_text(shape.mountinfo)
    (proc / "sys/kernel/osrelease").write_text(shape.osrelease + "\n")
    (proc / "self/limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units\n"
        f"Max processes             {shape.nproc:<20} {shape.nproc:<20} processes\n")
    os.symlink(f"user:[{shape.userns_ino}]", proc / "self/ns/user")
    for pid in range(100, 100 + shape.processes):
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "status").write_text(f"Name:\tsh\nUid:\t{shape.euid}\t{shape.euid}\t0\t0\n")
    sysctls = {"sys/kernel/unprivileged_userns_clone": shape.unprivileged_userns_clone,
               "sys/user/max_user_namespaces": shape.max_user_namespaces,
               "sys/kernel/apparmor_restrict_unprivileged_userns": shape.apparmor_restrict}
    for rel, value in sysctls.items():
        if value is not None:
            (proc / rel).write_text(f"{value}\n")
    if shape.apparmor_label is not None:
        (proc / "self/attr/apparmor/current").write_text(shape.apparmor_label + "\n")
    if shape.apparmor_ns_mask is not None:
        features = sys_ / "kernel/security/apparmor/features"
        (features / "namespaces").mkdir(parents=True)
        if shape.apparmor_ns_mask:
            (features / "namespaces/mask").write_text(shape.apparmor_ns_mask + "\n")
    if shape.pids is not None:
        (proc / "self/cgroup").write_text("5:pids:/user.slice/job\n0::/user.slice/job\n")
        node = sys_ / "fs/cgroup/pids/user.slice/job"
        node.mkdir(parents=True)
        (node / "pids.max").write_text(f"{shape.pids[0]}\n")
        (node / "pids.current").write_text(f"{shape.pids[1]}\n")
    if shape.bwrap is not None:
        fake = bin_ / "bwrap"
        fake.write_text("#!/bin/false\n")
        fake.chmod(0o4755 if shape.bwrap_setuid else 0o755)
    runner = FakeRunner(shape, answers or {})
    host = Host(root=tmp_path, proc=proc, sys=sys_, env={"PATH": str(bin_)}, runner=runner,
                euid=shape.euid, as_user=as_user)
    return host, runner


def verdicts(findings: list[Finding]) -> dict[str, tuple[Verdict, str | None]]:
    return {f.probe: (f.verdict, f.facts["cause"]) for f in findings}


def ladder_of(*pairs: tuple[Verdict, str | None]) -> dict[str, tuple[Verdict, str | None]]:
    assert len(pairs) == len(RUNGS)
    return {str(r): p for r, p in zip(RUNGS, pairs, strict=True)}


OK = (S, None)


def raise_eagain(argv: Sequence[str]) -> Completed:
    raise BlockingIOError(11, "Resource temporarily unavailable")
BWRAP_ALL = ("netns", "pidns", "nested")


def every_bwrap(completed: Completed) -> dict[str, Answer]:
    return dict.fromkeys(BWRAP_ALL, completed)


# (shape, trial answers, expected ladder: userns, userns.map, netns, pidns.proc, disable_userns)
SCENARIOS: dict[str, tuple[Shape, dict[str, Answer], dict[str, tuple[Verdict, str | None]]]] = {
    "healthy host": (Shape(), {}, ladder_of(OK, OK, OK, OK, OK)),
    # Ubuntu 24.04: the namespace is created, the maps are refused, bwrap dies writing its uid map.
    "apparmor restriction": (
        Shape(apparmor_restrict=1, apparmor_label="unconfined"),
        {"userns": {"uid_map": "EPERM"}, **every_bwrap(fail(UID_MAP_EPERM))},
        ladder_of(OK, (D, "apparmor"), (D, "apparmor"), (D, "apparmor"), (D, "apparmor"))),
    # Upstream 6.7+: the caller is confined by a profile in enforce mode that has no `userns,`; the
    # kernel refuses its unshare and bwrap's clone with EACCES (was: unclassified, then earlier_rung).
    "apparmor profile without userns": (
        Shape(apparmor_label=DENY_LABEL, apparmor_ns_mask="userns_create"),
        {"userns": {"unshare": "EACCES"}, **every_bwrap(fail(NS_EACCES))},
        ladder_of((D, "apparmor"), (UNK, "earlier_rung"), *[(D, "apparmor")] * 3)),
    "apparmor profile without userns, as root": (
        Shape(euid=0, cap_eff=ROOT_CAPS, apparmor_label=DENY_LABEL, apparmor_ns_mask="userns_create"),
        {"userns": {"unshare": "EACCES"}, **every_bwrap(fail(NS_EACCES))},
        ladder_of((D, "apparmor"), (UNK, "earlier_rung"), *[(D, "apparmor")] * 3)),
    # securityfs not mounted (a container): the confined label and EACCES still name it.
    "apparmor profile without userns, no securityfs": (
        Shape(apparmor_label=DENY_LABEL),
        {"userns": {"unshare": "EACCES"}, **every_bwrap(fail(NS_EACCES))},
        ladder_of((D, "apparmor"), (UNK, "earlier_rung"), *[(D, "apparmor")] * 3)),
    # The same refusal where AppArmor is not the reason: a kernel whose AppArmor does not mediate user
    # namespaces (before 6.7), a profile in complain mode (it logs, never refuses), no confinement.
    "EACCES under a kernel that does not mediate userns": (
        Shape(apparmor_label=DENY_LABEL, apparmor_ns_mask=""),
        {"userns": {"unshare": "EACCES"}, **every_bwrap(fail(NS_EACCES))},
        ladder_of((D, "unclassified"), (UNK, "earlier_rung"), *[(UNK, "earlier_rung")] * 3)),
    "EACCES under a profile in complain mode": (
        Shape(apparmor_label="sbxc-lab-deny (complain)", apparmor_ns_mask="userns_create"),
        {"userns": {"unshare": "EACCES"}, **every_bwrap(fail(NS_EACCES))},
        ladder_of((D, "unclassified"), (UNK, "earlier_rung"), *[(UNK, "earlier_rung")] * 3)),
    "EACCES unconfined": (
        Shape(apparmor_label="unconfined", apparmor_ns_mask="userns_create"),
        {"userns": {"unshare": "EACCES"}, **every_bwrap(fail(NS_EACCES))},
        ladder_of((D, "unclassified"), (UNK, "earlier_rung"), *[(UNK, "earlier_rung")] * 3)),
    # The profile lets our own unshare through (it has `userns,`): a later EACCES is not its missing rule.
    "confined, userns allowed, bwrap refused": (
        Shape(apparmor_label="sbxc-lab-allow (enforce)", apparmor_ns_mask="userns_create"),
        every_bwrap(fail(UID_MAP_EPERM)),
        ladder_of(OK, OK, (D, "unclassified"), *[(UNK, "earlier_rung")] * 2)),
    "debian unprivileged_userns_clone=0": (
        Shape(unprivileged_userns_clone=0),
        {"userns": {"unshare": "EPERM"}, **every_bwrap(fail(NO_PERMISSION))},
        ladder_of(*[(D, "unprivileged_userns_clone")] * 1, (UNK, "earlier_rung"),
                  *[(D, "unprivileged_userns_clone")] * 3)),
    "max_user_namespaces=0": (
        Shape(max_user_namespaces=0),
        {"userns": {"unshare": "ENOSPC"}, **every_bwrap(fail(ENOSPC_LINE))},
        ladder_of((D, "max_user_namespaces"), (UNK, "earlier_rung"), *[(D, "max_user_namespaces")] * 3)),
    # `docker run` with the default seccomp profile and capability set, as root in the container.
    "docker default seccomp": (
        Shape(euid=0, cap_eff=DOCKER_CAPS, seccomp=2, mountinfo=DOCKER_MOUNTINFO),
        {"userns": {"unshare": "EPERM"}, **every_bwrap(fail(NS_EPERM))},
        ladder_of((D, "seccomp"), (UNK, "earlier_rung"), *[(D, "seccomp")] * 3)),
    # CAP_SYS_ADMIN added (seccomp then allows namespaces) but Docker's masked paths remain.
    "masked /proc": (
        Shape(euid=0, cap_eff=ROOT_CAPS, seccomp=2, mountinfo=DOCKER_MOUNTINFO),
        {"pidns": fail(PROC_EPERM)},
        ladder_of(OK, OK, OK, (D, "masked_proc"), OK)),
    # hidepid's known failure is the uid map write (bubblewrap#198, Debian 4.9): named there.
    "hidepid refusing the uid map": (
        Shape(mountinfo=HIDEPID_MOUNTINFO),
        {"userns": {"uid_map": "EPERM"}, **every_bwrap(fail(UID_MAP_EPERM))},
        ladder_of(OK, *[(D, "hidepid")] * 4)),
    # mnt_already_visible never looks at hidepid: where our own map write worked, a procfs refusal is
    # not hidepid's (hidepid=2 alone leaves pidns.proc supported on 6.18, observed).
    "hidepid with the uid map working": (
        Shape(mountinfo=HIDEPID_MOUNTINFO), {"pidns": fail(PROC_EPERM)},
        ladder_of(OK, OK, OK, (D, "unclassified"), OK)),
    "hidepid over a masked file": (
        Shape(mountinfo=HIDEPID_MASKED_MOUNTINFO), {"pidns": fail(PROC_EPERM)},
        ladder_of(OK, OK, OK, (D, "masked_proc"), OK)),
    # A read-only bind over /proc/sys: a locked sub-mount for the procfs rung, and --disable-userns
    # cannot write max_user_namespaces (was: earlier_rung).
    "read-only /proc/sys": (
        Shape(euid=0, cap_eff=ROOT_CAPS, mountinfo=RO_PROC_SYS_MOUNTINFO),
        {"pidns": fail(PROC_EPERM), "nested": fail(RO_SYS_LINE)},
        ladder_of(OK, OK, OK, (D, "masked_proc"), (D, "readonly_proc_sys"))),
    # A read-only /proc: every map write gets EROFS (was: unclassified, then earlier_rung).
    "read-only /proc": (
        Shape(euid=0, cap_eff=ROOT_CAPS, mountinfo=RO_PROC_MOUNTINFO),
        {"userns": {"setgroups": "EROFS"}, **every_bwrap(fail(RO_MAP_LINE))},
        ladder_of(OK, *[(D, "readonly_proc")] * 4)),
    # Inside `bwrap --unshare-user --disable-userns`: local sysctl INT_MAX, the parent's is 1.
    "nested under --disable-userns": (
        Shape(userns_ino=4026532179, max_user_namespaces=2147483647, no_new_privs=1),
        {"userns": {"unshare": "ENOSPC"}, **every_bwrap(fail(ENOSPC_LINE))},
        ladder_of((D, "nested"), (UNK, "earlier_rung"), *[(D, "nested")] * 3)),
    "nested, older bwrap wording": (
        Shape(userns_ino=4026532179, max_user_namespaces=2147483647),
        {"userns": {"unshare": "ENOSPC"},
         **every_bwrap(fail("bwrap: Creating new namespace failed: No space left on device"))},
        ladder_of((D, "nested"), (UNK, "earlier_rung"), *[(D, "nested")] * 3)),
    "wsl1": (
        Shape(osrelease="4.4.0-19041-Microsoft", max_user_namespaces=None),
        {"userns": {"unshare": "EINVAL"}, **every_bwrap(fail(NS_EINVAL))},
        ladder_of((U, "wsl1"), (UNK, "earlier_rung"), *[(U, "wsl1")] * 3)),
    "wsl2 works": (Shape(osrelease="5.15.90.1-microsoft-standard-WSL2"), {}, ladder_of(OK, OK, OK, OK, OK)),
    # Our unshare works, the setuid bwrap refuses (no errno in its message): the setuid mode is why.
    "setuid bwrap": (
        Shape(bwrap_setuid=True),
        every_bwrap(fail("bwrap: Unexpected capabilities but not setuid, old file caps config?")),
        ladder_of(OK, OK, *[(D, "setuid_bwrap")] * 3)),
    # Root in a container with seccomp off but no CAP_SYS_ADMIN and no masks.
    "root without CAP_SYS_ADMIN": (
        Shape(euid=0, cap_eff=DOCKER_CAPS),
        {"netns": fail(TMPFS_EPERM), "pidns": fail(PROC_EPERM), "nested": fail(TMPFS_EPERM)},
        ladder_of(OK, OK, *[(D, "no_cap_sys_admin")] * 3)),
    "pids.max reached": (
        Shape(pids=(64, 64)), every_bwrap(fail(NS_EAGAIN)),
        ladder_of(OK, OK, *[(D, "pids_max")] * 3)),
    "RLIMIT_NPROC": (
        Shape(nproc="40", processes=40, pids=(4096, 12)), every_bwrap(fail(NS_EAGAIN)),
        ladder_of(OK, OK, *[(D, "nproc")] * 3)),
    "EAGAIN with room under both limits": (
        Shape(nproc="40", processes=3, pids=(4096, 12)), every_bwrap(fail(NS_EAGAIN)),
        ladder_of(OK, OK, (D, "unclassified"), *[(UNK, "earlier_rung")] * 2)),
    "no bwrap": (Shape(bwrap=None), {}, ladder_of(OK, OK, *[(U, "no_bwrap")] * 3)),
    "bwrap too old for --disable-userns": (
        Shape(bwrap="0.4.0"),
        {"version": lambda argv: (fail("bwrap: Unknown option --disable-userns") if "--disable-userns" in argv
                                  else done("bubblewrap 0.4.0\n"))},
        ladder_of(OK, OK, OK, OK, (U, "bwrap_too_old"))),
    "--disable-userns not effective": (
        Shape(), {"nested": {"nested_unshare": None}}, ladder_of(OK, OK, OK, OK, (U, "not_effective"))),
    "lo down": (Shape(), {"netns": {"lo_up": False}}, ladder_of(OK, OK, (U, "not_effective"), OK, OK)),
    "timeout": (
        Shape(), {"pidns": done("", "", None, timed_out=True)}, ladder_of(OK, OK, OK, (UNK, "timeout"), OK)),
    "nothing explains it": (
        Shape(), {"userns": {"unshare": "EPERM"}, **every_bwrap(fail("bwrap: something new went wrong"))},
        ladder_of((D, "unclassified"), (UNK, "earlier_rung"), *[(UNK, "earlier_rung")] * 3)),
    "map refused with no signal": (
        Shape(), {"userns": {"setgroups": "EACCES"}}, ladder_of(OK, (D, "unclassified"), OK, OK, OK)),
    # setpriv could not start the interpreter: nothing is learnt about the kernel, nothing is blamed.
    "trial could not run": (
        Shape(apparmor_restrict=1),
        {"userns": done("", "setpriv: failed to execute /usr/bin/python3: Permission denied\n", 127)},
        ladder_of((UNK, "trial_failed"), (UNK, "earlier_rung"), OK, OK, OK)),
    # fork() itself fails: the runner raises BlockingIOError; the ladder reports it, classified.
    "fork refused by pids.max": (
        Shape(pids=(64, 64)), {"userns": raise_eagain, **every_bwrap(fail(NS_EAGAIN))},
        ladder_of((D, "pids_max"), (UNK, "earlier_rung"), *[(D, "pids_max")] * 3)),
    "bwrap found but cannot run": (
        Shape(), {"version": done("", "", None, timed_out=True)},
        ladder_of(OK, OK, *[(U, "no_bwrap")] * 3)),
    "proc not fresh": (
        Shape(), {"pidns": {"fresh_proc": False}}, ladder_of(OK, OK, OK, (U, "not_effective"), OK)),
    "kernel without user namespaces": (
        Shape(max_user_namespaces=None), {"userns": {"unshare": "EINVAL"}},
        ladder_of((U, "unclassified"), (UNK, "earlier_rung"), OK, OK, OK)),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_each_shape_gets_its_classification_on_every_rung(tmp_path: Path, name: str) -> None:
    shape, answers, expected = SCENARIOS[name]
    host, _ = fake_host(tmp_path, shape, answers)
    findings = ladder.probe(host)
    assert [f.probe for f in findings] == [str(r) for r in RUNGS], "all five ids, in ladder order"
    assert verdicts(findings) == expected
    for f in findings:
        assert "\n" not in f.reason and f.reason
        assert f.facts["user"] == host.user
        if f.verdict is not S:
            assert f.facts["cause"], f"{f.probe}: a failure always names a cause"


def test_bwrap_stderr_is_kept_as_evidence_not_used_as_the_decision(tmp_path: Path) -> None:
    """The same signals with a bwrap message we have never seen still give the seccomp cause."""
    shape = Shape(euid=0, cap_eff=DOCKER_CAPS, seccomp=2)
    host, _ = fake_host(tmp_path, shape, {"userns": {"unshare": "EPERM"},
                                         **every_bwrap(fail("bwrap: une erreur inconnue"))})
    by = {f.probe: f for f in ladder.probe(host)}
    assert by["netns"].facts["cause"] == "seccomp"
    assert by["netns"].evidence["stderr"] == "bwrap: une erreur inconnue"
    assert by["netns"].evidence["Seccomp"] == "2"


def test_docker_reason_names_seccomp_and_cap_sys_admin(tmp_path: Path) -> None:
    shape, answers, _ = SCENARIOS["docker default seccomp"]
    host, _ = fake_host(tmp_path, shape, answers)
    by = {f.probe: f for f in ladder.probe(host)}
    assert "seccomp" in by["userns"].reason and "CAP_SYS_ADMIN" in by["userns"].reason
    # The weaker causes stay visible: the masks would refuse the procfs rung even without seccomp.
    assert by["pidns.proc"].facts["also"] == ["masked_proc", "no_cap_sys_admin"]
    assert by["userns"].facts["also"] == ["no_cap_sys_admin"]


def test_hidepid_is_not_added_where_the_uid_map_worked(tmp_path: Path) -> None:
    """Issue 12: hidepid over a masked file gave `also: [hidepid]`, though hidepid alone leaves the
    rung supported; only a map write that really failed makes it a candidate."""
    shape, answers, _ = SCENARIOS["hidepid over a masked file"]
    host, _ = fake_host(tmp_path, shape, answers)
    by = {f.probe: f for f in ladder.probe(host)}
    assert by["pidns.proc"].facts["also"] == []
    assert "/proc/keys" in by["pidns.proc"].reason


def test_a_read_only_proc_sys_is_its_own_cause_with_bwraps_words_as_evidence(tmp_path: Path) -> None:
    shape, answers, _ = SCENARIOS["read-only /proc/sys"]
    host, _ = fake_host(tmp_path, shape, answers)
    f = {f.probe: f for f in ladder.probe(host)}["disable_userns"]
    assert (f.facts["cause"], f.facts["errno"]) == ("readonly_proc_sys", "EROFS")
    assert f.evidence["stderr"] == RO_SYS_LINE
    assert f.evidence["/proc/sys read-only"] == "True"
    assert "systempaths=unconfined" in f.reason


def test_a_read_only_proc_sys_is_classified_from_the_mount_table_not_the_words(tmp_path: Path) -> None:
    shape = SCENARIOS["read-only /proc/sys"][0]
    host, _ = fake_host(tmp_path, shape, {"pidns": fail(PROC_EPERM), "nested": fail("bwrap: ???")})
    assert verdicts(ladder.probe(host))["disable_userns"] == (D, "readonly_proc_sys")
    # The same words on a writable /proc/sys name no such cause.
    host, _ = fake_host(tmp_path / "rw", Shape(), {"nested": fail(RO_SYS_LINE)})
    assert verdicts(ladder.probe(host))["disable_userns"][1] == "unclassified"


def test_a_read_only_proc_reason_names_it(tmp_path: Path) -> None:
    shape, answers, _ = SCENARIOS["read-only /proc"]
    host, _ = fake_host(tmp_path, shape, answers)
    f = {f.probe: f for f in ladder.probe(host)}["userns.map"]
    assert (f.facts["step"], f.facts["errno"]) == ("setgroups", "EROFS")
    assert "/proc is mounted read-only" in f.reason


@pytest.mark.parametrize(("mountinfo", "path", "expected"), [
    (PLAIN_MOUNTINFO, "/proc/self", False),
    (PLAIN_MOUNTINFO, "/proc/sys/user", False),
    (RO_PROC_SYS_MOUNTINFO, "/proc/sys/user", True),
    (RO_PROC_SYS_MOUNTINFO, "/proc/self", False),
    (RO_PROC_SYS_MOUNTINFO, "/proc/system", False),  # component-wise, not a string prefix
    (RO_PROC_MOUNTINFO, "/proc/self", True),
    (RO_PROC_MOUNTINFO, "/proc/sys/user", True),
    # ro in the superblock options refuses writes too
    ("1 0 0:1 / / rw - ext4 /dev/sda rw\n2 1 0:2 / /proc rw - proc proc ro\n", "/proc/self", True),
    # a stack on one mount point: the last listed is on top
    (RO_PROC_MOUNTINFO + "40 23 0:40 / /proc rw,relatime - proc proc rw\n", "/proc/self", False),
    ("", "/proc/self", None),
])
def test_readonly_at_reads_the_serving_mount(mountinfo: str, path: str, expected: bool | None) -> None:
    assert ladder.readonly_at(mountinfo, path) is expected


def test_process_signals_come_from_the_trial_user_not_from_us(tmp_path: Path) -> None:
    """As root we hold CAP_SYS_ADMIN (AppArmor's restriction exempts us); the user the trial ran as
    does not, and the userns child reports that: the cause must be apparmor."""
    shape = Shape(euid=0, cap_eff=ROOT_CAPS, apparmor_restrict=1)
    theirs = {"uid": 1001, "status": {"CapEff": NO_CAPS, "Seccomp": "0", "NoNewPrivs": "0"},
              "apparmor": "unconfined", "uid_map": "EPERM"}
    host, runner = fake_host(tmp_path, shape, {"userns": theirs, **every_bwrap(fail(UID_MAP_EPERM))},
                             as_user="bob")
    findings = ladder.probe(host)
    assert verdicts(findings)["userns.map"] == (D, "apparmor")
    assert all(f.facts["user"] == "bob" for f in findings)
    assert runner.calls and all(c[:2] == ("setpriv", "--reuid=bob") for c in runner.calls)


def test_an_apparmor_profile_without_userns_is_named_with_its_label_and_the_way_on(tmp_path: Path) -> None:
    shape, answers, _ = SCENARIOS["apparmor profile without userns"]
    host, _ = fake_host(tmp_path, shape, answers)
    by = {f.probe: f for f in ladder.probe(host)}
    f = by["userns"]
    assert (f.facts["step"], f.facts["errno"]) == ("unshare", "EACCES")
    assert DENY_LABEL in f.reason and "`userns,`" in f.reason and "profile sbxc-lab-deny" in f.reason
    assert "apparmor_restrict_unprivileged_userns" not in f.reason  # not Ubuntu's sysctl: absent here
    assert f.evidence["apparmor_label"] == DENY_LABEL
    assert f.evidence["apparmor userns mediation"] == "True"
    assert by["netns"].evidence["stderr"] == NS_EACCES  # bwrap's words, kept as evidence only


def test_the_apparmor_profile_cause_rests_on_the_signals_not_on_bwraps_words(tmp_path: Path) -> None:
    shape = SCENARIOS["apparmor profile without userns"][0]
    unknown_words = fail("bwrap: une erreur inconnue: Permission denied")
    host, _ = fake_host(tmp_path, shape, {"userns": {"unshare": "EACCES"}, **every_bwrap(unknown_words)})
    assert verdicts(ladder.probe(host)) == SCENARIOS["apparmor profile without userns"][2]
    # The same words and errnos without the confined label name no AppArmor cause.
    _, answers, _ = SCENARIOS["apparmor profile without userns"]
    host, _ = fake_host(tmp_path / "unconfined", Shape(apparmor_ns_mask="userns_create"), answers)
    assert verdicts(ladder.probe(host))["userns"] == (D, "unclassified")


@pytest.mark.parametrize(("label", "mode", "enforcing"), [
    ("unconfined", "unconfined", False),
    ("sbxc-lab-deny (enforce)", "enforce", True),
    ("/usr/bin/man (complain)", "complain", False),
    ("docker-default (enforce)\x00", "enforce", True),
    ("firefox (unconfined)", "unconfined", False),  # AppArmor 4's flags=(unconfined) profiles
    ("a//&b (mixed)", "mixed", True),
    ("strict (kill)", "kill", True),
    (None, None, False),
    ("garbage", None, False),
])
def test_apparmor_mode_from_the_label(label: str | None, mode: str | None, enforcing: bool) -> None:
    assert apparmor_mode(label) == mode
    assert apparmor_enforcing(label) is enforcing


@pytest.mark.parametrize(("mask", "expected"), [
    (None, None),  # no securityfs: unknown
    ("userns_create", True),  # upstream 6.7+ (Debian's 6.12: exactly this)
    ("", False),  # AppArmor without the mediation (before 6.7)
])
def test_the_userns_mediation_signal_comes_from_securityfs(tmp_path: Path, mask: str | None,
                                                           expected: bool | None) -> None:
    host, _ = fake_host(tmp_path, Shape(apparmor_ns_mask=mask))
    assert ladder.gather_signals(host).apparmor_userns is expected


def test_a_healthy_host_is_answered_by_one_combined_bwrap(tmp_path: Path) -> None:
    """The benchmark's budget (issue 15): the `bwrap` probe and the ladder share one `bwrap --version`,
    and the ladder makes ONE launch, the combined trial, with every rung's flags."""
    host, runner = fake_host(tmp_path)
    bwrap_probe.probe(host)
    findings = ladder.probe(host)
    assert sorted(c[-1] for c in runner.calls) == ["--version", "all"]
    [combined] = [c for c in runner.calls if c[-1] == "all"]
    flags = combined[:combined.index("--")]
    for flag in ("--unshare-user", "--unshare-net", "--unshare-pid", "--disable-userns", "--die-with-parent"):
        assert flag in flags
    assert flags[flags.index("--proc") + 1] == "/proc"
    assert verdicts(findings) == ladder_of(OK, OK, OK, OK, OK)


def test_each_fast_finding_says_the_combined_trial_answered_it_and_what_it_saw(tmp_path: Path) -> None:
    host, _ = fake_host(tmp_path)
    by = {f.probe: f for f in ladder.probe(host)}
    for f in by.values():
        assert f.facts["observed_by"] == "combined"
        assert "combined trial" in f.evidence["observed_by"]
        assert f.evidence["observed"], "the observation that answered this rung"
        assert json.loads(f.evidence["report"])["nested_unshare"] == "ENOSPC"
        assert f.evidence["argv"].startswith(str(tmp_path / "bin/bwrap") + " --unshare-user")
        assert f.evidence["argv"].endswith("-I -S -c <_inside_ladder.py> all")
    assert "user:[4026532302]" in by["userns"].evidence["observed"]
    assert by["userns"].evidence["userns_outer"] == f"user:[{USER_INIT}]"
    assert "uid_map 1000 1000 1" in by["userns.map"].evidence["observed"]
    assert "lo up" in by["netns"].evidence["observed"]
    assert "ENOSPC" in by["disable_userns"].evidence["observed"]


def test_a_forced_failure_walks_every_rung_and_keeps_the_combined_trial_as_evidence(tmp_path: Path) -> None:
    host, runner = fake_host(tmp_path, Shape(), {"pidns": fail(PROC_EPERM)})
    by = {f.probe: f for f in ladder.probe(host)}
    assert sorted(c[-1] for c in runner.calls) == ["--version", "all", "nested", "netns", "pidns", "userns"]
    assert all(f.facts["observed_by"] == "rung" for f in by.values())
    assert all(f.evidence["observed_by"] == "its own rung trial" for f in by.values())
    assert by["pidns.proc"].evidence["combined trial"] == f"exit 1: {PROC_EPERM}"
    assert by["pidns.proc"].evidence["stderr"] == PROC_EPERM  # the rung's own trial, as before


def test_a_rung_left_untried_says_no_trial_answered_it(tmp_path: Path) -> None:
    shape, answers, _ = SCENARIOS["max_user_namespaces=0"]
    host, _ = fake_host(tmp_path, shape, answers)
    by = {f.probe: f for f in ladder.probe(host)}
    assert (by["userns"].facts["observed_by"], by["userns.map"].facts["observed_by"]) == ("rung", None)
    assert by["userns.map"].evidence["observed_by"] == "not tried"
    host, _ = fake_host(tmp_path / "nobwrap", Shape(bwrap=None))
    by = {f.probe: f for f in ladder.probe(host)}
    assert by["netns"].facts["observed_by"] is None
    assert by["netns"].evidence["combined trial"] == "not tried: no bwrap on PATH"


def test_a_rung_the_combined_trial_leaves_unanswered_is_answered_by_its_own_trial(tmp_path: Path) -> None:
    """lo down only in the combined trial: its own netns trial sees lo up, so netns is supported, from
    that trial, and the disagreement stays in the evidence."""
    host, runner = fake_host(tmp_path, Shape(), {"all": {"lo_up": False, "lo_flags": 8}})
    by = {f.probe: f for f in ladder.probe(host)}
    assert verdicts(list(by.values())) == ladder_of(OK, OK, OK, OK, OK)
    assert by["netns"].facts["observed_by"] == "rung"
    assert "did not answer netns: lo not up (8)" in by["netns"].evidence["combined trial"]
    assert len(runner.calls) == 6


def test_a_setuid_bwrap_is_never_asked_for_the_combined_trial(tmp_path: Path) -> None:
    """A setuid bwrap makes its namespaces with privilege: its success says nothing about an
    unprivileged user namespace."""
    host, runner = fake_host(tmp_path, Shape(bwrap_setuid=True))
    by = {f.probe: f for f in ladder.probe(host)}
    assert "all" not in [c[-1] for c in runner.calls]
    assert by["netns"].evidence["combined trial"].startswith("not tried: ")
    assert "setuid" in by["netns"].evidence["combined trial"]


def test_a_bwrap_without_disable_userns_does_not_answer_from_the_combined_trial(tmp_path: Path) -> None:
    shape, answers, expected = SCENARIOS["bwrap too old for --disable-userns"]
    host, _ = fake_host(tmp_path, shape, answers)
    by = {f.probe: f for f in ladder.probe(host)}
    assert verdicts(list(by.values())) == expected
    assert "lacks --disable-userns" in by["userns"].evidence["combined trial"]


def test_the_fast_path_can_be_turned_off(tmp_path: Path) -> None:
    host, runner = fake_host(tmp_path)
    by = {f.probe: f for f in ladder.probe(host, fast=False)}
    assert "all" not in [c[-1] for c in runner.calls]
    assert all(f.ok and f.facts["observed_by"] == "rung" for f in by.values())


def test_trial_argv_runs_the_stdlib_program_isolated(tmp_path: Path) -> None:
    host, runner = fake_host(tmp_path, Shape(), {"all": fail("bwrap: forced")})
    ladder.probe(host)
    by_mode = {c[-1]: c for c in runner.calls}
    for mode in ("all", "userns", "netns", "pidns", "nested"):
        argv = by_mode[mode]
        i = argv.index("-c")
        assert argv[i - 2:i] == ("-I", "-S")
        assert argv[i + 1] == ladder.INSIDE.read_text()
    assert "--disable-userns" in by_mode["nested"] and "--unshare-user" in by_mode["nested"]
    assert "--unshare-net" in by_mode["netns"]
    assert by_mode["pidns"][by_mode["pidns"].index("--proc") + 1] == "/proc"


OUTER = "user:[4026531837]"
GOOD = {"userns": "user:[4026532250]", "uid": 1000, "setgroups_read": "deny", "uid_map_read": "1000 1000 1",
        "gid_map_read": "1000 1000 1", "lo_up": True, "lo_flags": 73, "fresh_proc": True, "proc_self": "2",
        "pid": 2, "nested_unshare": "ENOSPC"}


@pytest.mark.parametrize(("change", "outer", "unanswered"), [
    ({}, OUTER, set()),
    ({"setgroups_read": "!ENOENT"}, OUTER, set()),  # a kernel before 3.19: no setgroups file
    ({"userns": OUTER}, OUTER, {Rung.userns}),  # never left our user namespace
    ({}, None, {Rung.userns}),  # ours could not be read: nothing to compare with
    ({"uid_map_read": ""}, OUTER, {Rung.userns_map}),
    ({"uid": 65534}, OUTER, {Rung.userns_map}),  # the overflow uid: our uid is not in the map
    ({"gid_map_read": "!EACCES"}, OUTER, {Rung.userns_map}),
    ({"setgroups_read": "allow"}, OUTER, {Rung.userns_map}),
    ({"lo_up": False}, OUTER, {Rung.netns}),
    ({"fresh_proc": False}, OUTER, {Rung.pidns_proc}),
    ({"nested_unshare": None}, OUTER, {Rung.disable_userns}),
    ({"nested_unshare": "EPERM"}, OUTER, {Rung.disable_userns}),
])
def test_combined_observations_answer_a_rung_only_with_the_fact_its_own_trial_checks(
        change: dict[str, Any], outer: str | None, unanswered: set[Rung]) -> None:
    answered, missing = ladder.combined_observations({**GOOD, **change}, outer)
    assert set(missing) == unanswered
    assert set(answered) == set(RUNGS) - unanswered


OUR_NS = {"net": "net:[4026531840]", "pid": "pid:[4026531836]"}


@pytest.mark.parametrize(("change", "unanswered"), [
    ({"net": "net:[4026532300]", "pid_ns": "pid:[4026532301]"}, set()),
    # A bwrap (or a wrapper named bwrap) that ran the trial in our own namespaces: lo is up there and
    # our own /proc's /proc/self is our pid too, so only the namespace itself tells.
    ({"net": OUR_NS["net"], "pid_ns": "pid:[4026532301]"}, {Rung.netns}),
    ({"net": "net:[4026532300]", "pid_ns": OUR_NS["pid"]}, {Rung.pidns_proc}),
])
def test_a_trial_in_our_own_network_or_pid_namespace_answers_neither(change: dict[str, Any],
                                                                       unanswered: set[Rung]) -> None:
    _, missing = ladder.combined_observations({**GOOD, **change}, OUTER, OUR_NS)
    assert set(missing) == unanswered
    for rung, key in ((Rung.netns, "net"), (Rung.pidns_proc, "pid_ns")):
        report = {"lo_up": True, "fresh_proc": True, key: change[key]}
        done = Completed(("bwrap",), 0, json.dumps(report) + "\n", "", 0.1)
        outcome, _ = ladder.bwrap_outcome(rung, done, OUR_NS)
        assert outcome.ok is (rung not in unanswered), (rung, outcome)
        if not outcome.ok:
            got = classify(Signals(), rung, outcome)
            assert (got.verdict, got.cause) == (Verdict.unsupported, Cause.not_effective)
            assert "our own namespace" in got.reason


def test_no_combined_report_answers_nothing() -> None:
    answered, missing = ladder.combined_observations(None, OUTER)
    assert not answered and set(missing) == set(RUNGS)


# ------------------------------------------------------------------ the pure pieces, as tables

@pytest.mark.parametrize(("signals", "rung", "outcome", "expected"), [
    # ENOSPC: local 0 is the sysctl; local non-zero means a parent disabled nesting.
    (Signals(max_user_namespaces=0), Rung.userns, TrialOutcome(False, Step.unshare, "ENOSPC"),
     (D, Cause.max_user_namespaces)),
    (Signals(max_user_namespaces=5), Rung.userns, TrialOutcome(False, Step.unshare, "ENOSPC"), (D,
                                                                                                Cause.nested)),
    # ...unless we are in the initial user namespace, which has no parent: our own count is at the limit.
    (Signals(max_user_namespaces=5, userns_initial=True), Rung.userns,
     TrialOutcome(False, Step.unshare, "ENOSPC"), (D, Cause.max_user_namespaces)),
    (Signals(max_user_namespaces=5, userns_initial=False), Rung.userns,
     TrialOutcome(False, Step.unshare, "ENOSPC"), (D, Cause.nested)),
    # CAP_SYS_ADMIN exempts from AppArmor's restriction and from Docker's seccomp rule.
    (Signals(apparmor_restrict=1, cap_eff=int(ROOT_CAPS, 16)), Rung.userns_map,
     TrialOutcome(False, Step.uid_map, "EPERM"), (D, Cause.unclassified)),
    (Signals(seccomp=2, cap_eff=int(ROOT_CAPS, 16)), Rung.userns, TrialOutcome(False, Step.unshare, "EPERM"),
     (D, Cause.unclassified)),
    (Signals(seccomp=2, cap_eff=0, euid=1000), Rung.userns, TrialOutcome(False, Step.unshare, "EPERM"),
     (D, Cause.seccomp)),
    # EACCES is an LSM's answer (SELinux, a BPF LSM), never Docker's filter: a unit's SystemCallFilter=
    # (Seccomp: 2) beside it is no cause.
    (Signals(seccomp=2, cap_eff=0, euid=1000), Rung.userns, TrialOutcome(False, Step.unshare, "EACCES"),
     (D, Cause.unclassified)),
    # Masks only explain the procfs rung.
    (Signals(proc_masks=("/proc/kcore",)), Rung.netns, TrialOutcome(False, Step.bwrap, "EPERM"),
     (D, Cause.unclassified)),
    (Signals(proc_masks=("/proc/kcore",)), Rung.pidns_proc, TrialOutcome(False, Step.bwrap, "EPERM"),
     (D, Cause.masked_proc)),
    # EAGAIN with neither limit near: no cause invented.
    (Signals(), Rung.netns, TrialOutcome(False, Step.bwrap, "EAGAIN"), (D, Cause.unclassified)),
    (Signals(), Rung.netns, TrialOutcome(False, Step.bwrap, None), (UNK, Cause.unclassified)),
    (Signals(kernel_userns=False), Rung.userns, TrialOutcome(False, Step.unshare, "EINVAL"),
     (U, Cause.no_kernel_userns)),
])
def test_classify_table(signals: Signals, rung: Rung, outcome: TrialOutcome,
                        expected: tuple[Verdict, Cause]) -> None:
    got = classify(signals, rung, outcome)
    assert (got.verdict, got.cause) == expected


def test_a_blocker_ruled_out_by_a_working_rung_is_not_blamed() -> None:
    """unprivileged_userns_clone=0 cannot explain a bwrap failure when our own unshare worked."""
    s = Signals(unprivileged_userns_clone=0, euid=1000, cap_eff=0)
    outcome = TrialOutcome(False, Step.bwrap, None)
    assert classify(s, Rung.netns, outcome).cause is Cause.unprivileged_userns_clone
    assert classify(s, Rung.netns, outcome, succeeded=frozenset({Rung.userns})).cause is Cause.unclassified
    got = classify(s, Rung.netns, outcome, earlier_failed=Rung.userns_map,
                   succeeded=frozenset({Rung.userns}))
    assert (got.verdict, got.cause) == (UNK, Cause.earlier_rung)


@pytest.mark.parametrize(("osrelease", "wsl"), [
    ("4.4.0-19041-Microsoft", "1"),
    ("4.4.0-22621-Microsoft", "1"),
    ("5.15.90.1-microsoft-standard-WSL2", "2"),
    ("6.6.36.3-microsoft-standard-WSL2+", "2"),
    ("6.1.0-18-amd64", None),
    (None, None),
])
def test_wsl_from_osrelease(osrelease: str | None, wsl: str | None) -> None:
    assert wsl_of(osrelease) == wsl


@pytest.mark.parametrize(("stderr", "name"), [
    (ENOSPC_LINE, "ENOSPC"),
    (PROC_EPERM, "EPERM"),
    (UID_MAP_EPERM, "EACCES"),
    (NS_EAGAIN, "EAGAIN"),
    (RO_SYS_LINE, "EROFS"),
    (RO_MAP_LINE, "EROFS"),
    (NO_PERMISSION, None),
    ("", None),
])
def test_errno_name_from_bwrap_stderr(stderr: str, name: str | None) -> None:
    assert ladder.errno_from_stderr(stderr) == name


def test_proc_mounts_finds_masks_but_not_binfmt_misc_and_reads_hidepid() -> None:
    assert ladder.proc_mounts(PLAIN_MOUNTINFO) == ((), None)
    masks, hidepid = ladder.proc_mounts(DOCKER_MOUNTINFO)
    assert masks == ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sys", "/proc/bus")
    assert hidepid is None
    assert ladder.proc_mounts(HIDEPID_MOUNTINFO) == ((), "invisible")
    escaped = "40 23 0:5 /null /proc/odd\\040name rw - tmpfs tmpfs rw\n"
    assert ladder.proc_mounts(escaped)[0] == ("/proc/odd name",)


def test_gathered_signals_from_a_fake_docker_host(tmp_path: Path) -> None:
    host, _ = fake_host(tmp_path, Shape(euid=0, cap_eff=DOCKER_CAPS, seccomp=2, mountinfo=DOCKER_MOUNTINFO,
                                        pids=(100, 7), nproc="unlimited"))
    s = ladder.gather_signals(host)
    assert (s.euid, s.cap_sys_admin, s.seccomp) == (0, False, 2)
    assert s.userns_initial is True and s.kernel_userns is True
    assert "/proc/kcore" in s.proc_masks
    assert (s.pids_max, s.pids_current) == (100, 7) and not s.pids_exhausted
    assert s.nproc_limit is None
    assert s.unprivileged_userns_clone is None  # mainline kernel: no such sysctl


@pytest.mark.parametrize("value", [
    None, True, False, 0, -3, "", "plain", 'q"uo\\te', "line\nbreak\ttab\x01", "ünï", ["a", 1, None],
    {"status": {"CapEff": "0", "Uid": "0\t0"}, "list": [True, {"x": "y"}]},
])
def test_the_inside_program_json_round_trips(value: Any) -> None:
    """The trial program writes JSON by hand (json's import costs a third of its start-up)."""
    from sandbox_conformance.probes import _inside_ladder

    assert json.loads(_inside_ladder.dumps(value)) == value


def test_a_read_only_proc_sys_does_not_lead_where_the_user_namespace_was_refused_first() -> None:
    """Docker's default seccomp profile with its read-only /proc/sys (tests/test_host_shape_lab.py):
    bwrap's --disable-userns write happens inside the namespace it could not create, so seccomp, the
    earlier rung's cause, leads; the read-only /proc/sys stays among the weaker ones."""
    signals = Signals(euid=1000, cap_eff=0, seccomp=2, proc_sys_readonly=True)  # no CAP_SYS_ADMIN
    failed = TrialOutcome(False, Step.bwrap, None)  # bwrap failed before our program ran, no errno
    c = classify(signals, Rung.disable_userns, failed, earlier_failed=Rung.userns)
    assert (c.cause, c.also) == (Cause.seccomp, (Cause.readonly_proc_sys,)), c
    # With every earlier rung working, the read-only /proc/sys is still the cause (the nspawn shape).
    c = classify(signals, Rung.disable_userns, failed)
    assert c.cause is Cause.readonly_proc_sys, c


def test_a_trial_that_misses_its_budget_gets_one_longer_try_before_it_is_unknown(tmp_path: Path) -> None:
    # A slow host (a TCG guest while the host is busy) answers the userns rung in 12 s: unknown at 10 s.
    calls: list[float] = []
    answers = [done("", "", None, timed_out=True)._replace(seconds=10.0), done("ok")._replace(seconds=12.0)]

    def runner(argv: Sequence[str], *, timeout: float, **kw: Any) -> Completed:
        calls.append(timeout)
        return answers[len(calls) - 1]

    host = Host(root=tmp_path, runner=runner, timeout=10.0)
    got = host.trial(["true"], timeout=10.0)
    assert calls == [10.0, 30.0] and got.ok and got.seconds == 22.0
    # A trial that hangs twice is unknown after both tries, and not tried a third time.
    calls.clear()
    answers[1] = done("", "", None, timed_out=True)._replace(seconds=30.0)
    got = host.trial(["true"], timeout=10.0)
    assert calls == [10.0, 30.0] and got.timed_out and got.seconds == 40.0
