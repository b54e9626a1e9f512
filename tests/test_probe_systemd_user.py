"""`systemd_user`: no systemd at all, systemd without a user manager (with and without linger), a
reachable manager (through a `systemctl` shim) with the controllers user@.service delegates, one
that does not answer; and the real host (no systemd here)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from sandbox_conformance.probes import systemd_user
from sandbox_conformance.probes.finding import Verdict
from sandbox_conformance.probes.host import Host

UID = 1000


class Fake:
    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "root"
        self.bin = tmp_path / "bin"
        self.bin.mkdir(parents=True)
        self.file("/proc/1/comm", "systemd\n")

    def file(self, path: str, text: str = "") -> Path:
        p = self.root / path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return p

    def shim(self, name: str, body: str) -> None:
        p = self.bin / name
        p.write_text("#!/bin/sh\n" + textwrap.dedent(body))
        p.chmod(0o755)

    def booted(self) -> None:
        (self.root / "run/systemd/system").mkdir(parents=True)

    def host(self, **env: str) -> Host:
        # Host.user comes from pwd (or the uid itself); tests use it, whatever this machine calls uid 1000.
        return Host(root=self.root, proc=self.root / "proc", sys=self.root / "sys",
                    env={"PATH": str(self.bin), **env}, euid=UID, timeout=10)


@pytest.fixture
def fake(tmp_path) -> Fake:
    return Fake(tmp_path)


def probe(h: Host):
    (f,) = systemd_user.probe(h)
    return f


def test_no_systemd_is_unsupported_naming_it(fake):
    fake.file("/proc/1/comm", "process_api\n")
    f = probe(fake.host())
    assert f.verdict is Verdict.unsupported
    assert "no systemd on this host (PID 1 is process_api" in f.reason
    assert f.facts["bus"] is None and f.facts["booted"] is False


def test_systemd_without_a_user_manager_names_no_session_and_no_linger(fake):
    fake.booted()
    f = probe(fake.host())
    assert f.verdict is Verdict.unsupported
    assert f"no user manager for {fake.host().user} (uid {UID})" in f.reason
    assert "no login session and no linger" in f.reason
    assert "loginctl enable-linger" in f.reason


def test_linger_without_a_running_manager_is_named_as_such(fake):
    fake.booted()
    fake.file(f"/var/lib/systemd/linger/{fake.host().user}")
    f = probe(fake.host())
    assert f.verdict is Verdict.unsupported
    assert "although linger is enabled" in f.reason


def reachable(fake: Fake, *, rc: int = 0, says: str = "Version=252") -> None:
    fake.booted()
    fake.file(f"/run/user/{UID}/systemd/private")
    fake.shim("systemctl", f"""\
        [ "$*" = "--user show --property=Version --no-pager" ] || exit 64
        [ "$XDG_RUNTIME_DIR" = "/run/user/{UID}" ] || exit 65
        printf '%s' '{says}'; exit {rc}
        """)
    fake.shim("systemd-run", "exit 0\n")


def test_a_reachable_manager_with_systemd_run_is_supported_with_its_delegated_controllers(fake):
    reachable(fake)
    fake.file(f"/sys/fs/cgroup/user.slice/user-{UID}.slice/user@{UID}.service/cgroup.controllers",
              "cpu memory pids\n")
    f = probe(fake.host())
    assert f.verdict is Verdict.supported, f.reason
    assert f.facts["delegated_controllers"] == ["cpu", "memory", "pids"]
    assert f.facts["systemd_run"] == str(fake.bin / "systemd-run")
    assert f.facts["bus"] == f"/run/user/{UID}/systemd/private"
    assert "delegated: cpu memory pids" in f.reason


def test_the_session_bus_address_is_used_when_set(fake):
    reachable(fake)
    (fake.root / f"run/user/{UID}/systemd/private").unlink()
    fake.file("/tmp/dbus-abc")
    f = probe(fake.host(DBUS_SESSION_BUS_ADDRESS="unix:path=/tmp/dbus-abc,guid=0123"))
    assert f.verdict is Verdict.supported, f.reason
    assert f.facts["bus"] == "/tmp/dbus-abc"


def test_hybrid_hosts_keep_user_service_cgroups_under_unified(fake):
    reachable(fake)
    user_service = f"user.slice/user-{UID}.slice/user@{UID}.service"
    fake.file(f"/sys/fs/cgroup/unified/{user_service}/cgroup.controllers", "\n")
    f = probe(fake.host())
    assert f.verdict is Verdict.supported
    assert f.facts["delegated_controllers"] == []
    assert "delegated: none" in f.reason


def test_a_manager_socket_that_does_not_answer_is_unknown(fake):
    reachable(fake, rc=1)
    f = probe(fake.host())
    assert f.verdict is Verdict.unknown
    assert "did not answer" in f.reason


@pytest.mark.parametrize(("says", "why"), [
    ("", "exit 0 with no output"),
    ("hello\n", "exit 0 but no Version= in its output ('hello')"),
])
def test_a_systemctl_that_exits_0_without_an_answer_is_not_a_reachable_manager(fake, says, why):
    """Issue 12: a stub systemctl (`exit 0`, as container images ship) was read as a reachable user
    manager."""
    reachable(fake, says=says)
    f = probe(fake.host())
    assert f.verdict is Verdict.unknown
    assert why in f.reason
    assert f.facts["reachable"] is False


def test_a_reachable_manager_without_systemd_run_is_unsupported(fake):
    reachable(fake)
    (fake.bin / "systemd-run").unlink()
    f = probe(fake.host())
    assert f.verdict is Verdict.unsupported
    assert "no systemd-run" in f.reason


@pytest.mark.parametrize(("address", "path"), [
    ("unix:path=/run/user/1000/bus", "/run/user/1000/bus"),
    ("unix:path=/run/user/1000/bus,guid=abc", "/run/user/1000/bus"),
    ("unix:abstract=/tmp/dbus-x;unix:path=/tmp/b", "/tmp/b"),
    ("tcp:host=localhost,port=1", None),
])
def test_bus_path_parses_dbus_addresses(address, path):
    assert systemd_user.bus_path(address) == path


@pytest.mark.integration
def test_the_real_host_without_systemd_says_no_systemd():
    if os.path.isdir("/run/systemd/system"):
        pytest.skip("this host runs systemd")
    f = probe(Host())
    assert f.verdict is Verdict.unsupported
    assert "no systemd on this host" in f.reason
