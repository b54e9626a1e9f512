"""`container_engine`: no CLI, a CLI with no engine listening, a refused socket, an engine that
answers (rootless or not), one that does not; and the real host, with no daemon and with a
throwaway dockerd on a private socket (killed and removed in a finally)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_conformance.probes import container_engine as ce
from sandbox_conformance.probes.finding import Verdict
from sandbox_conformance.probes.host import Host

INFO = {"ServerVersion": "24.0.7", "SecurityOptions": ["name=seccomp,profile=builtin", "name=rootless"]}


def shim(bindir: Path, name: str, body: str) -> Path:
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def info_shim(bindir: Path, name: str, doc: dict | None, rc: int = 0) -> Path:
    out = json.dumps(doc) if doc is not None else ""
    return shim(bindir, name, f"""\
        echo "$*" >> "{bindir}/{name}.calls"
        [ "$1 $2 $3" = "info --format {{{{json .}}}}" ] || exit 64
        printf '%s\\n' '{out}'
        exit {rc}
        """)


@pytest.fixture
def root(tmp_path) -> Path:
    r = tmp_path / "root"
    r.mkdir()
    return r


@pytest.fixture
def bindir(tmp_path) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    return d


def host(root: Path, bindir: Path, **env: str) -> Host:
    # Only the shims are on PATH (they use sh builtins): the machine's real docker CLI is not.
    return Host(root=root, proc=root / "proc", sys=root / "sys",
                env={"PATH": str(bindir), "HOME": "/home/op", **env}, timeout=10)


@pytest.fixture
def listening(root) -> Iterator[str]:
    path = root / "var/run/docker.sock"
    path.parent.mkdir(parents=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(4)
    try:
        yield "/var/run/docker.sock"
    finally:
        s.close()


def probe(h: Host):
    (f,) = ce.probe(h)
    return f


def test_no_cli_is_unsupported(root, bindir):
    f = probe(host(root, bindir))
    assert f.verdict is Verdict.unsupported
    assert f.facts["cli"] is None
    assert "no docker or podman CLI" in f.reason


def test_a_cli_with_no_engine_listening_is_unsupported_without_asking_the_cli(root, bindir):
    info_shim(bindir, "docker", INFO)
    f = probe(host(root, bindir))
    assert f.verdict is Verdict.unsupported
    assert f.facts["cli"] == "docker"
    assert f.facts["socket"] == "unix:///var/run/docker.sock"
    assert "ENOENT" in f.reason
    assert not (bindir / "docker.calls").exists()  # connect(2) answered; the CLI was not run


def test_a_stale_socket_nobody_listens_on_is_unsupported(root, bindir):
    path = root / "var/run/docker.sock"
    path.parent.mkdir(parents=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # the file stays, the listener is gone: ECONNREFUSED
    info_shim(bindir, "docker", INFO)
    f = probe(host(root, bindir))
    assert f.verdict is Verdict.unsupported
    assert "ECONNREFUSED" in f.reason


def test_an_engine_that_answers_is_supported_with_socket_and_rootless(root, bindir, listening):
    info_shim(bindir, "docker", INFO)
    f = probe(host(root, bindir))
    assert f.verdict is Verdict.supported, f.reason
    assert f.facts == {"cli": "docker", "path": str(bindir / "docker"), "socket": "unix:///var/run/docker.sock",
                       "rootless": True, "reachable": True}
    assert f.evidence["docker.server_version"] == "24.0.7"


def test_a_rootful_engine_is_rootless_false(root, bindir, listening):
    info_shim(bindir, "docker", {**INFO, "SecurityOptions": ["name=seccomp,profile=default"]})
    assert probe(host(root, bindir)).facts["rootless"] is False


def test_docker_host_names_the_socket(root, bindir, listening):
    os.rename(root / "var/run/docker.sock", root / "var/run/other.sock")
    info_shim(bindir, "docker", INFO)
    f = probe(host(root, bindir, DOCKER_HOST="unix:///var/run/other.sock"))
    assert f.verdict is Verdict.supported
    assert f.facts["socket"] == "unix:///var/run/other.sock"
    assert "DOCKER_HOST" in f.reason


def test_a_listening_socket_whose_cli_fails_is_unknown(root, bindir, listening):
    info_shim(bindir, "docker", {"ServerVersion": ""}, rc=1)  # the client half only
    f = probe(host(root, bindir))
    assert f.verdict is Verdict.unknown
    assert "docker info` exit 1" in f.reason


def test_a_remote_engine_that_does_not_answer_is_unknown(root, bindir):
    info_shim(bindir, "docker", None, rc=1)
    f = probe(host(root, bindir, DOCKER_HOST="tcp://192.0.2.1:2376"))
    assert f.verdict is Verdict.unknown
    assert f.facts["socket"] == "tcp://192.0.2.1:2376"


def test_a_docker_context_is_followed_by_asking_the_cli(root, bindir):
    cfg = root / "home/op/.docker/config.json"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(json.dumps({"currentContext": "rootless"}))
    info_shim(bindir, "docker", INFO)
    f = probe(host(root, bindir))
    assert f.verdict is Verdict.supported
    assert "context rootless" in f.reason


def test_podman_answers_without_a_daemon(root, bindir):
    info_shim(bindir, "podman", {"host": {"security": {"rootless": True}}, "version": {"Version": "4.3.1"}})
    f = probe(host(root, bindir))
    assert f.verdict is Verdict.supported
    assert (f.facts["cli"], f.facts["socket"], f.facts["rootless"]) == ("podman", None, True)


def test_a_slow_podman_gets_the_hosts_whole_timeout_not_the_daemon_clis(root, bindir, monkeypatch):
    """`podman info` does the engine's work itself (no daemon): slower than `docker info` asking one,
    seen over 5 s in a TCG guest. Only the docker CLI is held to CLI_TIMEOUT."""
    monkeypatch.setattr(ce, "CLI_TIMEOUT", 0.2)
    doc = json.dumps({"host": {"security": {"rootless": False}}, "version": {"Version": "4.3.1"}})
    shim(bindir, "podman", f"""\
        /bin/sleep 0.6
        printf '%s\\n' '{doc}'
        """)
    f = probe(host(root, bindir))
    assert f.verdict is Verdict.supported, f.reason
    assert f.facts["cli"] == "podman"


def test_a_refused_socket_is_denied():
    ep = ce.Endpoint("docker", "unix:///var/run/docker.sock", "default")
    a = ce.Attempt("docker", "/usr/bin/docker", ep, "EACCES", None, "connect: EACCES")
    verdict, reason, chosen = ce.decide([a])
    assert verdict is Verdict.denied
    assert "EACCES" in reason and chosen is a


# --- the real host --------------------------------------------------------------------------------

@pytest.mark.integration
def test_the_real_host_without_a_daemon_says_so(tmp_path):
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI on this host")
    if os.path.exists(ce.DOCKER_DEFAULT_SOCKET):
        pytest.skip("an engine socket exists: not the no-daemon shape")
    # The docker CLI alone on PATH: podman (installed for its adapter) needs no daemon, and answers.
    (tmp_path / "docker").symlink_to(docker)
    drop = ("DOCKER_HOST", "DOCKER_CONTEXT", "CONTAINER_HOST", "PATH")
    env = {**{k: v for k, v in os.environ.items() if k not in drop}, "PATH": str(tmp_path)}
    f = probe(Host(env=env))
    assert f.verdict is Verdict.unsupported, f.reason
    assert "no engine listening at /var/run/docker.sock (ENOENT)" in f.reason


@pytest.fixture
def throwaway_dockerd(root_only) -> Iterator[str]:
    """A real dockerd on a private socket, no bridge, no iptables; gone (with its dirs) afterwards."""
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        pytest.skip("no dockerd binary")
    work = Path(tempfile.mkdtemp(prefix="sbxc-dockerd-"))
    sock = work / "docker.sock"
    log = (work / "log").open("w")
    proc = subprocess.Popen(
        [dockerd, "--host", f"unix://{sock}",
         "--data-root", str(work / "data"),
         "--exec-root", str(work / "exec"),
         "--pidfile", str(work / "pid"),
         "--bridge", "none", "--iptables=false"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while ce.connect_errno(sock) is not None:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"dockerd did not come up: {(work / 'log').read_text()[-300:]}")
            time.sleep(0.2)
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # containerd and anything else it started
        proc.wait()
        log.close()
        for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
            mp = line.split()[4]
            if mp.startswith(str(work)):
                subprocess.run(["umount", "-l", mp], timeout=10, check=False)
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.integration
def test_a_real_throwaway_dockerd_is_reachable_through_its_socket(throwaway_dockerd):
    env = {**os.environ, "DOCKER_HOST": throwaway_dockerd}
    f = probe(Host(env=env))
    assert f.verdict is Verdict.supported, f.reason
    assert f.facts["socket"] == throwaway_dockerd
    assert f.facts["rootless"] is False  # started by root, no rootlesskit
    assert f.facts["cli"] == "docker"
