"""`deployment`: the signature file schema, each arm matching alone (through `systemctl` and `docker`
shims found on PATH, run by the real subprocess wrapper), no signature, an arm that could not run,
and the env var that can only make the guard stricter."""

from __future__ import annotations

import contextlib
import os
import socket
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_conformance.probes import deployment
from sandbox_conformance.probes.deployment import BadSignature, Signature, parse_signature
from sandbox_conformance.probes.finding import Verdict
from sandbox_conformance.probes.host import Host

SIG = """\
[deployment]
unit_suffixes = ["-agent.service"]
config_paths = ["~/.config/agentd/config.toml", "/etc/agentd/agentd.toml"]
container_names = ["agentd-*"]
"""
LISTING_ARGS = "list-units --type=service,scope --state=active --no-legend --plain --no-pager"


def shim(bindir: Path, name: str, body: str) -> Path:
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def systemctl_shim(bindir: Path, *, system: str = "", user: str = "",
                   system_rc: int = 0, user_rc: int = 0) -> Path:
    """A systemctl that only answers the enumeration we promise to make, and logs each call."""
    return shim(bindir, "systemctl", f"""\
        echo "$*" >> "{bindir}/systemctl.calls"
        case "$*" in
          "--user {LISTING_ARGS}") printf '%b' '{user}'; exit {user_rc} ;;
          "{LISTING_ARGS}") printf '%b' '{system}'; exit {system_rc} ;;
        esac
        echo "unexpected: $*" >&2; exit 64
        """)


class FakeRoot:
    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "root"
        self.bin = tmp_path / "bin"
        self.bin.mkdir(parents=True)
        # PATH reaches our shims only (they are `#!/bin/sh` scripts using its builtins): this host's real
        # docker, podman and systemctl would answer for the real host.
        self.env = {"HOME": "/home/op", "PATH": str(self.bin), "XDG_RUNTIME_DIR": "/run/user/0"}

    def file(self, path: str, text: str = "") -> Path:
        p = self.root / path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return p

    def systemd(self, *, user_manager: bool = True) -> None:
        (self.root / "run/systemd/system").mkdir(parents=True)
        if user_manager:
            self.file("/run/user/0/systemd/private")

    def host(self, **env: str) -> Host:
        # PATH may only reach our shims and the system's sh/printf: no real systemctl or docker.
        return Host(root=self.root, proc=self.root / "proc", sys=self.root / "sys",
                    env={**self.env, **env}, euid=0, timeout=10)


@pytest.fixture
def fake(tmp_path) -> FakeRoot:
    f = FakeRoot(tmp_path)
    f.file("/etc/sandbox-conformance/deployment.toml", SIG)
    return f


@pytest.fixture
def listening(tmp_path) -> Iterator[tuple[socket.socket, str]]:
    """A unix socket something listens on, standing for the engine's socket (host path /run/docker.sock)."""
    path = tmp_path / "root/run/docker.sock"
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(4)
    try:
        yield s, "unix:///run/docker.sock"
    finally:
        s.close()


def finding(host: Host):
    (f,) = deployment.probe(host)
    return f


# --- the schema -----------------------------------------------------------------------------------

def test_a_valid_signature_parses_every_key():
    sig = parse_signature(SIG)
    assert sig == Signature(("-agent.service",), ("~/.config/agentd/config.toml", "/etc/agentd/agentd.toml"),
                            ("agentd-*",))
    assert sig.configured


@pytest.mark.parametrize(("text", "named"), [
    ("[deployment]\nunit_suffix = ['-a.service']\n", "unknown key(s) unit_suffix"),
    ("[deploy]\nunit_suffixes = []\n", "unknown top-level key(s) deploy"),
    ("[deployment]\nunit_suffixes = ['-agent']\n", "must end in .service or .scope"),
    ("[deployment]\nconfig_paths = ['etc/agentd']\n", "must be absolute or start with ~/"),
    ("[deployment]\ncontainer_names = 'agentd-*'\n", "must be a list of non-empty strings"),
    ("[deployment\n", "TOML"),
])
def test_a_malformed_signature_is_refused_with_the_reason(text, named):
    with pytest.raises(BadSignature, match=None) as e:
        parse_signature(text)
    assert named in str(e.value)


