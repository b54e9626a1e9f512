"""Why did a rung of the user-namespace ladder fail? A PURE decision from independent signals.

bwrap's stderr wording changes between releases, so it is evidence, never the decision: the cause comes
from what the kernel and the process context say (sysctls, /proc/self/status, the AppArmor label, the
/proc mount table, limits) plus the errno NAME of the failing step when we have one.

No I/O here: `probes.ladder` gathers `Signals` from a Host and runs the trials; this module turns
(signals, rung, outcome) into (verdict, cause, reason) and is tested as a table."""

from __future__ import annotations

import enum
from typing import NamedTuple

from sandbox_conformance.probes.finding import Verdict


class Rung(enum.StrEnum):
    """One probe id per rung, in ladder order."""

    userns = "userns"  # unshare(CLONE_NEWUSER)
    userns_map = "userns.map"  # setgroups deny + uid_map + gid_map written
    netns = "netns"  # bwrap --unshare-net, lo up inside
    pidns_proc = "pidns.proc"  # bwrap --unshare-pid --proc /proc, a fresh procfs for the new pid ns
    disable_userns = "disable_userns"  # bwrap --disable-userns, nested unshare refused with ENOSPC


RUNGS: tuple[Rung, ...] = tuple(Rung)
BWRAP_RUNGS = frozenset({Rung.netns, Rung.pidns_proc, Rung.disable_userns})


class Cause(enum.StrEnum):
    """`facts["cause"]` ids (the contract in probe-ids.md, plus a few this module adds)."""

    apparmor = "apparmor"
    unprivileged_userns_clone = "unprivileged_userns_clone"
    max_user_namespaces = "max_user_namespaces"
    seccomp = "seccomp"
    no_cap_sys_admin = "no_cap_sys_admin"
    masked_proc = "masked_proc"
    hidepid = "hidepid"
    nested = "nested"
    wsl1 = "wsl1"
    setuid_bwrap = "setuid_bwrap"
    nproc = "nproc"
    pids_max = "pids_max"
    no_bwrap = "no_bwrap"
    earlier_rung = "earlier_rung"
    unclassified = "unclassified"
    # Added by this module:
    bwrap_too_old = "bwrap_too_old"  # --disable-userns needs bwrap >= 0.8
    no_kernel_userns = "no_kernel_userns"  # EINVAL and no /proc/self/ns/user: CONFIG_USER_NS=n
    not_effective = "not_effective"  # the trial ran, but the promise was not kept (lo down, nested allowed)
    timeout = "timeout"
    trial_failed = "trial_failed"  # the trial could not run at all (interpreter, setpriv): nothing learnt
    # /proc itself is mounted read-only: the setgroups/uid_map/gid_map writes every rung from
    # userns.map on needs fail with EROFS (mnt_want_write, fs/namespace.c).
    readonly_proc = "readonly_proc"
    # /proc/sys is mounted read-only (Docker's default `readonlyPaths`): bwrap --disable-userns
    # cannot write user.max_user_namespaces in its new user namespace (bubblewrap.c).
    readonly_proc_sys = "readonly_proc_sys"


# What each cause means for the verdict: `denied` is policy (a sysctl, an LSM, a filter, a limit),
# `unsupported` is the host lacking it, `unknown` is "could not tell" (never read as a pass).
_VERDICT: dict[Cause, Verdict] = {
    Cause.apparmor: Verdict.denied,
    Cause.unprivileged_userns_clone: Verdict.denied,
    Cause.max_user_namespaces: Verdict.denied,
    Cause.seccomp: Verdict.denied,
    Cause.no_cap_sys_admin: Verdict.denied,
    Cause.masked_proc: Verdict.denied,
    Cause.hidepid: Verdict.denied,
    Cause.nested: Verdict.denied,
    Cause.wsl1: Verdict.unsupported,
    Cause.setuid_bwrap: Verdict.denied,
    Cause.nproc: Verdict.denied,
    Cause.pids_max: Verdict.denied,
    Cause.no_bwrap: Verdict.unsupported,
    Cause.bwrap_too_old: Verdict.unsupported,
    Cause.no_kernel_userns: Verdict.unsupported,
    Cause.not_effective: Verdict.unsupported,
    Cause.earlier_rung: Verdict.unknown,
    Cause.timeout: Verdict.unknown,
    Cause.trial_failed: Verdict.unknown,
    Cause.readonly_proc: Verdict.denied,
    Cause.readonly_proc_sys: Verdict.denied,
}
_DENIED_ERRNOS = frozenset({"EPERM", "EACCES", "ENOSPC", "EAGAIN", "EUSERS"})
_UNSUPPORTED_ERRNOS = frozenset({"ENOSYS", "EINVAL", "ENOENT", "EOPNOTSUPP", "ENOTSUP"})

