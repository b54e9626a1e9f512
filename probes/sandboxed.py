"""`sandboxed`: are we already running inside a sandbox?

An explicit promise a sandbox can export (`SANDBOX_CONFORMANCE_SANDBOXED=1`, or the sandbox's name),
plus structural signals, each named when it fires:

- `promise`: SANDBOX_CONFORMANCE_SANDBOXED set to anything but "", "0", "false", "no".
- `uid_map`: /proc/self/uid_map is not the initial namespace's identity map `0 0 4294967295`.
- `no_new_privs`: NoNewPrivs: 1 (bwrap always sets PR_SET_NO_NEW_PRIVS; so do systemd's
  NoNewPrivileges= and most container runtimes).
- `seccomp`: Seccomp: 2, a filter is installed (Docker's default profile, flatpak, bwrap --seccomp).
- `nested_userns_refused`: a throwaway child's unshare(CLONE_NEWUSER) failed with ENOSPC/EUSERS, or
  EPERM while the local sysctls allow it: a parent sandbox forbade nesting (bwrap --disable-userns).
- `flatpak_info`: /.flatpak-info exists (flatpak writes it into every sandbox).
- `pid1_bwrap`: PID 1 is bwrap (bwrap --unshare-pid keeps itself as the namespace's init).

A stray `/.dockerenv` is deliberately not a signal: images carry it, and this is about sandboxes.
Independent of the ladder module: this probe does its own cheap nested trial."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.probes.host import Host

PROMISE_ENV = "SANDBOX_CONFORMANCE_SANDBOXED"
IDENTITY_MAP = ("0", "0", "4294967295")  # the initial user namespace's map (user_namespaces(7))
CHILD_PYTHON = "/usr/bin/python3"
USER_INIT_INO = 0xEFFFFFFD  # PROC_USER_INIT_INO, <linux/proc_ns.h>: the initial user namespace
# The Host's bound for every trial (probes/host.py). 5 s was not enough for one `python3 -I -S` start
# beside the other probes' children in a TCG guest: `run` as a user refused, sandboxed unknown
# (tests/test_host_shape_lab.py).
TRIAL_TIMEOUT = 10.0

# Runs under `python3 -I -S`: stdlib only, prints one JSON line. The unshare affects only this
# throwaway child. The line is written by hand: importing json there (re, enum, ...) took 20 ms of a
# 36 ms child, on every probe (issue 15); an errno name or number needs no escaping.
TRIAL = r"""
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER = 0x10000000
rc = libc.unshare(CLONE_NEWUSER)
e = ctypes.get_errno()
print('{"rc": %d, "errno": %s}' % (rc, "null" if rc == 0 else '"%s"' % errno.errorcode.get(e, str(e))))
"""


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        return None


def status_fields(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep:
            out[k.strip()] = v.strip()
    return out


def uid_map_is_identity(text: str) -> bool:
    rows = [tuple(line.split()) for line in text.splitlines() if line.strip()]
    return rows == [IDENTITY_MAP]


def nested_refused(err: str | None, *, euid: int, max_userns: str | None, unpriv_clone: str | None,
                   initial: bool | None = None) -> bool:
    """Pure: does this errno from unshare(CLONE_NEWUSER) mean a parent sandbox refused nesting?

    ENOSPC: a user-namespace count limit was hit; with the local max_user_namespaces non-zero, it is
    an ancestor's limit (bwrap --disable-userns sets it to 1 in an outer namespace, bubblewrap.c),
    unless we are in the initial user namespace (`initial`), which has no ancestor: there it is our
    user's own count at the local limit. EUSERS: the 32-level nesting limit. EPERM counts only when
    the local sysctls allow creation (max_user_namespaces > 0, and Debian's
    kernel.unprivileged_userns_clone not 0 for non-root): otherwise it is host policy, not a sandbox
    around us."""
    if err is None:
        return False
    limit_open = max_userns is not None and max_userns.strip() not in ("", "0")
    if err == "EUSERS":
        return True
    if err == "ENOSPC":
        return limit_open and initial is not True
    if err == "EPERM":
        clone_open = euid == 0 or unpriv_clone is None or unpriv_clone.strip() != "0"
        return limit_open and clone_open
    return False


def decide(signals: list[str], trial_ok: bool, trial_why: str,
           unread: Sequence[str] = ()) -> tuple[Verdict, str]:
    """Pure: any signal -> detected; none, and the nested trial could not run or a signal's source
    could not be read (`unread`: no /proc, a chroot) -> unknown (it might have fired); none ->
    not_detected."""
    if signals:
        return Verdict.detected, f"inside a sandbox: {', '.join(signals)} fired"
    if not trial_ok:
        return Verdict.unknown, f"no structural signal, and the nested-userns trial did not run: {trial_why}"
    if unread:
        return Verdict.unknown, f"no signal fired, but could not read {', '.join(unread)}: they might have"
    return Verdict.not_detected, ("no signal fired (promise, uid_map, NoNewPrivs, seccomp, nested userns, "
                                  "/.flatpak-info, PID 1 bwrap)")


def nested_trial(host: Host) -> tuple[str | None, bool, str]:
    """(errno name or None on success, trial ran, why not)."""
    # Any interpreter runs the trial (it is ours, as the caller; stdlib only): where there is no
    # /usr/bin/python3 (NixOS, a python:* image) this one, or the probe would always be unknown.
    python = CHILD_PYTHON if os.path.exists(CHILD_PYTHON) else sys.executable
    if not python:
        return None, False, f"no {CHILD_PYTHON} and no interpreter of our own to run the trial"
    done = host.trial([python, "-I", "-S", "-c", TRIAL], timeout=min(TRIAL_TIMEOUT, host.timeout))
    if done.timed_out:
        return None, False, f"timed out after {done.seconds:.1f}s"
    try:
        doc = json.loads(done.stdout.strip().splitlines()[-1])
        return doc["errno"], True, ""
    except (IndexError, ValueError, KeyError, TypeError):
        return None, False, f"exit {done.returncode}: {done.stderr_tail() or 'no output'}"


def promise_fired(env: Mapping[str, str]) -> bool:
    return env.get(PROMISE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def probe(host: Host) -> list[Finding]:
    signals: list[str] = []
    ev: dict[str, str] = {}
    if PROMISE_ENV in host.env:
        ev[PROMISE_ENV] = host.env[PROMISE_ENV]
    if promise_fired(host.env):
        signals.append("promise")

    unread = []
    uid_map = _read(host.proc / "self/uid_map")
    no_userns = uid_map is None and (host.proc / "self/status").exists() \
        and not os.path.lexists(host.proc / "self/ns/user")
    if no_userns:
        # A kernel built without CONFIG_USER_NS has neither (fs/proc/base.c): no user namespace can be
        # around us, so there is no map to read, which is no gap.
        ev["/proc/self/uid_map"] = "absent: no user namespaces in this kernel (no /proc/self/ns/user)"
    elif uid_map is None:
        unread.append("/proc/self/uid_map")
    else:
        ev["/proc/self/uid_map"] = " | ".join(" ".join(r.split()) for r in uid_map.splitlines() if r.strip())
        if not uid_map_is_identity(uid_map):
            signals.append("uid_map")

    status_text = _read(host.proc / "self/status")
    if status_text is None:
        unread.append("/proc/self/status")
    status = status_fields(status_text or "")
    for key in ("NoNewPrivs", "Seccomp", "Seccomp_filters"):
        if key in status:
            ev[f"status.{key}"] = status[key]
    if status.get("NoNewPrivs") == "1":
        signals.append("no_new_privs")
    if status.get("Seccomp") == "2":  # SECCOMP_MODE_FILTER; 1 is strict mode, which could not run us
        signals.append("seccomp")

    max_userns = _read(host.proc / "sys/user/max_user_namespaces")
    unpriv = _read(host.proc / "sys/kernel/unprivileged_userns_clone")
    ev["max_user_namespaces"] = (max_userns or "absent").strip()
    if unpriv is not None:
        ev["unprivileged_userns_clone"] = unpriv.strip()
    try:
        user_ns = os.readlink(host.proc / "self/ns/user")
        ev["/proc/self/ns/user"] = user_ns
    except OSError:
        user_ns = None
    initial = None if user_ns is None else user_ns == f"user:[{USER_INIT_INO}]"
    err, trial_ok, trial_why = nested_trial(host)
    ev["nested unshare(CLONE_NEWUSER)"] = (err or "ok") if trial_ok else f"did not run: {trial_why}"
    if trial_ok and nested_refused(err, euid=host.euid, max_userns=max_userns, unpriv_clone=unpriv,
                                   initial=initial):
        signals.append("nested_userns_refused")
    elif trial_ok and err == "ENOSPC" and max_userns is None:
        unread.append("/proc/sys/user/max_user_namespaces (to tell what the trial's ENOSPC means)")

    if host.path("/.flatpak-info").exists():
        ev["/.flatpak-info"] = "present"
        signals.append("flatpak_info")

    comm = (_read(host.proc / "1/comm") or "").strip()
    cmdline = (_read(host.proc / "1/cmdline") or "").split("\0")[0]
    ev["pid1"] = f"{comm or '?'} ({cmdline or '?'})"
    if comm == "bwrap" or os.path.basename(cmdline) == "bwrap":
        signals.append("pid1_bwrap")

    verdict, reason = decide(signals, trial_ok, trial_why, unread)
    return [Finding("sandboxed", verdict, reason, ev, {"signals": signals})]