def test_files_merge_as_a_union():
    a = Signature(("-a.service",), (), ("x-*",))
    b = Signature(("-b.service", "-a.service"), ("/etc/b",), ())
    assert a.union(b) == Signature(("-a.service", "-b.service"), ("/etc/b",), ("x-*",))


# --- verdicts -------------------------------------------------------------------------------------

def test_no_signature_is_unknown_and_says_where_to_declare_one(tmp_path):
    f = finding(FakeRoot(tmp_path).host())
    assert f.verdict is Verdict.unknown
    assert f.facts["configured"] is False
    assert f.facts["declare_at"] == "/home/op/.config/sandbox-conformance/deployment.toml"
    assert f.facts["declare_at"] in f.reason


def test_a_malformed_file_is_unknown_naming_the_file_and_the_error(fake):
    fake.file("/home/op/.config/sandbox-conformance/deployment.toml", "[deployment]\nunits = ['x.service']\n")
    f = finding(fake.host())
    assert f.verdict is Verdict.unknown
    assert "/home/op/.config/sandbox-conformance/deployment.toml" in f.reason
    assert "unknown key(s) units" in f.reason


def test_a_unit_active_only_under_the_user_manager_is_detected(fake):
    fake.systemd()
    systemctl_shim(fake.bin, system=r"cron.service loaded active running cron\n",
                   user=r"dbus.service loaded active running D-Bus\n"
                        r"foo-agent.service loaded active running Agent\n")
    f = finding(fake.host())
    assert f.verdict is Verdict.detected, f.reason
    assert f.facts["matches"] == ["unit foo-agent.service (user manager)"]
    assert f.facts["arms"]["units"] == "matched"
    calls = (fake.bin / "systemctl.calls").read_text().splitlines()
    assert sorted(calls) == sorted([LISTING_ARGS, f"--user {LISTING_ARGS}"])  # both managers enumerated


def test_units_that_do_not_match_leave_the_arm_clear(fake):
    fake.systemd()
    systemctl_shim(fake.bin, system=r"agent.service loaded active running not-a-suffix-match\n")
    f = finding(fake.host())
    assert f.facts["arms"]["units"] == "clear"
    assert f.verdict is Verdict.not_detected, f.reason


def test_a_manager_that_does_not_answer_makes_the_finding_unknown(fake):
    fake.systemd()
    systemctl_shim(fake.bin, system_rc=1)
    f = finding(fake.host())
    assert f.verdict is Verdict.unknown
    assert f.facts["arms"]["units"].startswith("failed: system manager")
    assert "could not check" in f.reason


def test_a_running_manager_with_no_systemctl_is_failed_not_clear(fake):
    fake.systemd()
    f = finding(fake.host(PATH=str(fake.bin)))  # the empty shim dir: no systemctl anywhere
    assert f.verdict is Verdict.unknown
    assert "no systemctl on PATH" in f.reason


def test_a_failed_arm_does_not_hide_a_match_elsewhere(fake):
    fake.systemd()
    systemctl_shim(fake.bin, system_rc=1)
    fake.file("/etc/agentd/agentd.toml", "x = 1\n")
    f = finding(fake.host())
    assert f.verdict is Verdict.detected
    assert f.facts["matches"] == ["path /etc/agentd/agentd.toml"]


def test_no_systemd_at_all_is_a_clear_units_arm(fake):
    f = finding(fake.host())
    assert f.facts["arms"]["units"] == "clear"
    assert "/run/systemd/system absent" in f.evidence["arm.units"]


def test_a_config_path_present_alone_is_detected(fake):
    fake.file("/etc/agentd/agentd.toml")
    f = finding(fake.host())
    assert (f.verdict, f.facts["matches"]) == (Verdict.detected, ["path /etc/agentd/agentd.toml"])