# The user-namespace-creating causes: once our own unshare(CLONE_NEWUSER) worked they cannot explain a
# later rung's failure (seccomp is not among them: Docker's profile also refuses mount/pivot_root,
# which every bwrap rung needs).
_USERNS_BLOCKERS = frozenset({Cause.unprivileged_userns_clone, Cause.max_user_namespaces, Cause.nested,
                              Cause.no_kernel_userns})

# CAP_SYS_ADMIN is capability 21 (<linux/capability.h>).
CAP_SYS_ADMIN = 21


class Signals(NamedTuple):
    """Independent facts about the host and the trial's process context. None: could not be read."""

    euid: int = 0
    cap_eff: int | None = None  # CapEff mask of the process the trial ran as
    seccomp: int | None = None  # /proc/self/status Seccomp: 0 none, 1 strict, 2 filter
    no_new_privs: bool | None = None
    unprivileged_userns_clone: int | None = None  # Debian/Ubuntu patch; None: sysctl absent (mainline)
    max_user_namespaces: int | None = None  # the LOCAL value (per user namespace)
    apparmor_restrict: int | None = None  # kernel.apparmor_restrict_unprivileged_userns (Ubuntu 23.10+)
    apparmor_label: str | None = None
    # The kernel's AppArmor mediates user-namespace creation for confined tasks (upstream 6.7+):
    # securityfs says so in features/namespaces. None: not readable (securityfs not mounted, no
    # AppArmor); False: AppArmor is there and does not mediate it.
    apparmor_userns: bool | None = None
    userns_initial: bool | None = None  # our user ns is the kernel's initial one (PROC_USER_INIT_INO)
    kernel_userns: bool | None = None  # /proc/self/ns/user exists
    proc_masks: tuple[str, ...] = ()  # locked-looking mounts over /proc contents (Docker's masked paths)
    hidepid: str | None = None  # hidepid= option of the /proc mount
    # The mount serving /proc/self (resp. /proc/sys/user) is read-only, per mount or per superblock,
    # from the mount table (or statvfs ST_RDONLY); None: could not be read.
    proc_readonly: bool | None = None
    proc_sys_readonly: bool | None = None
    wsl: str | None = None  # "1" | "2" | None
    bwrap_setuid: bool = False
    nproc_limit: int | None = None  # RLIMIT_NPROC soft limit; None: unlimited or unknown
    nproc_used: int | None = None  # processes of this uid, when counted
    pids_max: int | None = None  # tightest pids.max on our cgroup path; None: "max" or no controller
    pids_current: int | None = None
    pids_cgroup: str | None = None

    @property
    def cap_sys_admin(self) -> bool | None:
        return None if self.cap_eff is None else bool(self.cap_eff >> CAP_SYS_ADMIN & 1)

    @property
    def pids_exhausted(self) -> bool:
        return self.pids_max is not None and self.pids_current is not None \
            and self.pids_current >= self.pids_max

    @property
    def nproc_exhausted(self) -> bool | None:
        if self.nproc_limit is None:
            return False
        if self.nproc_used is None:
            return None  # a finite limit we could not compare against
        return self.nproc_used >= self.nproc_limit


class Step(enum.StrEnum):
    """Where a trial stopped."""

    unshare = "unshare"
    setgroups = "setgroups"
    uid_map = "uid_map"
    gid_map = "gid_map"
    bwrap = "bwrap"  # bwrap itself failed before our program ran
    launch = "launch"  # the trial could not be executed at all
    lo_down = "lo_down"
    proc_not_fresh = "proc_not_fresh"
    ns_not_new = "ns_not_new"  # the trial ran in our own network or pid namespace: the flag did nothing
    nested_allowed = "nested_allowed"
    nested_other = "nested_other"  # nested unshare refused, but not with ENOSPC
    no_report = "no_report"  # the program ran but printed nothing we could parse


class TrialOutcome(NamedTuple):
    """What one rung's trial did."""

    ok: bool
    step: Step | None = None
    errno: str | None = None  # errno NAME of the failing step, when known
    timed_out: bool = False
    untried: Cause | None = None  # set when the rung could not be tried at all, and why
    detail: str = ""  # for the reason: version, interface list, ...


