"""`platform`: container evidence weighed in systemd-detect-virt's order, conflicts reported as such,
WSL from osrelease. Fake hosts in tmp_path, plus the real host (which carries a stray /.dockerenv)."""

from __future__ import annotations

import json
import os
import platform as stdlib_platform
import sys
from pathlib import Path

import pytest

from sandbox_conformance.probes import platform
from sandbox_conformance.probes.finding import Verdict
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes.children import run

INIT = platform.INIT_INO


def fake_host(tmp_path: Path, *, files: dict[str, str] | None = None, pid1_env: str | None = None,
              ns: dict[str, int] | None = None, cgroup: str = "0::/\n",
              osrelease: str = "6.1.0-18-amd64") -> Host:
    proc = tmp_path / "proc"
    (proc / "self/ns").mkdir(parents=True)
    (proc / "1").mkdir()
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "sys/kernel/osrelease").write_text(osrelease + "\n")
    (proc / "self/cgroup").write_text(cgroup)
    if pid1_env is not None:
        (proc / "1/environ").write_bytes(pid1_env.encode().replace(b" ", b"\0"))
    for name, ino in (INIT if ns is None else ns).items():
        os.symlink(f"{name}:[{ino}]", proc / "self/ns" / name)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/os-release").write_text('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n'
                                             'VERSION_ID="12"\n')
    for rel, text in (files or {}).items():
        path = tmp_path / rel.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Host(root=tmp_path, proc=proc, sys=tmp_path / "sys", env={}, euid=0)


def only(host: Host):
    [finding] = platform.probe(host)
    assert finding.probe == "platform" and "\n" not in finding.reason
    return finding


CONTAINER_NS = {**INIT, "pid": 4026532301, "uts": 4026532299, "ipc": 4026532300}


def test_a_stray_dockerenv_alone_is_a_conflict_not_a_container(tmp_path: Path) -> None:
    f = only(fake_host(tmp_path, files={"/.dockerenv": ""}))
    assert f.verdict is Verdict.not_detected
    assert f.facts["container"] is None
    assert f.facts["conflict"] is True
    assert "marker:/.dockerenv (weak)" in f.facts["signals"]
    assert "stray" in f.reason


def test_dockerenv_backed_by_a_container_pid_namespace_is_docker(tmp_path: Path) -> None:
    f = only(fake_host(tmp_path, files={"/.dockerenv": ""}, ns=CONTAINER_NS))
    assert (f.verdict, f.facts["container"], f.facts["conflict"]) == (Verdict.detected, "docker", False)


def test_marker_with_unreadable_namespaces_is_unknown_not_a_container(tmp_path: Path) -> None:
    f = only(fake_host(tmp_path, files={"/.dockerenv": ""}, ns={}))
    assert (f.verdict, f.facts["container"]) == (Verdict.unknown, None)


def test_pid1_container_env_is_an_explicit_declaration(tmp_path: Path) -> None:
    f = only(fake_host(tmp_path, pid1_env="PATH=/bin container=podman HOME=/",
                       files={"/run/.containerenv": ""}, ns=CONTAINER_NS))
    assert (f.verdict, f.facts["container"], f.facts["conflict"]) == (Verdict.detected, "podman", False)
    assert "declared:pid1:container=podman" in f.facts["signals"]


@pytest.mark.parametrize("path", ["/run/host/container-manager", "/run/systemd/container"])
def test_declaration_files_name_the_manager(tmp_path: Path, path: str) -> None:
    f = only(fake_host(tmp_path, files={path: "systemd-nspawn\n"}, ns=CONTAINER_NS))
    assert (f.verdict, f.facts["container"]) == (Verdict.detected, "systemd-nspawn")
    assert f.facts["conflict"] is False


def test_declaration_beats_a_disagreeing_marker_and_says_so(tmp_path: Path) -> None:
    files = {"/run/systemd/container": "lxc\n", "/.dockerenv": ""}
    f = only(fake_host(tmp_path, files=files, ns=CONTAINER_NS))
    assert (f.verdict, f.facts["container"], f.facts["conflict"]) == (Verdict.detected, "lxc", True)
    assert "disagree" in f.reason


def test_declaration_in_the_initial_pid_namespace_is_a_conflict(tmp_path: Path) -> None:
    f = only(fake_host(tmp_path, files={"/run/systemd/container": "docker\n"}))
    assert (f.verdict, f.facts["container"], f.facts["conflict"]) == (Verdict.detected, "docker", True)