def test_a_home_relative_config_path_is_expanded_with_home(fake):
    fake.file("/home/op/.config/agentd/config.toml")
    f = finding(fake.host())
    assert f.facts["matches"] == ["path /home/op/.config/agentd/config.toml"]
    assert not [m for m in finding(fake.host(HOME="/home/other")).facts["matches"]]


def test_a_container_listed_by_the_engine_is_detected(fake, listening):
    _, address = listening
    shim(fake.bin, "docker", """\
        [ "$1 $2 $3" = "ps --format {{.Names}}" ] || exit 64
        printf 'web-1\\nagentd-worker\\n'
        """)
    f = finding(fake.host(DOCKER_HOST=address))
    assert f.verdict is Verdict.detected, f.reason
    assert f.facts["matches"] == ["container agentd-worker (docker)"]


def test_an_engine_that_listens_but_fails_ps_is_unknown(fake, listening):
    _, address = listening
    shim(fake.bin, "docker", "echo 'Error response from daemon: boom' >&2; exit 1\n")
    f = finding(fake.host(DOCKER_HOST=address))
    assert f.verdict is Verdict.unknown
    assert f.facts["arms"]["containers"].startswith("failed: docker")


def test_an_engine_socket_nobody_listens_on_is_clear(fake):
    shim(fake.bin, "docker", "echo 'should not be asked' >&2; exit 1\n")
    f = finding(fake.host())  # default socket /var/run/docker.sock absent under the fake root
    assert f.facts["arms"]["containers"] == "clear"
    assert f.verdict is Verdict.not_detected, f.reason


@contextlib.contextmanager
def api(path: Path, answer: bytes) -> Iterator[list[bytes]]:
    """An engine's API on unix socket `path` that answers every request with `answer` (an HTTP
    response) and closes, the way dockerd answers HTTP/1.0; the requests it got are yielded."""
    path.parent.mkdir(parents=True, exist_ok=True)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(4)
    srv.settimeout(0.1)
    got: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                req = b""
                with contextlib.suppress(OSError):
                    while b"\r\n\r\n" not in req and (chunk := conn.recv(4096)):
                        req += chunk
                got.append(req)
                if req:  # a bare connect(2) (is anything listening?) sends nothing
                    conn.sendall(answer)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield got
    finally:
        stop.set()
        t.join(timeout=5)
        srv.close()


def ok(body: str) -> bytes:
    return f"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{body}".encode()


LIST = '[{"Id": "a1", "Names": ["/web-1"]}, {"Id": "b2", "Names": ["/agentd-worker"]}]'


@pytest.mark.parametrize("sock", ["/var/run/docker.sock", "/run/podman/podman.sock",
                                  "/run/user/0/podman/podman.sock"])
def test_an_engine_with_no_cli_on_path_is_asked_over_its_api(fake, sock):
    # A deployment agent that drives dockerd (or podman's service) over its API needs no CLI installed.
    with api(fake.root / sock.lstrip("/"), ok(LIST)) as got:
        f = finding(fake.host())
    assert f.verdict is Verdict.detected, f.reason
    cli = "docker" if "docker" in sock else "podman"
    assert f.facts["matches"] == [f"container agentd-worker ({cli}, {sock})"]
    assert any(r.startswith(b"GET /containers/json HTTP/1.0\r\n") for r in got)


def test_an_engine_with_no_cli_and_none_matching_is_clear(fake):
    with api(fake.root / "var/run/docker.sock", ok('[{"Names": ["/web-1"]}]')):
        f = finding(fake.host())
    assert f.facts["arms"]["containers"] == "clear", f.evidence
    assert f.verdict is Verdict.not_detected