class Classification(NamedTuple):
    """What `classify` made of one rung's trial: the verdict, the cause it names (None when the trial
    worked), and the one-line reason for a person."""

    verdict: Verdict
    cause: Cause | None
    reason: str
    also: tuple[Cause, ...] = ()  # weaker causes the signals also support (Docker: seccomp AND masks)


_OK_REASON = {
    Rung.userns: "unshare(CLONE_NEWUSER) worked",
    Rung.userns_map: "setgroups, uid_map and gid_map written in a new user namespace",
    Rung.netns: "bwrap --unshare-net ran with lo up inside",
    Rung.pidns_proc: "bwrap --unshare-pid mounted a fresh procfs for the new pid namespace",
    Rung.disable_userns: "bwrap --disable-userns ran and a nested unshare(CLONE_NEWUSER) got ENOSPC",
}


def classify(signals: Signals, rung: Rung, outcome: TrialOutcome, *,
             earlier_failed: Rung | None = None, succeeded: frozenset[Rung] = frozenset()) -> Classification:
    """(signals, rung, outcome) -> (verdict, cause, reason). `earlier_failed`: the first rung below this
    one that failed; `succeeded`: rungs whose own trial worked (their blockers are ruled out)."""
    if outcome.ok:
        return Classification(Verdict.supported, None, _OK_REASON[rung])
    if outcome.untried is not None:
        return Classification(_VERDICT[outcome.untried], outcome.untried,
                               _untried_reason(outcome.untried, outcome, earlier_failed))
    if outcome.timed_out:
        return Classification(Verdict.unknown, Cause.timeout,
                              f"{rung} trial timed out ({outcome.detail or 'no answer'}); nothing concluded")
    if outcome.step is Step.nested_allowed:
        return Classification(Verdict.unsupported, Cause.not_effective,
                              "bwrap --disable-userns ran but a nested unshare(CLONE_NEWUSER) still worked")
    if outcome.step is Step.lo_down:
        return Classification(Verdict.unsupported, Cause.not_effective,
                              f"bwrap --unshare-net ran but lo was not up inside ({outcome.detail})")
    if outcome.step is Step.ns_not_new:
        return Classification(Verdict.unsupported, Cause.not_effective,
                              f"bwrap ran the trial, but in our own namespace ({outcome.detail}): the flag "
                              "made none (a wrapper that ignores it?)")
    if outcome.step is Step.proc_not_fresh:
        return Classification(Verdict.unsupported, Cause.not_effective,
                              "bwrap --unshare-pid --proc ran but /proc/self did not resolve to our own pid")
    if outcome.step in (Step.launch, Step.no_report) and outcome.errno != "EAGAIN":
        # The trial itself did not run (no interpreter, setpriv refused, nothing printed): that says
        # nothing about the kernel, so no signal is blamed.
        return Classification(Verdict.unknown, Cause.trial_failed,
                              f"{rung} trial did not run{_at(outcome)}; see evidence")
    causes = _causes(signals, rung, outcome, succeeded)
    if earlier_failed is not None and rung is Rung.disable_userns and Cause.readonly_proc_sys in causes:
        # A read-only /proc/sys refuses bwrap's write of max_user_namespaces, which it makes only
        # inside the user namespace it created; with an earlier rung already refused, that namespace
        # was refused first (Docker's default seccomp profile: tests/test_host_shape_lab.py). The
        # earlier rung's cause leads, the read-only /proc/sys stays among the weaker ones.
        causes = [c for c in causes if c is not Cause.readonly_proc_sys] + [Cause.readonly_proc_sys]
    cause = causes[0] if causes else None
    if cause is None:
        if earlier_failed is not None:
            return Classification(Verdict.unknown, Cause.earlier_rung,
                                  f"{rung} failed{_at(outcome)} after {earlier_failed} had already failed; "
                                  "no independent signal explains it (see evidence)")
        verdict = (Verdict.denied if outcome.errno in _DENIED_ERRNOS
                   else Verdict.unsupported if outcome.errno in _UNSUPPORTED_ERRNOS else Verdict.unknown)
        return Classification(verdict, Cause.unclassified,
                              f"{rung} failed{_at(outcome)} and no known signal explains it (see evidence)")
    also = tuple(dict.fromkeys(c for c in causes[1:] if c is not cause))
    return Classification(_VERDICT[cause], cause, f"{rung} failed{_at(outcome)}: {_why(cause, signals)}",
                          also)


