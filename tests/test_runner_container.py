"""Container mode against a real Docker engine (the Docker tier's private dockerd): the runner builds the
Dockerfile from the tier's debootstrap base, and the suite passes as root and as the image's user."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from test_runner_cli import VERDICT, needs_witness

from probes.run import run

if TYPE_CHECKING:
    from docker_tier import DockerTier

# The Docker tier's session fixture; imported as a plugin only (an import here would stop pytest
# rewriting its asserts). Any test using it may be the one that pays for the tier's set-up.
pytest_plugins = ["docker_tier"]
SETUP_TIMEOUT = 1500
pytestmark = [pytest.mark.integration, pytest.mark.timeout(SETUP_TIMEOUT)]

REPO = Path(__file__).resolve().parent.parent


def test_container_mode_passes_as_root_and_as_the_unprivileged_user(docker_tier: DockerTier,
                                                                     tmp_path: Path) -> None:
    needs_witness()
    env = {**docker_tier.env, "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "LANG": "C.UTF-8"}
    junit = tmp_path / "junit.xml"
    c = run([sys.executable, "-m", "runners.cli", "run", "--mode", "container",
             "--base-image", docker_tier.base, "--junitxml", str(junit)],
            timeout=SETUP_TIMEOUT - 60, env=env, cwd=str(REPO))
    out = c.stdout[-4000:] + c.stderr[-4000:]
    assert c.returncode == 0, out
    last = c.stderr.strip().splitlines()[-1]
    m = VERDICT.match(last)
    assert m and m.groups() == ("PASS", "container", "0"), last
    assert "container: as root: PASS" in c.stderr, out
    assert "container: as sbxc: PASS" in c.stderr, out
    # Both legs really ran the suite: each left its own JUnit report with test cases in it.
    for label in ("root", "sbxc"):
        report = tmp_path / f"junit-{label}.xml"
        assert report.exists(), f"no report from the {label} leg: {out}"
        cases = ET.parse(report).getroot().iter("testcase")
        assert any(True for _ in cases), f"the {label} leg ran no tests"


def test_the_container_is_gone_after_the_run(docker_tier: DockerTier) -> None:
    """Whatever the run did, it left no container behind on the engine."""
    env = {**docker_tier.env, "LANG": "C.UTF-8"}
    c = run([sys.executable, "-m", "runners.cli", "run", "--mode", "container", "--image", "no-such-image:x"],
            timeout=300, env=env, cwd=str(REPO))
    assert c.returncode == 75, c.stderr
    assert "starting a container from no-such-image:x failed" in c.stderr
    assert "Traceback" not in c.stderr
    left = docker_tier.docker_cmd("ps", "--all", "--quiet", "--filter", "name=sandbox-conformance-")
    assert left.ok and left.stdout.strip() == "", left.stdout
