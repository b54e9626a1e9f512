"""Probe `bwrap`: where bubblewrap is, which version, setuid or file capabilities, and which features
the binary really accepts (tried, not inferred from the version).

One launch answers both version and feature: bwrap parses its argv left to right and `--version`
prints and exits on the spot (bubblewrap.c parse_args_recurse), so `bwrap --disable-userns --version`
prints the version when the option is known, and dies "Unknown option" before 0.8. Whether the
option also WORKS on this host (it needs a user namespace) is the ladder's `disable_userns` rung."""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
from typing import NamedTuple

from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes.children import Completed, minimal_env

# Capability names by bit (<linux/capability.h>), for rendering security.capability like getcap.
CAP_NAMES = (
    "cap_chown", "cap_dac_override", "cap_dac_read_search", "cap_fowner", "cap_fsetid", "cap_kill",
    "cap_setgid", "cap_setuid", "cap_setpcap", "cap_linux_immutable", "cap_net_bind_service",
    "cap_net_broadcast", "cap_net_admin", "cap_net_raw", "cap_ipc_lock", "cap_ipc_owner", "cap_sys_module",
    "cap_sys_rawio", "cap_sys_chroot", "cap_sys_ptrace", "cap_sys_pacct", "cap_sys_admin", "cap_sys_boot",
    "cap_sys_nice", "cap_sys_resource", "cap_sys_time", "cap_sys_tty_config", "cap_mknod", "cap_lease",
    "cap_audit_write", "cap_audit_control", "cap_setfcap", "cap_mac_override", "cap_mac_admin",
    "cap_syslog", "cap_wake_alarm", "cap_block_suspend", "cap_audit_read", "cap_perfmon", "cap_bpf",
    "cap_checkpoint_restore",
)
VFS_CAP_FLAGS_EFFECTIVE = 0x000001  # <linux/capability.h>
_VERSION = re.compile(r"bubblewrap\s+(\d+(?:\.\d+)*)")


class BwrapInfo(NamedTuple):
    """What one look at the bwrap binary found: where it is, its version, its setuid bit or file
    capabilities, and whether it accepts --disable-userns. Made once per Host (`inspect`)."""

    path: str | None
    version: str | None = None
    setuid: bool = False
    caps: str | None = None  # security.capability rendered like getcap ("cap_sys_admin=ep")
    caps_raw: str | None = None
    disable_userns: bool = False  # the option was accepted by this binary (trial)
    trial: Completed | None = None
    error: str | None = None  # why the binary could not be run (errno name or "timeout")

    @property
    def version_tuple(self) -> tuple[int, ...] | None:
        return tuple(int(p) for p in self.version.split(".")) if self.version else None


def decode_caps(raw: bytes) -> str:
    """struct vfs_cap_data (revision 2 or 3) -> "cap_a,cap_b=ep" (getcap's form)."""
    if len(raw) < 12:
        return f"malformed ({raw.hex()})"
    magic = int.from_bytes(raw[0:4], "little")
    permitted = int.from_bytes(raw[4:8], "little")
    inheritable = int.from_bytes(raw[8:12], "little")
    if len(raw) >= 20:
        permitted |= int.from_bytes(raw[12:16], "little") << 32
        inheritable |= int.from_bytes(raw[16:20], "little") << 32
    bits = permitted | inheritable
    names = [CAP_NAMES[i] if i < len(CAP_NAMES) else f"cap_{i}" for i in range(64) if bits >> i & 1]
    flags = "e" if magic & VFS_CAP_FLAGS_EFFECTIVE else ""
    flags += "p" if permitted else ""
    flags += "i" if inheritable else ""
    return f"{','.join(names)}={flags}" if names else "none"


def parse_version(text: str) -> str | None:
    m = _VERSION.search(text)
    return m.group(1) if m else None


def not_executable(host: Host, name: str) -> tuple[str, int] | None:
    """(path, st_mode) of the first regular file called `name` on PATH (absolute entries, as
    Host.which) that we may not execute. shutil.which skips such a file silently (it wants X_OK), so
    without this an installed bwrap with its mode broken reads as "not installed"."""
    for entry in host.env.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(os.pathsep):
        if not entry.startswith("/"):
            continue
        candidate = os.path.join(entry, name)
        try:
            st = os.stat(candidate)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        if stat.S_ISREG(st.st_mode) and not os.access(candidate, os.X_OK):
            return os.path.realpath(candidate), st.st_mode
    return None


