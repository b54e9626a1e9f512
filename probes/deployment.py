"""`deployment`: is this a deployment host, one the conformance run must not disturb?

The user declares what a deployment looks like (a *signature*) in TOML; three arms look for it:

- units: active units enumerated under the system manager AND our user manager
  (`systemctl [--user] list-units --type=service,scope --state=active --no-legend --plain`) and
  matched on name suffix. Never `is-active` of one guessed name: a renamed unit would pass. And the
  units running under ANY manager, by their cgroup directories (another user's lingering manager,
  which `systemctl --user` never lists for the caller).
- config_paths: a declared path (absolute or `~/`-relative) exists.
- containers: `docker ps` / `podman ps` names matched against glob patterns; where a CLI is not on
  PATH, its engine's sockets are looked at all the same, and one that listens is asked over the
  Docker-compatible API (`GET /containers/json`): an agent that drives its engine over the API
  needs no CLI installed.

Signature files, all read and merged as a union (so adding one can only make the guard stricter):
  /etc/sandbox-conformance/deployment.toml
  ${XDG_CONFIG_HOME:-~/.config}/sandbox-conformance/deployment.toml
  $SANDBOX_CONFORMANCE_DEPLOYMENT_CONFIG (must exist when set: a promise of a signature)
Schema (every key optional, no other keys allowed: a misspelt key would silently weaken the guard):
  [deployment]
  unit_suffixes = ["-agent.service"]               # each must end in .service or .scope
  config_paths = ["~/.config/agentd/config.toml", "/etc/agentd"]
  container_names = ["agentd-*"]                   # fnmatch globs, case-sensitive

Verdicts: detected when any arm matched; unknown when no signature is configured (never "safe";
facts.configured is False), when a signature file is malformed, or when a configured arm could not
run and nothing matched; not_detected only when every configured arm ran and found nothing.

What counts as "ran": a manager or engine that provably does not exist has no active units or
containers, so it is clear, not failed -- no /run/systemd/system (sd_booted(3)), no
$XDG_RUNTIME_DIR/systemd/private (no user manager), or connect(2) to the engine's local socket
fails with ENOENT/ECONNREFUSED (nothing listening). A manager or engine that exists but does not
answer is failed."""

from __future__ import annotations

import fnmatch
import os
import pwd
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from sandbox_conformance.probes import container_engine as engines
from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes import inputs

ENV = "SANDBOX_CONFORMANCE_DEPLOYMENT_CONFIG"
SYSTEM_FILE = "/etc/sandbox-conformance/deployment.toml"
USER_FILE = "sandbox-conformance/deployment.toml"  # under ${XDG_CONFIG_HOME:-~/.config}
KEYS = ("unit_suffixes", "config_paths", "container_names")
UNIT_TYPES = (".service", ".scope")  # what list-units --type=service,scope can ever show
# The Host's trial bound (probes/host.py). A manager answers in milliseconds on a real host, but
# `systemctl --user show` alone took 1.7 s in a TCG guest with systemd 252 as PID 1 and more
# beside the other probes' children (tests/test_host_shape_lab.py): a tighter bound turned a
# slow answer into `unknown`, a refusal.
CMD_TIMEOUT = 10.0