@pytest.mark.parametrize(("line", "name"), [
    ("12:pids:/docker/3f1a9c0e2b7d4c5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e\n", "docker"),
    ("0::/system.slice/docker-3f1a9c0e2b7d4c5e6f7a.scope\n", "docker"),
    ("0::/machine.slice/libpod-9e8d7c6b5a4f.scope/container\n", "podman"),
    ("0::/lxc.payload.web01/\n", "lxc"),
    ("0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-abc.scope\n", "kubernetes"),
])
def test_cgroup_paths_that_name_a_manager(tmp_path: Path, line: str, name: str) -> None:
    f = only(fake_host(tmp_path, cgroup=line))
    assert (f.verdict, f.facts["container"]) == (Verdict.detected, name)


def test_cgroup_and_marker_naming_different_managers_conflict(tmp_path: Path) -> None:
    f = only(fake_host(tmp_path, files={"/.dockerenv": ""}, cgroup="0::/machine.slice/libpod-9e8d.scope\n"))
    assert (f.verdict, f.facts["container"], f.facts["conflict"]) == (Verdict.detected, "podman", True)


def test_a_private_pid_namespace_alone_is_container_other(tmp_path: Path) -> None:
    f = only(fake_host(tmp_path, ns=CONTAINER_NS, files={"/proc/1/comm": "tini\n"}))
    assert (f.verdict, f.facts["container"]) == (Verdict.detected, "container-other")


def test_a_stray_marker_inside_a_bwrap_sandbox_is_still_stray(tmp_path: Path) -> None:
    """This machine, inside `bwrap --unshare-pid`: a private pid namespace, but PID 1 is bwrap."""
    host = fake_host(tmp_path, files={"/.dockerenv": "", "/proc/1/comm": "bwrap\n"}, ns=CONTAINER_NS)
    f = only(host)
    assert (f.verdict, f.facts["container"], f.facts["conflict"]) == (Verdict.not_detected, None, True)
    assert "pid1:bwrap" in f.facts["signals"]


def test_a_bwrap_pid_namespace_alone_is_not_a_container(tmp_path: Path) -> None:
    f = only(fake_host(tmp_path, files={"/proc/1/comm": "bwrap\n"}, ns=CONTAINER_NS))
    assert (f.verdict, f.facts["container"], f.facts["conflict"]) == (Verdict.not_detected, None, False)


def test_a_plain_host(tmp_path: Path) -> None:
    f = only(fake_host(tmp_path))
    assert (f.verdict, f.facts["container"], f.facts["conflict"]) == (Verdict.not_detected, None, False)
    assert f.facts["os"] == "Debian GNU/Linux 12 (bookworm)"
    assert (f.facts["os_id"], f.facts["os_version_id"]) == ("debian", "12")
    assert f.facts["kernel"] == "6.1.0-18-amd64"


@pytest.mark.parametrize(("osrelease", "wsl"), [
    ("4.4.0-19041-Microsoft", "1"),
    ("5.15.133.1-microsoft-standard-WSL2", "2"),
    ("6.1.0-18-amd64", None),
])
def test_wsl_generation_from_osrelease(tmp_path: Path, osrelease: str, wsl: str | None) -> None:
    f = only(fake_host(tmp_path, osrelease=osrelease))
    assert f.facts["wsl"] == wsl
    assert f.facts["container"] is None, "WSL is reported as wsl, not as a container"


@pytest.mark.integration
def test_inside_a_bwrap_pid_namespace_on_this_host(root_only: None, bwrap_path: str) -> None:
    """The real sandbox shape: our code under `bwrap --unshare-pid --proc /proc`; the stray marker (if
    this machine has one) must not turn a sandbox into a docker container."""
    repo = Path(__file__).resolve().parent.parent
    code = ("import json\nfrom sandbox_conformance.probes import platform\n"
            "from sandbox_conformance.probes.host import Host\n"
            "print(json.dumps(platform.probe(Host())[0].to_json()))\n")
    done = run([bwrap_path, "--unshare-pid", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc",
                "--dev", "/dev", "--chdir", str(repo), "--", sys.executable, "-c", code],
               timeout=60, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(repo)})
    assert done.ok, done.stderr
    f = json.loads(done.stdout)
    assert (f["verdict"], f["facts"]["container"]) == ("not_detected", None)
    assert "pid1:bwrap" in f["facts"]["signals"]
    assert f["facts"]["conflict"] is Path("/.dockerenv").exists()


@pytest.mark.integration
def test_this_real_host() -> None:
    """Oracles: the namespace inode the kernel shows, and whether the stray marker exists."""
    f = only(Host())
    in_init_pidns = os.readlink("/proc/self/ns/pid") == f"pid:[{INIT['pid']}]"
    assert f.facts["kernel"] == stdlib_platform.release()
    assert f.facts["arch"] == stdlib_platform.machine()
    if in_init_pidns and not Path("/run/systemd/container").exists() \
            and not Path("/run/host/container-manager").exists():
        assert f.verdict is Verdict.not_detected
        assert f.facts["conflict"] is Path("/.dockerenv").exists()
    else:
        assert f.verdict is Verdict.detected
