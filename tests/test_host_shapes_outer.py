"""Issue 12 on the real CLI, for shapes that need no mount: a stub `systemctl` next to a user
manager's socket path, and a run started inside a bwrap sandbox. The probe's verdict and the runner's
decision and exit code are asserted from `sandbox-conformance` itself."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sandbox_conformance.processes.children import Completed, run

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parent.parent
CLI = REPO / ".venv/bin/sandbox-conformance"


@pytest.fixture
def cli() -> Path:
    if not CLI.exists():
        pytest.skip(f"{CLI} not installed: run `make test` (pip install -e .)")
    return CLI


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    # No engine, whatever the docker tier is doing meanwhile, and no user config of ours.
    (tmp_path / "xdg").mkdir(exist_ok=True)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C", "HOME": str(tmp_path),
            "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock",
            "CONTAINER_HOST": f"unix://{tmp_path}/no-podman.sock", **extra}


def _stub_user_manager(tmp_path: Path) -> dict[str, str]:
    """A socket path where a user manager's would be, and a `systemctl` that exits 0 printing
    nothing (as container images ship it): no manager answered anything."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name in ("systemctl", "systemd-run"):
        (bin_ / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_ / name).chmod(0o755)
    runtime = tmp_path / "run"
    (runtime / "systemd").mkdir(parents=True)
    (runtime / "systemd/private").write_text("")
    env = _env(tmp_path, XDG_RUNTIME_DIR=str(runtime))
    env["PATH"] = f"{bin_}:{env['PATH']}"
    return env


def test_a_systemctl_that_exits_0_silently_is_no_reachable_user_manager(cli: Path, tmp_path: Path) -> None:
    env = _stub_user_manager(tmp_path)
    done = run([str(cli), "probe", "--json", "--only", "systemd_user"], timeout=60, env=env, cwd=str(REPO))
    assert done.returncode == 0, done.stderr
    [f] = json.loads(done.stdout)["findings"]
    assert f["verdict"] == "unknown", f
    assert "exit 0 with no output" in f["reason"]
    assert f["facts"]["reachable"] is False


def test_delegate_is_refused_when_systemctl_only_exits_0(cli: Path, tmp_path: Path) -> None:
    """Was: read as a reachable manager, so `--delegate` resolved to a delegated native run."""
    env = _stub_user_manager(tmp_path)
    done = run([str(cli), "run", "--delegate", "--print-mode"], timeout=120, env=env, cwd=str(REPO))
    assert done.returncode == 75, done.stdout + done.stderr
    assert "--delegate needs a reachable systemd user manager: unknown" in done.stdout


def _inside_bwrap(bwrap: str, cli: Path, tmp_path: Path, *args: str) -> Completed:
    # The checkout and the test's temp dir are bound back over the fresh /tmp: a clone may live there
    # (CI's does), and the CLI runs from its venv.
    return run([bwrap, "--unshare-user", "--disable-userns", "--die-with-parent",
                "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
                "--ro-bind", str(REPO), str(REPO), "--bind", str(tmp_path), str(tmp_path),
                "--chdir", str(REPO), "--", str(cli), *args], timeout=120, env=_env(tmp_path), cwd=str(REPO))


def test_inside_a_sandbox_the_refusal_names_what_decided_it(
        cli: Path, bwrap_path: str, tmp_path: Path) -> None:
    """Our own CLI one level down in `bwrap --disable-userns`: every mode refuses (75), naming the
    sandboxed probe's signals as what decided it, and the engine as unreachable FROM HERE."""
    done = _inside_bwrap(bwrap_path, cli, tmp_path, "run", "--print-mode")
    if "No permissions to create" in done.stderr or "setting up uid map" in done.stderr:
        pytest.skip(f"bwrap cannot create a user namespace here: {done.stderr_tail()}")
    assert done.returncode == 75, done.stdout + done.stderr
    reason = next(line for line in done.stdout.splitlines() if line.startswith("  reason: "))
    assert "running inside a sandbox (decided by the sandboxed probe: " in reason
    assert "nested_userns_refused" in reason
    assert "nested user namespaces are refused" in reason
    assert "the container engine is unreachable from here" in reason