def _at(outcome: TrialOutcome) -> str:
    parts = [p for p in (outcome.step and f"at {outcome.step}", outcome.errno) if p]
    return f" ({', '.join(parts)})" if parts else ""


def _causes(signals: Signals, rung: Rung, outcome: TrialOutcome, succeeded: frozenset[Rung]) -> list[Cause]:
    """The candidates a working rung has not ruled out, strongest first."""
    out = []
    # Our own map writes (userns.map) went through the same /proc: once they failed for real (the
    # unshare before them worked), hidepid may be why; when they worked, it cannot be.
    map_refused = Rung.userns in succeeded and Rung.userns_map not in succeeded
    for cause in _candidates(signals, rung, outcome):
        # ...except the sysctl for --disable-userns's nested unshare, which even root makes without
        # CAP_SYS_ADMIN in the initial namespace (see _candidates).
        if Rung.userns in succeeded and cause in _USERNS_BLOCKERS and not (
                cause is Cause.unprivileged_userns_clone and rung is Rung.disable_userns):
            continue
        if Rung.userns_map in succeeded and cause in (Cause.apparmor, Cause.readonly_proc):
            continue
        # A confining profile's missing `userns,` cannot explain a later rung once our own unshare
        # worked under the same label (Ubuntu's sysctl path refuses only after the unshare).
        if cause is Cause.apparmor and Rung.userns in succeeded and signals.apparmor_restrict != 1:
            continue
        if cause is Cause.hidepid and rung is not Rung.userns_map and not map_refused:
            continue
        out.append(cause)
    return out