def _inspect(host: Host) -> BwrapInfo:
    path = host.which("bwrap")
    if path is None:
        broken = not_executable(host, "bwrap")
        if broken is not None:
            where, mode = broken
            return BwrapInfo(path=where, setuid=bool(mode & stat.S_ISUID),
                             error=f"not executable (mode {stat.filemode(mode)} {mode & 0o7777:04o})")
        return BwrapInfo(path=None)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return BwrapInfo(path=None)
    # Any setuid bit counts: bwrap switches to its setuid mode on euid != ruid (bubblewrap.c acquire_privs).
    setuid = bool(st.st_mode & stat.S_ISUID)
    caps = caps_raw = None
    try:
        raw = os.getxattr(path, "security.capability")
        caps, caps_raw = decode_caps(raw), raw.hex()
    except OSError as e:
        if e.errno not in (errno.ENODATA, errno.ENOTSUP):
            raise
    env = minimal_env({"LC_ALL": "C"})
    # Run as the probed user (setpriv prefix when --as-user) from /, which every user can enter.
    trial = host.runner([*host.trial_prefix, path, "--disable-userns", "--version"],
                        timeout=host.timeout, env=env, cwd="/")
    version = parse_version(trial.stdout)
    accepted = trial.ok and version is not None
    if not accepted and not trial.timed_out and not trial.not_found:
        # Older bwrap: the option is unknown. Ask for the version alone (only on this path).
        trial = host.runner([*host.trial_prefix, path, "--version"], timeout=host.timeout, env=env, cwd="/")
        version = parse_version(trial.stdout)
    error = "timeout" if trial.timed_out else ("cannot execute" if trial.not_found else None)
    if error is None and version is None:
        error = f"exit {trial.returncode}"
    return BwrapInfo(path=path, version=version, setuid=setuid, caps=caps, caps_raw=caps_raw,
                     disable_userns=accepted, trial=trial, error=error)


# One launch per Host even though the `bwrap` probe and the ladder both ask (they run concurrently in
# collect()); keyed by identity because Host holds a dict and is not hashable. The entry keeps the
# Host alive so its id cannot be reused.
_CACHE: dict[int, tuple[Host, BwrapInfo]] = {}
_LOCK = threading.Lock()


def inspect(host: Host) -> BwrapInfo:
    with _LOCK:
        hit = _CACHE.get(id(host))
        if hit is not None and hit[0] is host:
            return hit[1]
        info = _inspect(host)
        _CACHE[id(host)] = (host, info)
        return info


def probe(host: Host) -> list[Finding]:
    info = inspect(host)
    facts = {"path": info.path, "version": info.version,
             "version_tuple": list(info.version_tuple) if info.version_tuple else None,
             "setuid": info.setuid, "caps": info.caps, "features": {"disable_userns": info.disable_userns},
             # False: found on PATH, but not a file we may execute (mode); None: not found at all.
             "executable": None if info.path is None else info.trial is not None}
    if info.path is None:
        return [Finding("bwrap", Verdict.unsupported,
                        "bwrap not found in PATH (absolute entries only); apt-get install bubblewrap",
                        {"PATH": host.env.get("PATH", "")}, facts)]
    evidence = {"path": info.path, "setuid": str(info.setuid)}
    if info.caps_raw:
        evidence["security.capability"] = f"{info.caps} ({info.caps_raw})"
    if info.trial is not None:
        evidence["argv"] = " ".join(info.trial.argv)
        evidence["stdout"] = info.trial.stdout.strip()
        if info.trial.stderr.strip():
            evidence["stderr"] = info.trial.stderr_tail()
        evidence["returncode"] = str(info.trial.returncode)
    if info.error == "timeout":
        return [Finding("bwrap", Verdict.unknown, f"{info.path} --version timed out", evidence, facts)]
    if info.trial is None and info.error is not None:
        # Found, but execve(2) would fail with EACCES: say where it is and its mode, not "install it".
        return [Finding("bwrap", Verdict.denied,
                        f"bwrap found at {info.path} but {info.error}; chmod 0755 {info.path} or "
                        f"reinstall bubblewrap", evidence, facts)]
    if info.error is not None:
        return [Finding("bwrap", Verdict.denied,
                        f"{info.path} is present but could not be run as {host.user} ({info.error})",
                        evidence, facts)]
    mode = "setuid root" if info.setuid else ("file caps " + info.caps if info.caps else "unprivileged")
    feature = "--disable-userns accepted" if info.disable_userns else "no --disable-userns (needs >= 0.8)"
    reason = f"bubblewrap {info.version} at {info.path}, {mode}, {feature}"
    return [Finding("bwrap", Verdict.supported, reason, evidence, facts)]