@pytest.mark.parametrize("answer", [b"HTTP/1.0 403 Forbidden\r\n\r\n", ok("{not json"), ok('{"a": 1}'), b""])
def test_an_engine_with_no_cli_whose_api_cannot_list_is_unknown_not_clear(fake, answer):
    with api(fake.root / "var/run/docker.sock", answer):
        f = finding(fake.host())
    assert f.verdict is Verdict.unknown, f.reason
    assert f.facts["arms"]["containers"].startswith("failed"), f.facts


def test_the_env_config_adds_a_path_and_only_makes_the_guard_stricter(fake):
    fake.file("/etc/agentd2/state")
    assert finding(fake.host()).verdict is Verdict.not_detected
    fake.file("/srv/extra.toml", '[deployment]\nconfig_paths = ["/etc/agentd2/state"]\n')
    f = finding(fake.host(**{deployment.ENV: "/srv/extra.toml"}))
    assert f.verdict is Verdict.detected
    assert f.facts["config_files"] == ["/etc/sandbox-conformance/deployment.toml", "/srv/extra.toml"]
    assert f.facts["matches"] == ["path /etc/agentd2/state"]


def test_an_env_config_that_does_not_exist_is_unknown_not_ignored(fake):
    f = finding(fake.host(**{deployment.ENV: "/srv/missing.toml"}))
    assert f.verdict is Verdict.unknown
    assert "/srv/missing.toml" in f.reason


def test_the_env_config_alone_is_a_signature(tmp_path):
    fr = FakeRoot(tmp_path)
    fr.file("/srv/only.toml", '[deployment]\ncontainer_names = ["x-*"]\n')
    f = finding(fr.host(**{deployment.ENV: "/srv/only.toml"}))
    assert f.facts["configured"] is True
    assert f.facts["arms"]["units"] == "not configured"
    # Whether or not a docker CLI is on PATH, the fake root has no engine socket: clear.
    assert f.facts["arms"]["containers"] == "clear"
    assert f.verdict is Verdict.not_detected


# --- the real host --------------------------------------------------------------------------------

@pytest.mark.integration
def test_the_real_host_with_a_signature_and_no_systemd_or_engine_is_checked_and_clear(tmp_path, root_only):
    if os.path.isdir("/run/systemd/system") or os.path.exists("/var/run/docker.sock"):
        pytest.skip("this host runs systemd or a docker daemon: the all-clear shape does not apply")
    sig = tmp_path / "sig.toml"
    sig.write_text(f'[deployment]\nunit_suffixes = ["-agent.service"]\n'
                   f'config_paths = ["{tmp_path}/absent"]\ncontainer_names = ["agentd-*"]\n')
    env = {**os.environ, deployment.ENV: str(sig), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    f = finding(Host(env=env))
    assert f.verdict is Verdict.not_detected, f.reason
    assert f.facts["arms"] == {"units": "clear", "config_paths": "clear", "containers": "clear"}


@pytest.mark.parametrize("tree", ["fs/cgroup", "fs/cgroup/unified", "fs/cgroup/systemd"])
def test_another_users_running_unit_is_found_by_its_cgroup(fake, tree):
    # `sudo sandbox-conformance run` on a host whose agent runs in user 1001's lingering manager: root's
    # `systemctl --user` has no manager to ask (clear), and the system manager lists only
    # user@1001.service. Its cgroup directory is there for anyone to read.
    where = "user.slice/user-1001.slice/user@1001.service/app.slice/deploy-agent.service"
    (fake.root / "sys" / tree / where).mkdir(parents=True)
    f = finding(fake.host())
    assert f.verdict is Verdict.detected, f.reason
    assert f.facts["matches"] == [f"unit deploy-agent.service (cgroup {where})"]


def test_cgroup_directories_that_match_no_suffix_are_clear(fake):
    (fake.root / "sys/fs/cgroup/system.slice/ssh.service").mkdir(parents=True)
    (fake.root / "sys/fs/cgroup/user.slice/user-0.slice/session-1.scope").mkdir(parents=True)
    f = finding(fake.host())
    assert f.facts["arms"]["units"] == "clear" and "cgroups: 3 unit and slice" in f.evidence["arm.units"]