def _candidates(s: Signals, rung: Rung, o: TrialOutcome) -> list[Cause]:
    """Every cause the signals support, strongest first."""
    out: list[Cause] = []
    no_admin = s.cap_sys_admin is False
    # A read-only /proc refuses the setgroups/uid_map/gid_map writes (EROFS) that userns.map makes and
    # that bwrap makes for every --unshare-user ("setting up uid map"); a read-only /proc/sys refuses
    # --disable-userns's write of user.max_user_namespaces. With EROFS (or no errno) they are the
    # strongest explanation; otherwise something failed earlier and they are only weaker ones.
    readonly: list[Cause] = []
    if s.proc_readonly and (rung is Rung.userns_map or rung in BWRAP_RUNGS):
        readonly.append(Cause.readonly_proc)
    if s.proc_sys_readonly and rung is Rung.disable_userns:
        readonly.append(Cause.readonly_proc_sys)
    if o.errno in ("EROFS", None):
        out += readonly
    # WSL1 translates syscalls in a Windows driver: there are no Linux namespaces at all.
    if s.wsl == "1":
        out.append(Cause.wsl1)
    if o.errno == "EINVAL" and s.kernel_userns is False:
        out.append(Cause.no_kernel_userns)
    # ENOSPC from unshare(CLONE_NEWUSER): some user namespace on our chain is at its
    # max_user_namespaces (kernel/ucount.c inc_ucount walks every ancestor). Local 0 is the sysctl;
    # local non-zero means an ANCESTOR set it: a parent sandbox disabled nesting (bwrap >= 0.8
    # --disable-userns writes 1 in its own userns, bubblewrap.c), so the rung is refused here.
    # In the INITIAL user namespace there is no ancestor: ENOSPC is this namespace's own count for our
    # user, at its non-zero max_user_namespaces (many namespaces already held: browsers, flatpak).
    if o.errno == "ENOSPC":
        local = s.max_user_namespaces == 0 or s.userns_initial is True
        out.append(Cause.max_user_namespaces if local else Cause.nested)
    # EAGAIN from fork/clone: a process limit, cgroup pids.max (kernel/cgroup/pids.c) or RLIMIT_NPROC.
    if o.errno == "EAGAIN":
        if s.pids_exhausted:
            out.append(Cause.pids_max)
        if s.nproc_exhausted is not False:
            out.append(Cause.nproc)
    if s.max_user_namespaces == 0:
        out.append(Cause.max_user_namespaces)
    # Debian's patch: unprivileged_userns_clone=0 refuses CLONE_NEWUSER without CAP_SYS_ADMIN (EPERM).
    # The capability is checked in the INITIAL user namespace (capable(), kernel/fork.c), so root is
    # refused too where the unshare happens inside a new namespace: bwrap --disable-userns makes a
    # second, nested one ("bwrap: unshare user ns: Operation not permitted" as root, Debian 6.1,
    # tests/test_host_shape_lab.py). A setuid bwrap makes its namespaces with that capability: the
    # sysctl does not stop its rungs (netns and pidns.proc work there, observed).
    setuid_mode = s.bwrap_setuid and s.euid != 0 and rung in BWRAP_RUNGS
    if s.unprivileged_userns_clone == 0 and not setuid_mode and (
            not s.cap_sys_admin or rung is Rung.disable_userns):
        out.append(Cause.unprivileged_userns_clone)
    # Ubuntu 23.10+: the namespace is created but an unconfined task loses its capabilities in it,
    # so the map writes (and bwrap's mounts) fail; CAP_SYS_ADMIN in the init ns is exempt.
    # Upstream 6.7+ (security/apparmor/lsm.c apparmor_userns_create -> aa_profile_ns_perm): a task
    # confined by a profile in enforce mode makes a user namespace only if the profile has `userns,`;
    # without it clone/unshare(CLONE_NEWUSER) fails with EACCES, root included, and the kernel logs
    # apparmor="DENIED" operation="userns_create" (Debian's 6.12, tests/test_host_shape_apparmor.py).
    # The signals: the trial's own label, the kernel advertising the mediation, and EACCES (what an
    # LSM hook returns; the sysctls and the limits give EPERM or ENOSPC).
    profile_refused = (apparmor_enforcing(s.apparmor_label) and s.apparmor_userns is not False
                       and o.errno == "EACCES" and (rung is Rung.userns or rung in BWRAP_RUNGS))
    if (s.apparmor_restrict == 1 and not s.cap_sys_admin) or profile_refused:
        out.append(Cause.apparmor)
    # Docker's default seccomp profile allows unshare/clone namespace flags, mount and pivot_root
    # only with CAP_SYS_ADMIN (moby profiles/seccomp/default.json).
    # A filter answers with the errno its profile names: Docker's EPERM (SCMP_ACT_ERRNO's default),
    # never EACCES, which is an LSM's (SELinux user_namespace { create }, a BPF LSM, AppArmor above).
    if s.seccomp == 2 and no_admin and o.errno != "EACCES":
        out.append(Cause.seccomp)
    # A fresh procfs in a new user namespace is refused (EPERM) when the visible /proc has locked
    # overmounts (fs/namespace.c mount_too_revealing -> mnt_already_visible): Docker's masked paths,
    # a file bound over, a read-only /proc/sys. mnt_already_visible compares mount flags and locked
    # children, never hidepid: hidepid=2 alone leaves this rung supported (6.18, observed).
    if rung is Rung.pidns_proc and s.proc_masks:
        out.append(Cause.masked_proc)
    # hidepid's known failure is the uid map write (bubblewrap#198: "setting up uid map: Operation
    # not permitted" with hidepid>=1); _causes keeps it only where a map write really failed.
    if s.hidepid not in (None, "0", "off") and (rung is Rung.userns_map or rung in BWRAP_RUNGS):
        out.append(Cause.hidepid)
    if s.euid == 0 and no_admin:
        out.append(Cause.no_cap_sys_admin)
    # Run by root a setuid bwrap is in no setuid mode at all (bubblewrap.c: real uid == effective).
    if setuid_mode:
        out.append(Cause.setuid_bwrap)
    out += [c for c in readonly if c not in out]
    return out


def apparmor_mode(label: str | None) -> str | None:
    """The mode of an AppArmor label as /proc/PID/attr/apparmor/current shows it: "unconfined", or
    "NAME (MODE)" with MODE enforce, complain, kill, unconfined, or mixed for a stack of profiles in
    different modes (security/apparmor/label.c aa_label_snxprint). None: no label, or another form."""
    if label is None:
        return None
    label = label.strip().rstrip("\x00")
    if label == "unconfined":
        return "unconfined"
    if label.endswith(")") and " (" in label:
        return label.rsplit(" (", 1)[1][:-1]
    return None


def apparmor_enforcing(label: str | None) -> bool:
    """A profile refuses what it does not allow: enforce, kill, and a mixed stack (some member may)."""
    return apparmor_mode(label) in ("enforce", "kill", "mixed")


