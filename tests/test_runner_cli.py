"""`sandbox-conformance run` end to end, in subprocesses, on the real host shapes this machine gives."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import stat
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from sandbox_conformance.processes.children import Completed, run

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable  # the venv's interpreter: world-executable, so the test user can run it too
VERDICT = re.compile(r"^sandbox-conformance: (PASS|FAIL|REFUSED|ERROR) mode=(\w+) exit=(\d+) time=\d+\.\d+s$")
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
WITNESS_TIMEOUT = 600

pytestmark = pytest.mark.integration


def base_env(**extra: str) -> dict[str, str]:
    """What the CLI child sees: no inherited promises (CI's SANDBOX_CONFORMANCE_REQUIRE, a cgroup
    root, a signature path, DOCKER_HOST) unless a test sets them."""
    env = {"PATH": BASE_PATH, "LANG": "C.UTF-8", "HOME": os.environ.get("HOME", "/root")}
    env.update(extra)
    return env


@pytest.fixture
def no_podman(tmp_path: Path) -> str:
    """A PATH with every command of BASE_PATH but podman (installed for its adapter, scripts/test-tier-deps):
    podman needs no daemon, so an unreachable DOCKER_HOST alone leaves a container engine that answers."""
    shadow = tmp_path / "bin"
    shadow.mkdir()
    for d in BASE_PATH.split(":"):
        with contextlib.suppress(OSError):
            for name in os.listdir(d):
                if name != "podman" and not (shadow / name).exists():
                    (shadow / name).symlink_to(os.path.join(d, name))
    return str(shadow)


def sbxc(*args: str, env: Mapping[str, str] | None = None, timeout: float = 120,
         prefix: tuple[str, ...] = (), cwd: str | None = None) -> Completed:
    return run([*prefix, PYTHON, "-m", "sandbox_conformance", *args], timeout=timeout,
               env=dict(env) if env is not None else base_env(), cwd=cwd or str(REPO))


def verdict(c: Completed) -> tuple[str, str, int]:
    last = c.stderr.strip().splitlines()[-1] if c.stderr.strip() else ""
    m = VERDICT.match(last)
    assert m, f"no verdict line at the end of stderr: {c.stderr[-2000:]}"
    assert int(m.group(3)) == c.returncode
    return m.group(1), m.group(2), int(m.group(3))


def needs_witness() -> None:
    if not (REPO / "commands" / "witness.py").exists():
        pytest.skip("the witness command (commands/witness.py) is not in this checkout yet")


@pytest.fixture
def marker_launcher(tmp_path: Path) -> tuple[str, Path]:
    """An external launcher that records it was called and runs the task with no sandbox at all:
    proof that a run happened (and a suite that must go red)."""
    marker = tmp_path / "launched"
    script = tmp_path / "no-sandbox"
    script.write_text(f"#!/bin/sh\ntouch {marker}\nexec \"$@\"\n")
    script.chmod(0o755)
    return str(script), marker


# --- what runs, and the verdict line ---------------------------------------------------------------


def test_native_as_root_passes(root_only: None, bwrap_path: str) -> None:
    needs_witness()
    c = sbxc("run", timeout=WITNESS_TIMEOUT)
    assert c.returncode == 0, c.stdout[-3000:] + c.stderr[-3000:]
    assert verdict(c) == ("PASS", "native", 0)
    assert "mode native: auto:" in c.stderr


def test_native_as_an_unprivileged_user_passes(test_user: str, bwrap_path: str) -> None:
    needs_witness()
    setpriv = ("setpriv", f"--reuid={test_user}", f"--regid={test_user}", "--init-groups", "--inh-caps=-all")
    check = f"import sandbox_conformance.commands.cli; open({str(REPO / 'pyproject.toml')!r}).read()"
    reach = run([*setpriv, PYTHON, "-c", check], timeout=30, env=base_env(HOME="/tmp"), cwd=str(REPO))
    if not reach.ok:
        pytest.skip(f"the checkout or venv is not readable by {test_user}: {reach.stderr_tail(1)}")
    c = sbxc("run", prefix=setpriv, env=base_env(HOME=f"/home/{test_user}"), timeout=WITNESS_TIMEOUT,
             cwd="/tmp")
    assert c.returncode == 0, c.stdout[-3000:] + c.stderr[-3000:]
    assert verdict(c) == ("PASS", "native", 0)


@pytest.mark.parametrize("mode", ["auto", "native", "container"])
def test_inside_a_bwrap_sandbox_every_mode_refuses_naming_nesting(mode: str, bwrap_path: str) -> None:
    outer = (bwrap_path, "--unshare-user", "--disable-userns", "--ro-bind", "/", "/",
             "--dev", "/dev", "--proc", "/proc", "--")
    c = sbxc("run", "--mode", mode, prefix=outer)
    assert c.returncode == 75, c.stderr
    assert verdict(c) == ("REFUSED", mode, 75)
    assert "inside a sandbox" in c.stderr
    assert "nested user namespaces are refused" in c.stderr


def test_print_mode_prints_the_mode_with_its_reasons_and_runs_nothing(
        marker_launcher: tuple[str, Path]) -> None:
    launcher, marker = marker_launcher
    for args, env in ((("run", "--print-mode"), base_env()),
                      (("run",), base_env(SANDBOX_CONFORMANCE_PRINT_MODE="1"))):
        c = sbxc(*args, "--launcher", launcher, env=env)
        assert c.returncode == 0, c.stderr
        assert c.stdout.startswith("mode: native\n"), c.stdout
        assert "  why: auto:" in c.stdout
        assert not marker.exists(), "--print-mode ran the suite"


def test_the_mode_environment_variable_is_the_mode_option(no_podman: str) -> None:
    c = sbxc("run", "--print-mode", env=base_env(SANDBOX_CONFORMANCE_MODE="container", PATH=no_podman,
                                                  DOCKER_HOST="unix:///nonexistent/docker.sock"))
    assert c.returncode == 75
    assert c.stdout.startswith("mode: refused (requested container)")


def test_with_no_signature_the_run_says_the_guard_had_nothing_to_check(tmp_path: Path) -> None:
    c = sbxc("run", "--print-mode", env=base_env(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "cfg")))
    if Path("/etc/sandbox-conformance/deployment.toml").exists():
        pytest.skip("this host declares a system-wide deployment signature")
    assert c.returncode == 0, c.stderr
    assert "note: no deployment signature configured: the guard had nothing to check" in c.stdout
    assert "deployment.toml" in c.stdout


def test_the_stray_dockerenv_alone_causes_no_refusal() -> None:
    if not Path("/.dockerenv").exists():
        pytest.skip("no /.dockerenv on this machine: nothing to show")
    probe = sbxc("probe", "--json", "--only", "platform")
    platform = json.loads(probe.stdout)["findings"][0]
    assert "/.dockerenv" in json.dumps(platform), "the platform probe did not even see the marker"
    c = sbxc("run", "--print-mode")
    assert c.returncode == 0, c.stdout + c.stderr
    assert c.stdout.startswith("mode: native\n")


def test_a_usage_error_exits_2_with_an_error_verdict() -> None:
    c = sbxc("run", env=base_env(SANDBOX_CONFORMANCE_MODE="sideways"))
    assert c.returncode == 2
    assert verdict(c)[0] == "ERROR"
    assert "SANDBOX_CONFORMANCE_MODE='sideways'" in c.stderr
    assert "Traceback" not in c.stderr
    c = sbxc("run", "--profile", "/nonexistent/profile.toml")
    assert c.returncode == 2 and "no such file" in c.stderr and verdict(c)[0] == "ERROR"


def test_delegate_without_a_user_manager_refuses_with_the_reason() -> None:
    if Path("/run/systemd/system").is_dir():
        pytest.skip("systemd is PID 1 here: the refusal shape needs a host without a user manager")
    c = sbxc("run", "--delegate")
    assert c.returncode == 75
    assert "--delegate needs a reachable systemd user manager" in c.stderr
    assert verdict(c)[0] == "REFUSED"


def test_container_mode_with_an_unreachable_engine_refuses_with_a_sentence_about_it(
    tmp_path: Path, no_podman: str
) -> None:
    env = base_env(DOCKER_HOST=f"unix://{tmp_path}/docker.sock", PATH=no_podman)
    c = sbxc("run", "--mode", "container", env=env)
    assert c.returncode == 75, c.stderr
    assert "container mode cannot run" in c.stderr and "engine" in c.stderr
    assert "Traceback" not in c.stderr
    assert verdict(c) == ("REFUSED", "container", 75)


# --- a deployment signature matched through each arm ----------------------------------------------


@pytest.fixture
def listening_socket(tmp_path: Path) -> Iterator[Path]:
    """Something listening where DOCKER_HOST points, so the containers arm asks the `docker` shim."""
    path = tmp_path / "engine.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(str(path))
        s.listen(8)
        yield path
    finally:
        s.close()


def _shim(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(exist_ok=True)
    p = bindir / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _arm_env(arm: str, tmp_path: Path, listening: Path) -> tuple[dict[str, str], str]:
    """(environment, the match text the refusal must show) for a signature matched by one arm only."""
    bindir = tmp_path / "bin"
    sig = tmp_path / "deployment.toml"
    env = base_env(HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "cfg"),
                   SANDBOX_CONFORMANCE_DEPLOYMENT_CONFIG=str(sig))
    if arm == "units":
        # A user manager for us (its private socket exists), listing the unit only under --user.
        runtime = tmp_path / "runtime"
        (runtime / "systemd").mkdir(parents=True)
        (runtime / "systemd" / "private").touch()
        _shim(bindir, "systemctl", 'for a in "$@"; do [ "$a" = --user ] && '
              'echo "agentd-agent.service loaded active running Agent"; done\nexit 0\n')
        sig.write_text('[deployment]\nunit_suffixes = ["-agent.service"]\n')
        env.update(PATH=f"{bindir}:{BASE_PATH}", XDG_RUNTIME_DIR=str(runtime))
        return env, "agentd-agent.service"
    if arm == "config_paths":
        present = tmp_path / "agentd" / "config.toml"
        present.parent.mkdir()
        present.write_text("")
        sig.write_text(f'[deployment]\nconfig_paths = ["{present}", "/nonexistent/agentd"]\n')
        return env, str(present)
    # containers: the engine lists one whose name matches
    _shim(bindir, "docker", '[ "$1" = ps ] && { echo other; echo agentd-main; exit 0; }\nexit 1\n')
    sig.write_text('[deployment]\ncontainer_names = ["agentd-*"]\n')
    env.update(PATH=f"{bindir}:{BASE_PATH}", DOCKER_HOST=f"unix://{listening}")
    return env, "agentd-main"


ARMS = ["units", "config_paths", "containers"]


@pytest.mark.parametrize("arm", ARMS)
def test_a_deployment_signature_matched_by_one_arm_refuses_auto_naming_both_ways_on(
        arm: str, tmp_path: Path, listening_socket: Path, marker_launcher: tuple[str, Path]) -> None:
    env, match = _arm_env(arm, tmp_path, listening_socket)
    launcher, marker = marker_launcher
    c = sbxc("run", "--launcher", launcher, env=env)
    assert c.returncode == 75, c.stderr
    assert "deployment host" in c.stderr and match in c.stderr
    assert "way on: --mode container" in c.stderr and "way on: --mode native" in c.stderr
    assert verdict(c) == ("REFUSED", "auto", 75)
    assert not marker.exists()


@pytest.mark.parametrize("arm", ARMS)
def test_a_deployment_host_runs_under_an_explicit_native_mode(
        arm: str, tmp_path: Path, listening_socket: Path, marker_launcher: tuple[str, Path]) -> None:
    needs_witness()
    env, match = _arm_env(arm, tmp_path, listening_socket)
    launcher, marker = marker_launcher
    c = sbxc("run", "--mode", "native", "--launcher", launcher, env=env, timeout=WITNESS_TIMEOUT)
    assert "--mode native was given" in c.stderr and match in c.stderr
    assert marker.exists(), f"the suite did not run: {c.stderr[-2000:]}"
    # The launcher is no sandbox at all: the suite must go red, and say so in the verdict line.
    assert c.returncode == 1, c.stdout[-2000:] + c.stderr[-2000:]
    assert verdict(c) == ("FAIL", "native", 1)


def test_a_signature_whose_check_could_not_run_refuses_auto(tmp_path: Path,
                                                            marker_launcher: tuple[str, Path]) -> None:
    """A user manager that exists but whose unit listing fails: unknown, and unknown is refused."""
    runtime = tmp_path / "runtime"
    (runtime / "systemd").mkdir(parents=True)
    (runtime / "systemd" / "private").touch()
    _shim(tmp_path / "bin", "systemctl", 'echo "Failed to connect to bus" >&2\nexit 1\n')
    sig = tmp_path / "deployment.toml"
    sig.write_text('[deployment]\nunit_suffixes = ["-agent.service"]\n')
    env = base_env(HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "cfg"),
                   SANDBOX_CONFORMANCE_DEPLOYMENT_CONFIG=str(sig), XDG_RUNTIME_DIR=str(runtime),
                   PATH=f"{tmp_path / 'bin'}:{BASE_PATH}")
    launcher, marker = marker_launcher
    c = sbxc("run", "--launcher", launcher, env=env)
    assert c.returncode == 75, c.stderr
    assert "deployment signature could not be checked" in c.stderr
    assert verdict(c) == ("REFUSED", "auto", 75)
    assert not marker.exists()


@pytest.mark.parametrize("shape", ["relative", "missing", "fifo", "loop", "zero", "malformed"])
def test_an_unusable_deployment_config_is_a_usage_error_before_any_probe(tmp_path: Path, shape: str) -> None:
    # The variable is a promise of a signature: one that cannot be read is the user's mistake, said in one
    # line before anything runs (it was a refusal after the probes, and a FIFO held the run 300 s).
    path = tmp_path / "deployment.toml"
    if shape == "fifo":
        os.mkfifo(path)
    elif shape == "loop":
        path.symlink_to(path)
    elif shape == "malformed":
        path.write_text("[deployment\n")
    value = {"relative": "deployment.toml", "zero": "/dev/zero"}.get(shape, str(path))
    started = time.monotonic()
    c = sbxc("run", "--print-mode", env=base_env(SANDBOX_CONFORMANCE_DEPLOYMENT_CONFIG=value))
    assert c.returncode == 2, c.stdout + c.stderr
    assert verdict(c)[0] == "ERROR" and "Traceback" not in c.stderr
    assert "SANDBOX_CONFORMANCE_DEPLOYMENT_CONFIG=" in c.stderr
    assert time.monotonic() - started < 60


def test_a_misspelt_vm_accel_is_a_usage_error_before_any_work() -> None:
    # It was read only once the VM mode had probed and built its image: a refusal (75) a minute later.
    c = sbxc("run", "--mode", "vm", "--print-mode", env=base_env(SANDBOX_CONFORMANCE_VM_ACCEL="kmv"))
    assert c.returncode == 2, c.stdout + c.stderr
    assert "SANDBOX_CONFORMANCE_VM_ACCEL='kmv'" in c.stderr and verdict(c)[0] == "ERROR"
