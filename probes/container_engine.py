"""`container_engine`: a docker or podman CLI, whether its engine answers and through which socket,
and whether that engine is rootless.

The socket is resolved the way the CLI resolves it (DOCKER_HOST / CONTAINER_HOST, a docker context,
else the default socket) and, when it is a local unix socket, tried with connect(2) first: ENOENT or
ECONNREFUSED means no engine is listening, EACCES means one is and we may not talk to it (not in the
docker group). Only then is the CLI asked (`docker info`), with a short timeout."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from sandbox_conformance.kernel.errnos import errname
from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes import owner
from sandbox_conformance.processes.children import Completed

DOCKER_DEFAULT_SOCKET = "/var/run/docker.sock"  # the docker CLI's default, rootful or not
CLI_TIMEOUT = 5.0
CONNECT_TIMEOUT = 2.0
# What the engine CLIs read to find their endpoint; nothing else of ours reaches them.
CLI_ENV = ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_CERT_PATH",
           "DOCKER_TLS_VERIFY", "CONTAINER_HOST", "CONTAINER_CONNECTION", "XDG_RUNTIME_DIR",
           "XDG_CONFIG_HOME")


# Rootless podman, asked anything (even `podman info`), starts a per-user "pause" process that holds
# its user namespace and outlives the command by design (podman-system-migrate(1)), and keeps its
# state in $XDG_RUNTIME_DIR (unset: /tmp/podman-run-UID and /tmp/containers-user-UID) and $HOME
# (~/.config/cni, ~/.local/share/containers/storage). Measured as sbxc-test, one `probe` left all of
# them (issue 28). So a rootless trial runs podman with HOME and XDG_RUNTIME_DIR in a stamped
# scratch directory of its own, then stops the pause process named by its pid file there and removes
# the directory. A probe killed first leaves the directory to the sweep, which stops the pause first.
SCRATCH_PREFIX = "sbxc-pmprobe-"
PAUSE_PID = "run/libpod/tmp/pause.pid"  # $XDG_RUNTIME_DIR/libpod/tmp/pause.pid (podman 4)
PAUSE_COMM = "podman pause"
# For the sweep (processes/owner.py ask_before_removal): the same check, in a shell, as the sweeper.
_KILL_PAUSE = ('p=$(cat "$1") && [ "$(cat /proc/"$p"/comm)" = "podman pause" ] && kill -KILL "$p"')
STOP_TIMEOUT = 2.0


class Endpoint(NamedTuple):
    cli: str  # "docker" | "podman"
    address: str | None  # "unix:///var/run/docker.sock", "tcp://...", or None for podman's local mode
    source: str  # where it came from: "DOCKER_HOST", "context foo", "default", "local"

    @property
    def unix_path(self) -> str | None:
        if self.address and self.address.startswith("unix://"):
            return self.address.removeprefix("unix://")
        return None


def cli_env(host: Host) -> dict[str, str]:
    env = {k: host.env[k] for k in CLI_ENV if k in host.env}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    env["LANG"] = "C"
    return env


def pause_pid(pid_file: Path, euid: int) -> int | None:
    """The rootless pause process a pid file names, if it still runs as `euid`: checked against the
    process (its name and owner), so a pid the kernel has since given another is never killed."""
    try:
        pid = int(pid_file.read_text())
        proc = Path(f"/proc/{pid}")
        if (proc / "comm").read_text().strip() == PAUSE_COMM and proc.stat().st_uid == euid:
            return pid
    except (FileNotFoundError, ProcessLookupError, ValueError):
        pass
    return None


def stop_pause(pid_file: Path, euid: int, *, timeout: float = STOP_TIMEOUT) -> int | None:
    """SIGKILL the pause process of `pid_file` and wait until it is dead (a zombie of PID 1's, whose
    child it became, counts: owner.start_time). Its pid, or None when none ran."""
    pid = pause_pid(pid_file, euid)
    if pid is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while owner.start_time(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    return pid


def before_removal(scratch: Path) -> list[list[str]]:
    """What the sweep runs before it removes a scratch directory a killed probe left: stop its pause."""
    return [["sh", "-c", _KILL_PAUSE, "sh", str(scratch / PAUSE_PID)]]


@contextlib.contextmanager
def rootless_scratch(env: dict[str, str], euid: int) -> Iterator[dict[str, str]]:
    """`env` with podman's per-user state (HOME, XDG_RUNTIME_DIR) moved into a scratch directory of
    ours, and afterwards that state gone: the pause process stopped, the directory removed."""
    import tempfile  # lazy: the rootful and docker probes, `probe`'s common path, make no directory

    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{owner.stamp()}-"))
    try:
        owner.ask_before_removal(scratch, before_removal(scratch))
        for d in ("home", "run"):
            (scratch / d).mkdir(mode=0o700)
        yield {**env, "HOME": str(scratch / "home"), "XDG_CONFIG_HOME": str(scratch / "home" / ".config"),
               "XDG_RUNTIME_DIR": str(scratch / "run")}
    finally:
        stop_pause(scratch / PAUSE_PID, euid)
        owner.rmtree(str(scratch))


def _home(host: Host) -> str:
    return host.env.get("HOME") or os.path.expanduser("~")


def docker_current_context(host: Host) -> str | None:
    """The docker CLI's context: DOCKER_CONTEXT, else currentContext in $DOCKER_CONFIG/config.json
    (default ~/.docker). None or "default" means the DOCKER_HOST / default-socket rules apply."""
    if host.env.get("DOCKER_CONTEXT"):
        return host.env["DOCKER_CONTEXT"]
    config_dir = host.env.get("DOCKER_CONFIG") or os.path.join(_home(host), ".docker")
    try:
        doc = json.loads(host.path(os.path.join(config_dir, "config.json")).read_text())
    except (FileNotFoundError, NotADirectoryError, PermissionError, ValueError):
        return None
    ctx = doc.get("currentContext") if isinstance(doc, dict) else None
    return ctx if isinstance(ctx, str) and ctx else None


def endpoint(host: Host, cli: str) -> Endpoint:
    if cli == "podman":
        if host.env.get("CONTAINER_HOST"):
            return Endpoint(cli, host.env["CONTAINER_HOST"], "CONTAINER_HOST")
        # Podman needs no daemon: the CLI is the engine, run as whoever calls it.
        return Endpoint(cli, None, "local")
    if host.env.get("DOCKER_HOST"):
        return Endpoint(cli, host.env["DOCKER_HOST"], "DOCKER_HOST")
    ctx = docker_current_context(host)
    if ctx and ctx != "default":
        return Endpoint(cli, None, f"context {ctx}")
    return Endpoint(cli, f"unix://{DOCKER_DEFAULT_SOCKET}", "default")


def connect_errno(path: Path) -> str | None:
    """connect(2) to a unix socket: None when something accepted, else the errno name."""
    try:
        os.stat(path)  # the common case, no engine at all, answered without importing socket
    except OSError as e:
        return errname(e)
    # Lazy: importing socket costs a few ms of start-up that the no-engine case does not need.
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(CONNECT_TIMEOUT)
    try:
        s.connect(os.fspath(path))
        return None
    except TimeoutError:
        return "ETIMEDOUT"
    except OSError as e:
        return errname(e)
    finally:
        s.close()


# connect(2) errnos that mean "nothing is listening there" (no engine), and "someone is, but not for us".
NO_LISTENER = ("ENOENT", "ECONNREFUSED", "ENOTDIR")
REFUSED_US = ("EACCES", "EPERM")


class Attempt(NamedTuple):
    cli: str
    path: str
    endpoint: Endpoint
    connect: str | None  # errno name from connect(2), None: connected or not a unix socket
    info: Mapping[str, Any] | None  # the engine's info document when it answered
    failure: str  # why not, when info is None


def parse_docker_info(done: Completed) -> Mapping[str, Any] | None:
    """`docker info --format '{{json .}}'` prints the client's half (ServerVersion "") even when the
    daemon is down, so an answer means exit 0 and a server version."""
    if not done.ok:
        return None
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("ServerVersion") else None


def parse_podman_info(done: Completed) -> Mapping[str, Any] | None:
    if not done.ok:
        return None
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("host"), dict) else None


def rootless(cli: str, info: Mapping[str, Any]) -> bool | None:
    if cli == "docker":
        # A rootless dockerd lists "name=rootless" among its security options (docker info).
        opts = info.get("SecurityOptions")
        return any("name=rootless" in o for o in opts) if isinstance(opts, list) else None
    sec = info.get("host", {}).get("security", {})
    value = sec.get("rootless") if isinstance(sec, dict) else None
    return value if isinstance(value, bool) else None


def attempt(host: Host, cli: str, path: str) -> Attempt:
    ep = endpoint(host, cli)
    conn = None
    if ep.unix_path is not None:
        conn = connect_errno(host.path(ep.unix_path))
        if conn is not None:
            return Attempt(cli, path, ep, conn, None, f"connect({ep.unix_path}): {conn}")
    # Podman has no daemon to ask: `podman info` does the engine's work in the CLI process (storage,
    # network, cgroup manager), seen taking over 5 s in a TCG guest (tests/test_host_shape_lab.py).
    limit = host.timeout if cli == "podman" else min(CLI_TIMEOUT, host.timeout)
    argv = [path, "info", "--format", "{{json .}}"]
    unshare = host.which("unshare") if cli == "podman" and host.euid == 0 else None
    if unshare is not None:
        # Rootful podman's overlay driver binds its storage directory onto itself on first use (to make
        # it private) and leaves the mount behind: a probe must not. In a mount namespace of its own
        # the bind dies with the trial (mount_namespaces(7)); storage it creates is podman's first use.
        argv = [unshare, "--mount", "--propagation", "private", *argv]
    with contextlib.ExitStack() as stack:
        env = cli_env(host)
        if cli == "podman" and host.euid != 0:
            env = stack.enter_context(rootless_scratch(env, host.euid))
        # Once more, with a longer bound, if it timed out (Host.trial): on a busy machine `docker info`
        # took 5.8 s and `podman info` 10.5 s (a loaded CI run's container lab), and an engine that
        # answers late is an engine, not "could not tell".
        done = host.trial(argv, timeout=limit, env=env)
    info = parse_docker_info(done) if cli == "docker" else parse_podman_info(done)
    if info is not None:
        return Attempt(cli, path, ep, None, info, "")
    why = (f"`{cli} info` timed out after {done.seconds:.1f}s" if done.timed_out
           else f"`{cli} info` exit {done.returncode}: {done.stderr_tail(1) or 'no server answer'}")
    return Attempt(cli, path, ep, None, None, why)


def decide(attempts: list[Attempt]) -> tuple[Verdict, str, Attempt | None]:
    """Pure: the first engine that answered wins; else a refused socket is `denied`, no listener
    anywhere is `unsupported` (the CLI without an engine), anything else is `unknown`."""
    if not attempts:
        return Verdict.unsupported, "no docker or podman CLI on PATH", None
    for a in attempts:
        if a.info is not None:
            where = a.endpoint.address or "local (no daemon, podman runs in-process)"
            mode = {True: "rootless", False: "rootful", None: "rootless unknown"}[rootless(a.cli, a.info)]
            return Verdict.supported, f"{a.cli} engine answers via {where} ({a.endpoint.source}), {mode}", a
    for a in attempts:
        if a.connect in REFUSED_US:
            return (Verdict.denied, f"{a.cli}: the engine socket {a.endpoint.unix_path} refuses us "
                    f"({a.connect}): join its group or use a rootless engine", a)
    if all(a.connect in NO_LISTENER for a in attempts):
        said = "; ".join(f"{a.cli} CLI at {a.path} but no engine listening at {a.endpoint.unix_path} "
                         f"({a.connect})" for a in attempts)
        return Verdict.unsupported, said, attempts[0]
    said = "; ".join(f"{a.cli}: {a.failure}" for a in attempts)
    return Verdict.unknown, f"could not tell whether an engine is reachable: {said}", attempts[0]


def probe(host: Host) -> list[Finding]:
    attempts = [attempt(host, cli, path) for cli in ("docker", "podman") if (path := host.which(cli))]
    verdict, reason, chosen = decide(attempts)
    ev: dict[str, str] = {}
    for a in attempts:
        ev[f"{a.cli}.path"] = a.path
        ev[f"{a.cli}.endpoint"] = f"{a.endpoint.address or '-'} ({a.endpoint.source})"
        if a.connect:
            ev[f"{a.cli}.connect"] = a.connect
        if a.info is not None:
            version = a.info.get("ServerVersion") or a.info.get("version", {}).get("Version")
            ev[f"{a.cli}.server_version"] = str(version)
        else:
            ev[f"{a.cli}.failure"] = a.failure
    facts = {
        "cli": chosen.cli if chosen else None,
        "path": chosen.path if chosen else None,
        "socket": (chosen.endpoint.address if chosen else None),
        "rootless": rootless(chosen.cli, chosen.info) if chosen and chosen.info is not None else None,
        "reachable": bool(chosen and chosen.info is not None),
    }
    return [Finding("container_engine", verdict, reason, ev, facts)]