def wsl_of(osrelease: str | None) -> str | None:
    """WSL2 kernels say "...-microsoft-standard-WSL2"; WSL1 reports a fake "4.4.0-NNNNN-Microsoft"."""
    if not osrelease or "microsoft" not in osrelease.lower():
        return None
    low = osrelease.lower()
    return "2" if "wsl2" in low or "microsoft-standard" in low else "1"


def _why(cause: Cause, s: Signals) -> str:
    match cause:
        case Cause.wsl1:
            return "WSL1 has no Linux namespaces; use WSL2"
        case Cause.no_kernel_userns:
            return "the kernel has no user namespaces (no /proc/self/ns/user: CONFIG_USER_NS=n)"
        case Cause.max_user_namespaces:
            if s.max_user_namespaces:
                return (f"this user holds user.max_user_namespaces={s.max_user_namespaces} user namespaces "
                        "already (ENOSPC in the initial namespace); end some, or raise it (sysctl -w "
                        "user.max_user_namespaces=15000)")
            return "user.max_user_namespaces=0; raise it (sysctl -w user.max_user_namespaces=15000)"
        case Cause.nested:
            return (f"a parent sandbox disabled nested user namespaces (ENOSPC while the local "
                    f"user.max_user_namespaces={s.max_user_namespaces}); run outside it")
        case Cause.pids_max:
            return f"cgroup pids.max {s.pids_max} reached ({s.pids_current}) in {s.pids_cgroup}"
        case Cause.nproc:
            return f"RLIMIT_NPROC {s.nproc_limit} exhausted (ulimit -u)"
        case Cause.unprivileged_userns_clone:
            return "kernel.unprivileged_userns_clone=0; sysctl -w kernel.unprivileged_userns_clone=1"
        case Cause.apparmor if apparmor_enforcing(s.apparmor_label):
            name = (s.apparmor_label or "").rsplit(" (", 1)[0]
            return (f"AppArmor confines this process (label {s.apparmor_label}) and its profile has no "
                    f"`userns,` rule, so the kernel refuses its user namespaces; give the sandbox "
                    f"a profile that allows `userns,` (add it to profile {name}) or run it unconfined")
        case Cause.apparmor:
            return (f"AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged"
                    f"_userns=1, label {s.apparmor_label or 'unknown'}); give the sandbox a profile with "
                    f"`userns,` or set the sysctl to 0")
        case Cause.seccomp:
            return ("a seccomp filter without CAP_SYS_ADMIN (Docker's default profile) refuses namespace "
                    "and mount syscalls; run the container --privileged or with a profile that allows them")
        case Cause.masked_proc:
            shown = ", ".join(s.proc_masks[:3]) + (", ..." if len(s.proc_masks) > 3 else "")
            return (f"/proc has mounts over its contents ({shown}: masked or read-only), so the kernel "
                    f"refuses a fresh procfs (mount_too_revealing); run privileged or with --security-opt "
                    f"systempaths=unconfined")
        case Cause.hidepid:
            return (f"/proc is mounted hidepid={s.hidepid} and the uid map write was refused "
                    f"(bubblewrap#198); remount /proc without hidepid")
        case Cause.readonly_proc:
            return ("/proc is mounted read-only, so the setgroups/uid_map writes a user namespace needs get "
                    "EROFS; mount /proc read-write where the suite runs (a container: drop the read-only "
                    "/proc)")
        case Cause.readonly_proc_sys:
            return ("/proc/sys is mounted read-only, so bwrap --disable-userns cannot write "
                    "user.max_user_namespaces in its namespace; make /proc/sys writable (docker: "
                    "--security-opt systempaths=unconfined)")
        case Cause.no_cap_sys_admin:
            return "root without CAP_SYS_ADMIN (a container's capability set); add it or run privileged"
        case Cause.setuid_bwrap:
            return "bwrap is setuid and refuses this in setuid mode; use a non-setuid bwrap with userns on"
    return str(cause)


def _untried_reason(cause: Cause, outcome: TrialOutcome, earlier: Rung | None) -> str:
    match cause:
        case Cause.no_bwrap if outcome.detail:
            return f"not tried: bwrap could not be run ({outcome.detail})"
        case Cause.no_bwrap:
            return "not tried: bwrap not found in PATH (apt-get install bubblewrap)"
        case Cause.bwrap_too_old:
            version = outcome.detail or "(version unknown)"
            return f"not tried: bwrap {version} lacks --disable-userns (needs >= 0.8)"
        case Cause.earlier_rung:
            return f"not tried: {earlier or 'an earlier rung'} failed first"
    return f"not tried: {cause}"
