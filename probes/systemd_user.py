"""`systemd_user`: can we start transient units under our own systemd user manager
(`systemd-run --user`), and which cgroup controllers does `user@UID.service` delegate to it?

The manager is found the way systemctl finds it: $XDG_RUNTIME_DIR/systemd/private (the manager's own
socket) or the session bus ($DBUS_SESSION_BUS_ADDRESS, else $XDG_RUNTIME_DIR/bus); then asked,
with a timeout, for its version. No manager is named for what it is: no systemd at all (PID 1 is
something else), or no user manager for this uid (no login session and no linger)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.probes.host import Host

# The Host's trial bound (probes/host.py). A manager answers in milliseconds on a real host, but
# `systemctl --user show` alone took 1.7 s in a TCG guest with systemd 252 as PID 1 and more
# beside the other probes' children (tests/test_host_shape_lab.py): a tighter bound turned a
# slow answer into `unknown`, a refusal.
CMD_TIMEOUT = 10.0
# cgroup2 at /sys/fs/cgroup (unified) or /sys/fs/cgroup/unified (hybrid), in systemd's order.
CGROUP2_MOUNTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")


def bus_path(address: str) -> str | None:
    """The unix socket path in a D-Bus address (`unix:path=/run/user/1000/bus,guid=...`; several
    addresses are separated by `;`, tried in order). Abstract or tcp addresses: None."""
    for one in address.split(";"):
        transport, _, params = one.partition(":")
        if transport != "unix":
            continue
        for kv in params.split(","):
            key, _, value = kv.partition("=")
            if key == "path" and value:
                return value
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        return None


class Observed(NamedTuple):
    booted: bool  # /run/systemd/system exists: systemd is PID 1 (sd_booted(3))
    pid1: str
    private: str | None  # $XDG_RUNTIME_DIR/systemd/private when it exists
    bus: str | None  # session bus socket when it exists
    linger: bool
    systemd_run: str | None
    systemctl: str | None
    answered: bool | None  # `systemctl --user show` succeeded; None: not asked
    answer_failure: str
    delegated: tuple[str, ...] | None  # None: no user@UID.service cgroup found
    uid: int
    user: str


def decide(o: Observed) -> tuple[Verdict, str]:
    """Pure: the verdict and the one-line reason naming what is missing."""
    if o.private is None and o.bus is None:
        if not o.booted:
            return Verdict.unsupported, (f"no systemd on this host (PID 1 is {o.pid1}, /run/systemd/system "
                                         f"absent): no user manager")
        if o.linger:
            return Verdict.unsupported, (f"no user manager running for {o.user} (uid {o.uid}) although "
                                         f"linger is enabled; try `systemctl start user@{o.uid}.service`")
        return Verdict.unsupported, (f"no user manager for {o.user} (uid {o.uid}): no login session and no "
                                     f"linger (`loginctl enable-linger {o.user}`)")
    if o.systemctl is None:
        return Verdict.unknown, "a user manager socket exists but there is no systemctl on PATH to ask it"
    if not o.answered:
        return Verdict.unknown, f"user manager socket exists but did not answer: {o.answer_failure}"
    if o.systemd_run is None:
        return Verdict.unsupported, "user manager reachable, but no systemd-run on PATH"
    ctl = " ".join(o.delegated) if o.delegated else "none"
    if o.delegated is None:
        ctl = f"unknown (no user@{o.uid}.service cgroup found)"
    return Verdict.supported, f"user manager reachable, systemd-run at {o.systemd_run}; delegated: {ctl}"


def probe(host: Host) -> list[Finding]:
    uid, user = host.euid, host.user
    runtime = host.env.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    private = f"{runtime}/systemd/private"
    bus = bus_path(host.env["DBUS_SESSION_BUS_ADDRESS"]) if host.env.get("DBUS_SESSION_BUS_ADDRESS") \
        else f"{runtime}/bus"
    found_private = private if host.path(private).exists() else None
    found_bus = bus if bus and host.path(bus).exists() else None
    comm = (_read(host.proc / "1/comm") or "?").strip()
    delegated = None
    for mount in CGROUP2_MOUNTS:
        text = _read(host.path(f"{mount}/user.slice/user-{uid}.slice/user@{uid}.service/cgroup.controllers"))
        if text is not None:
            delegated = tuple(sorted(text.split()))
            break
    systemctl = host.which("systemctl")
    answered, failure = None, ""
    if (found_private or found_bus) and systemctl:
        env = {"PATH": host.env.get("PATH", "/usr/bin:/bin"), "LANG": "C", "XDG_RUNTIME_DIR": runtime}
        if host.env.get("DBUS_SESSION_BUS_ADDRESS"):
            env["DBUS_SESSION_BUS_ADDRESS"] = host.env["DBUS_SESSION_BUS_ADDRESS"]
        done = host.runner([systemctl, "--user", "show", "--property=Version", "--no-pager"],
                           timeout=min(CMD_TIMEOUT, host.timeout), env=env)
        # A manager that answered prints `Version=...` (systemctl(1) show --property). Exit 0 with no
        # such line is not an answer: a wrapper or stub systemctl (containers ship `exit 0` ones)
        # says nothing about a manager.
        answered = done.ok and any(line.startswith("Version=") for line in done.stdout.splitlines())
        if done.timed_out:
            failure = "timed out"
        elif done.ok and not answered:
            printed = done.stdout.strip().splitlines()[:1]
            failure = (f"exit 0 but no Version= in its output ({printed[0][:80]!r})" if printed
                       else "exit 0 with no output (a stub systemctl?)")
        else:
            failure = f"exit {done.returncode}: {done.stderr_tail(1)}"
    o = Observed(
        booted=host.path("/run/systemd/system").is_dir(), pid1=comm,
        private=found_private, bus=found_bus,
        linger=host.path(f"/var/lib/systemd/linger/{user}").exists(),
        systemd_run=host.which("systemd-run"), systemctl=systemctl,
        answered=answered, answer_failure=failure, delegated=delegated, uid=uid, user=user,
    )
    verdict, reason = decide(o)
    ev = {"/run/systemd/system": "present" if o.booted else "absent", "pid1": comm,
          private: "present" if found_private else "absent",
          f"bus {bus or '(no unix path)'}": "present" if found_bus else "absent",
          "linger": "yes" if o.linger else "no",
          "systemd-run": o.systemd_run or "not on PATH"}
    if answered is not None:
        ev["systemctl --user show"] = "answered" if answered else failure
    if delegated is not None:
        ev[f"user@{uid}.service cgroup.controllers"] = " ".join(delegated) or "(empty)"
    facts = {"systemd_run": o.systemd_run, "bus": found_private or found_bus,
             "delegated_controllers": list(delegated or ()), "booted": o.booted, "linger": o.linger,
             "reachable": bool(answered)}
    return [Finding("systemd_user", verdict, reason, ev, facts)]