class Signature(NamedTuple):
    unit_suffixes: tuple[str, ...] = ()
    config_paths: tuple[str, ...] = ()
    container_names: tuple[str, ...] = ()

    @property
    def configured(self) -> bool:
        return bool(self.unit_suffixes or self.config_paths or self.container_names)

    def union(self, other: Signature) -> Signature:
        def merge(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(dict.fromkeys(a + b))
        return Signature(*(merge(getattr(self, k), getattr(other, k)) for k in KEYS))


class BadSignature(ValueError):
    pass


def parse_signature(text: str) -> Signature:
    """Parse and validate one signature file's text; BadSignature names the problem."""
    import tomllib  # only when a signature file exists: most runs have none, and start-up counts

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BadSignature(f"TOML: {e}") from None
    extra = sorted(set(doc) - {"deployment"})
    if extra:
        raise BadSignature(f"unknown top-level key(s) {', '.join(extra)}; expected [deployment]")
    table = doc.get("deployment", {})
    if not isinstance(table, dict):
        raise BadSignature("deployment must be a table")
    bad = sorted(set(table) - set(KEYS))
    if bad:
        raise BadSignature(f"unknown key(s) {', '.join(bad)} in [deployment]; known: {', '.join(KEYS)}")
    values: dict[str, tuple[str, ...]] = {}
    for key in KEYS:
        items = table.get(key, [])
        if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
            raise BadSignature(f"deployment.{key} must be a list of non-empty strings")
        values[key] = tuple(items)
    for s in values["unit_suffixes"]:
        if not s.endswith(UNIT_TYPES):
            raise BadSignature(f"unit suffix {s!r} must end in .service or .scope (units are listed "
                                 f"with their type, so it could never match)")
    for p in values["config_paths"]:
        if not (p.startswith("/") or p == "~" or p.startswith("~/")):
            raise BadSignature(f"config path {p!r} must be absolute or start with ~/")
    return Signature(**values)


def home(host: Host) -> str:
    if host.env.get("HOME"):
        return host.env["HOME"]
    try:
        return pwd.getpwuid(host.euid).pw_dir
    except KeyError:
        return "/"


def expand(host: Host, path: str) -> str:
    return home(host) + path[1:] if path == "~" or path.startswith("~/") else path


def signature_files(host: Host) -> list[tuple[str, bool]]:
    """(host-absolute path, required) in reading order; only the env var's file is required."""
    config_home = host.env.get("XDG_CONFIG_HOME") or os.path.join(home(host), ".config")
    files = [(SYSTEM_FILE, False), (os.path.join(config_home, USER_FILE), False)]
    if host.env.get(ENV):
        files.append((host.env[ENV], True))
    return files


class Loaded(NamedTuple):
    signature: Signature
    read: tuple[str, ...]
    errors: tuple[str, ...]  # "path: problem"


def _read(where: Path) -> str | None:
    """The signature file's text; None where nothing is there (ENOENT, or ENOTDIR: a file where a
    directory of its path should be). Read as every input is (processes/inputs.py): a FIFO would block
    open(2) until a writer came, /dev/zero never ends, a symlink loop is ELOOP; each an UnusableInput."""
    try:
        os.stat(where)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise inputs.UnusableInput(e.strerror or str(e)) from None
    return inputs.read_text(where)


def check_config(value: str) -> str | None:
    """What is wrong with `value` as $SANDBOX_CONFORMANCE_DEPLOYMENT_CONFIG, or None: for `run` to say
    before anything is probed (a usage error), not as a refusal after the probes."""
    if not os.path.isabs(value):
        return "must be an absolute path"
    try:
        text = _read(Path(value))
    except inputs.UnusableInput as e:
        return f"cannot read: {e}"
    if text is None:
        return "does not exist"
    try:
        parse_signature(text)
    except BadSignature as e:
        return str(e)
    return None


def load(host: Host) -> Loaded:
    sig, read, errors = Signature(), [], []
    for path, required in signature_files(host):
        if not os.path.isabs(path):
            errors.append(f"{path}: {ENV} must be an absolute path")
            continue
        try:
            text = _read(host.path(path))
        except inputs.UnusableInput as e:
            errors.append(f"{path}: cannot read: {e}")
            continue
        if text is None:
            if required:
                errors.append(f"{path}: does not exist ({ENV} names it)")
            continue
        read.append(path)
        try:
            sig = sig.union(parse_signature(text))
        except BadSignature as e:
            errors.append(f"{path}: {e}")
    return Loaded(sig, tuple(read), tuple(errors))


class Arm(NamedTuple):
    state: str  # "matched" | "clear" | "failed" | "not configured"
    detail: str
    matches: tuple[str, ...] = ()

    @property
    def summary(self) -> str:
        return f"failed: {self.detail}" if self.state == "failed" else self.state


def combine(parts: Iterable[Arm]) -> Arm:
    """One arm from its parts (system + user manager; docker + podman): matched beats failed beats clear."""
    parts = list(parts)
    matches = tuple(m for p in parts for m in p.matches)
    detail = "; ".join(p.detail for p in parts)
    for state in ("matched", "failed"):
        if any(p.state == state for p in parts):
            return Arm(state, detail, matches)
    return Arm("clear", detail)


def unit_names(listing: str) -> list[str]:
    # --plain --no-legend: `UNIT LOAD ACTIVE SUB DESCRIPTION...`, no bullets or headers.
    return [line.split()[0] for line in listing.splitlines() if line.strip()]


LIST_UNITS = ("list-units", "--type=service,scope", "--state=active", "--no-legend", "--plain", "--no-pager")


def _manager(host: Host, *, user: bool, suffixes: tuple[str, ...]) -> Arm:
    which = "user manager" if user else "system manager"
    runtime = host.env.get("XDG_RUNTIME_DIR") or f"/run/user/{host.euid}"
    if not user and not host.path("/run/systemd/system").is_dir():
        # sd_booted(3): this directory exists iff systemd is PID 1. No system manager: no system units.
        return Arm("clear", f"{which}: none (/run/systemd/system absent: systemd is not PID 1)")
    if user and not host.path(f"{runtime}/systemd/private").exists():
        return Arm("clear", f"{which}: none for uid {host.euid} ({runtime}/systemd/private absent)")
    systemctl = host.which("systemctl")
    if systemctl is None:
        return Arm("failed", f"{which}: running, but no systemctl on PATH to list its units")
    env = {"PATH": host.env.get("PATH", "/usr/bin:/bin"), "LANG": "C", "SYSTEMD_COLORS": "0",
           "XDG_RUNTIME_DIR": runtime}
    if user and host.env.get("DBUS_SESSION_BUS_ADDRESS"):
        env["DBUS_SESSION_BUS_ADDRESS"] = host.env["DBUS_SESSION_BUS_ADDRESS"]
    argv = [systemctl, *(["--user"] if user else []), *LIST_UNITS]
    done = host.runner(argv, timeout=min(CMD_TIMEOUT, host.timeout), env=env)
    if not done.ok:
        why = "timed out" if done.timed_out else f"exit {done.returncode}: {done.stderr_tail(1)}"
        return Arm("failed", f"{which}: `systemctl{' --user' if user else ''} list-units` {why}")
    names = unit_names(done.stdout)
    hits = tuple(f"unit {n} ({which})" for n in names if n.endswith(suffixes))
    if hits:
        return Arm("matched", f"{which}: {len(hits)} active unit(s) match", hits)
    return Arm("clear", f"{which}: {len(names)} active unit(s), none match")


# Where systemd keeps a unit's processes, one directory per running unit named as the unit
# (systemd.resource-control(5)): in the unified hierarchy, or in a hybrid host's two. Readable by
# anyone, and holding every user's units, where `systemctl --user` answers for the caller's alone.
CGROUP_TREES = ("fs/cgroup", "fs/cgroup/unified", "fs/cgroup/systemd")
CGROUP_SLICES = ("system.slice", "user.slice")
CGROUP_DEPTH = 6  # user.slice/user-1001.slice/user@1001.service/app.slice/NAME.service and below
CGROUP_DIRS = 20000


def _cgroup_units(host: Host, suffixes: tuple[str, ...]) -> Arm:
    """Units running now whatever manager runs them, by their cgroup directories: another user's
    lingering manager (an agent under `user@1001.service`, which root's `systemctl --user` never
    lists), and a unit listed as activating between restarts while its processes still run."""
    hits: list[str] = []
    looked = 0
    for tree in CGROUP_TREES:
        level = [host.sys / tree / s for s in CGROUP_SLICES]
        for _ in range(CGROUP_DEPTH):
            nxt = []
            for d in level:
                try:
                    entries = [e for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
                except OSError:
                    continue
                for e in entries:
                    looked += 1
                    if e.name.endswith(suffixes):
                        hits.append(f"unit {e.name} (cgroup {os.path.relpath(e.path, host.sys / tree)})")
                    nxt.append(Path(e.path))
            level = nxt[:CGROUP_DIRS]
            if looked > CGROUP_DIRS:
                break
    hits = list(dict.fromkeys(hits))
    if hits:
        return Arm("matched", f"cgroups: {len(hits)} running unit(s) match", tuple(hits))
    return Arm("clear", f"cgroups: {looked} unit and slice director(ies), none match")


def units_arm(host: Host, sig: Signature) -> Arm:
    if not sig.unit_suffixes:
        return Arm("not configured", "no unit_suffixes declared")
    return combine([_manager(host, user=False, suffixes=sig.unit_suffixes),
                    _manager(host, user=True, suffixes=sig.unit_suffixes),
                    _cgroup_units(host, sig.unit_suffixes)])


def paths_arm(host: Host, sig: Signature) -> Arm:
    if not sig.config_paths:
        return Arm("not configured", "no config_paths declared")
    parts = []
    for declared in sig.config_paths:
        path = expand(host, declared)
        try:
            os.lstat(host.path(path))
            parts.append(Arm("matched", f"{path} exists", (f"path {path}",)))
        except (FileNotFoundError, NotADirectoryError):
            parts.append(Arm("clear", f"{path} absent"))
        except PermissionError:
            parts.append(Arm("failed", f"{path}: cannot tell, EACCES on a parent"))
    return combine(parts)


def _engine(host: Host, cli: str, path: str, patterns: tuple[str, ...]) -> Arm:
    ep = engines.endpoint(host, cli)
    if ep.unix_path is not None:
        err = engines.connect_errno(host.path(ep.unix_path))
        if err in engines.NO_LISTENER:
            return Arm("clear", f"{cli}: no engine listening at {ep.unix_path} ({err})")
        if err is not None:
            return Arm("failed", f"{cli}: cannot talk to {ep.unix_path} ({err})")
    done = host.runner([path, "ps", "--format", "{{.Names}}"], timeout=min(CMD_TIMEOUT, host.timeout),
                       env=engines.cli_env(host))
    if not done.ok:
        why = "timed out" if done.timed_out else f"exit {done.returncode}: {done.stderr_tail(1)}"
        return Arm("failed", f"{cli}: `{cli} ps` {why}")
    names = [n.strip() for n in done.stdout.splitlines() if n.strip()]
    hits = tuple(f"container {n} ({cli})" for n in names
                 if any(fnmatch.fnmatchcase(n, p) for p in patterns))
    if hits:
        return Arm("matched", f"{cli}: {len(hits)} running container(s) match", hits)
    return Arm("clear", f"{cli}: {len(names)} running container(s), none match")


# Where an engine listens when its CLI is not installed (a deployment agent drives it over its API):
# dockerd's default, podman.socket's rootful and rootless ones (podman-system-service(1)).
PODMAN_SOCKETS = ("/run/podman/podman.sock", "{XDG_RUNTIME_DIR}/podman/podman.sock")
API_LIMIT = 4 << 20  # bytes of `GET /containers/json` read: a few thousand containers' worth


def _api_names(path: Path, timeout: float) -> list[str]:
    """The running containers' names, asked of the Docker-compatible API on unix socket `path`
    (`GET /containers/json`, which dockerd and podman's service both answer: each container's
    "Names", "/"-prefixed). HTTP/1.0: the server closes after one answer. Raises OSError or ValueError."""
    import json
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as s:
        s.settimeout(timeout)
        s.connect(os.fspath(path))
        s.sendall(b"GET /containers/json HTTP/1.0\r\nHost: engine\r\n\r\n")
        data = b""
        while len(data) < API_LIMIT and (chunk := s.recv(65536)):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    first = head.split(b"\r\n", 1)[0]
    status = first.split()
    if len(status) < 2 or status[1] != b"200":
        raise ValueError(f"the API answered {first.decode(errors='replace')[:80]!r}")
    doc = json.loads(body)
    if not isinstance(doc, list):
        raise ValueError("the API's container list is not a list")
    return [str(n).lstrip("/") for c in doc if isinstance(c, dict) for n in c.get("Names") or ()]


def _engine_without_cli(host: Host, cli: str, patterns: tuple[str, ...]) -> Arm:
    """No `cli` on PATH: an engine may listen all the same. Nothing listening at its sockets is clear;
    one that listens is asked over its API, and one that cannot be asked is failed, never clear."""
    if cli == "docker":
        # DOCKER_HOST's socket, and the default one beside a tcp:// DOCKER_HOST: the agent need not use it.
        paths = list(dict.fromkeys(p for p in (engines.endpoint(host, cli).unix_path,
                                               engines.DOCKER_DEFAULT_SOCKET) if p))
    else:
        runtime = host.env.get("XDG_RUNTIME_DIR") or f"/run/user/{host.euid}"
        paths = [p.replace("{XDG_RUNTIME_DIR}", runtime) for p in PODMAN_SOCKETS]
    arms = []
    for path in paths:
        err = engines.connect_errno(host.path(path))
        if err in engines.NO_LISTENER:
            arms.append(Arm("clear", f"{cli}: no CLI on PATH, nothing listening at {path} ({err})"))
            continue
        if err is not None:
            arms.append(Arm("failed", f"{cli}: no CLI on PATH, and {path} listens but refuses us ({err})"))
            continue
        try:
            names = _api_names(host.path(path), min(CMD_TIMEOUT, host.timeout))
        except (OSError, ValueError) as e:
            why = "timed out" if isinstance(e, TimeoutError) else str(e)
            arms.append(Arm("failed", f"{cli}: no CLI on PATH; an engine listens at {path}, and its API "
                                      f"could not list containers: {why}"))
            continue
        hits = tuple(f"container {n} ({cli}, {path})" for n in names
                     if any(fnmatch.fnmatchcase(n, p) for p in patterns))
        arms.append(Arm("matched", f"{cli}: {len(hits)} running container(s) match", hits) if hits
                    else Arm("clear", f"{cli} at {path} (its API: no CLI on PATH): {len(names)} running "
                                      "container(s), none match"))
    return combine(arms)


def containers_arm(host: Host, sig: Signature) -> Arm:
    if not sig.container_names:
        return Arm("not configured", "no container_names declared")
    parts = []
    for cli in ("docker", "podman"):
        path = host.which(cli)
        parts.append(_engine(host, cli, path, sig.container_names) if path
                     else _engine_without_cli(host, cli, sig.container_names))
    return combine(parts)


def decide(loaded: Loaded, arms: Mapping[str, Arm], declare_at: str) -> tuple[Verdict, str]:
    """Pure: the verdict and its one-line reason."""
    if loaded.errors:
        return Verdict.unknown, f"malformed deployment signature: {'; '.join(loaded.errors)}"
    if not loaded.signature.configured:
        return Verdict.unknown, f"no deployment signature to check: declare one at {declare_at}"
    matched = [m for a in arms.values() for m in a.matches]
    if matched:
        return Verdict.detected, f"deployment signature matched: {', '.join(matched)}"
    failed = {n: a for n, a in arms.items() if a.state == "failed"}
    if failed:
        return Verdict.unknown, "could not check: " + "; ".join(f"{n}: {a.detail}" for n, a in failed.items())
    checked = [n for n, a in arms.items() if a.state != "not configured"]
    return Verdict.not_detected, f"signature checked ({', '.join(checked)}), nothing matched"


def probe(host: Host) -> list[Finding]:
    loaded = load(host)
    declare_at = signature_files(host)[1][0]
    arms: dict[str, Arm] = {}
    if not loaded.errors and loaded.signature.configured:
        sig = loaded.signature
        arms = {"units": units_arm(host, sig), "config_paths": paths_arm(host, sig),
                "containers": containers_arm(host, sig)}
    verdict, reason = decide(loaded, arms, declare_at)
    ev: dict[str, str] = {f"file {p}": "read" for p in loaded.read}
    ev.update({f"error.{i}": e for i, e in enumerate(loaded.errors)})
    ev.update({f"arm.{n}": f"{a.state}: {a.detail}" for n, a in arms.items()})
    facts: dict[str, Any] = {
        "configured": loaded.signature.configured,
        "matches": [m for a in arms.values() for m in a.matches],
        "arms": ({n: a.summary for n, a in arms.items()} if arms
                 else {n: "not configured" for n in ("units", "config_paths", "containers")}),
        "config_files": list(loaded.read),
        "errors": list(loaded.errors),
        "declare_at": declare_at,
    }
    return [Finding("deployment", verdict, reason, ev, facts)]
