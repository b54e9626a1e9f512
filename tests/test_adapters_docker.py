"""The docker adapter end to end: `docker run` with the adapter's flags against the Docker tier's
private engine (tests/docker_tier.py: no second daemon is started here), its image built from the
repository's Dockerfile (it has python3). Every promise of conformance/adapters/docker.toml is
witnessed from inside the live container, and the run leaves no container behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox_conformance.conformance import adapters
from sandbox_conformance.conformance.adapters import docker

if TYPE_CHECKING:
    from docker_tier import DockerTier

# The Docker tier's session fixture; imported as a plugin only (as tests/test_probe_in_containers.py
# does: an import here would stop pytest rewriting its asserts).
pytest_plugins = ["docker_tier"]
SETUP_TIMEOUT = 1500
pytestmark = [pytest.mark.integration, pytest.mark.timeout(SETUP_TIMEOUT)]
REPO = Path(__file__).resolve().parent.parent


def test_docker_run_keeps_every_promise_of_its_flags(docker_tier: DockerTier, tmp_path: Path) -> None:
    env = {**docker_tier.env, docker.IMAGE_ENV: docker_tier.image}
    r = adapters.resolve("docker", env=env)
    assert f"--host {docker_tier.host}" in r.launcher
    report = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_conformance", "witness", *r.witness_args(), "--json", str(report)],
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=180,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    assert report.exists(), done.stderr[-2000:]
    doc = json.loads(report.read_text())
    not_kept = {p["promise"]: p["detail"] for p in doc["promises"] if p["verdict"] != "kept"}
    # The engine's maskedPaths bind /dev/null over /proc/keys and /proc/timer_list: still the null device
    # (1:3), allowed by its number wherever it is. Nothing may be red.
    assert not not_kept, "\n".join(f"{k}: {v[:300]}" for k, v in not_kept.items())
    assert done.returncode == 0, done.stdout
    assert {p["promise"] for p in doc["promises"]} >= {
        "masked {state}/db",
        "control",
        "absent {other_user}",
        "nested_userns",
        "network",
        "capabilities",
        "descriptors",
        "secrets",
        "kernel_interfaces",
        "devices",
        "host_sockets",
        "unchanged",
    }
    [task] = doc["tasks"]
    assert task["observations"]["hostname"] == docker.HOSTNAME
    # --rm: the engine removed the container; nothing of ours is left on it.
    left = docker_tier.docker_cmd("ps", "--all", "--quiet", "--filter", f"ancestor={docker_tier.image}")
    assert left.ok and not left.stdout.strip(), left.stdout


def test_the_docker_adapter_says_why_it_cannot_run_without_an_image() -> None:
    with pytest.raises(adapters.Unavailable, match=docker.IMAGE_ENV):
        adapters.resolve("docker", env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
