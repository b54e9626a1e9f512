"""Container mode against a real Docker engine (the Docker tier's private dockerd): the runner builds the
Dockerfile from the tier's debootstrap base, runs the cgroup set-up step inside, and the suite passes as
root and with every task launched as the image's user, under the require switch.

On this machine (hybrid: memory bound to cgroup v1) the container gets no cgroup2 memory controller:
the set-up says so, the cgroup witnesses skip, and exactly they are listed as expected skips, chosen by
what the host's own cgroup probe reports, not by a constant. On a unified host the same tests expect
the set-up to export a root and every cgroup witness to run."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from test_runner_cli import VERDICT, needs_witness

from sandbox_conformance.probes.collect import collect
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes.children import Completed, run

if TYPE_CHECKING:
    from collections.abc import Iterator

    from docker_tier import DockerTier

# The Docker tier's session fixture; imported as a plugin only (an import here would stop pytest
# rewriting its asserts). Any test using it may be the one that pays for the tier's set-up.
pytest_plugins = ["docker_tier"]
SETUP_TIMEOUT = 1500
pytestmark = [pytest.mark.integration, pytest.mark.timeout(SETUP_TIMEOUT)]

REPO = Path(__file__).resolve().parent.parent
CGROUP_FS = Path("/sys/fs/cgroup")
ENV_ROOT = "SANDBOX_CONFORMANCE_CGROUP_ROOT"
# The witness families a profile's [limits] section makes (conformance.profile.Profile.promises).
CGROUP_FAMILIES = frozenset({"cgroup", "memory_max", "pids_max"})
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Collects the witness modules the way `sandbox-conformance witness` does (reference profile: families it
# does not promise are deselected) and prints each witness's node id and family; runs nothing.
COLLECT = """\
import json, os, sys
import pytest
from sandbox_conformance.conformance import witnesses

class Families:
    def __init__(self): self.found = []
    def pytest_collection_finish(self, session):
        for item in session.items:
            m = item.get_closest_marker("witness")
            if m is not None:
                self.found.append([item.nodeid, str(m.args[0])])

f = Families()
argv = [*map(str, witnesses.PATHS), "-p", "no:randomly", "-p", "no:cacheprovider", "-c", os.devnull,
        "--rootdir", str(witnesses.DIR.parent), "-o", "python_files=" + " ".join(witnesses.MODULES),
        "--collect-only", "-q"]
if not any(ep.value == "sandbox_conformance.conformance.plugin"
           for ep in __import__("importlib.metadata").metadata.entry_points(
        group="pytest11")):
    argv += ["-p", "sandbox_conformance.conformance.plugin"]
with __import__("contextlib").redirect_stdout(sys.stderr):
    rc = pytest.main(argv, plugins=[f])
print(json.dumps({"rc": int(rc), "found": f.found}))
"""


def cgroup_witness_ids() -> list[str]:
    """The cgroup witnesses' ids (the part after '::', as the expected-skips file keys them)."""
    c = run([sys.executable, "-c", COLLECT], timeout=120, cwd=str(REPO),
            env={"PATH": BASE_PATH, "LANG": "C.UTF-8"})
    assert c.ok, c.stderr_tail(10)
    doc = json.loads(c.stdout.strip().splitlines()[-1])
    return [nodeid.rsplit("::", 1)[-1] for nodeid, family in doc["found"] if family in CGROUP_FAMILIES]


def memory_bound_to_v1() -> tuple[bool, str]:
    """(True, why) when this host's memory controller is bound to a v1 hierarchy: then no container
    here can get a cgroup2 memory controller (a controller lives in one hierarchy at a time,
    cgroup-v2.rst "Mounting")."""
    found = {f.probe: f for f in collect(Host(), only=["cgroup"])}
    f = found["cgroup"]
    v1 = list(f.facts.get("v1_controllers") or [])
    return "memory" in v1, f"{f.verdict}: {f.reason}"


@dataclasses.dataclass(frozen=True)
class Snapshot:
    dirs: frozenset[str]
    pid1: str  # /proc/1/cgroup: where init lives in every hierarchy
    unified_subtree: tuple[tuple[str, str], ...]  # each cgroup2 mount's root subtree_control


def host_cgroup_snapshot() -> Snapshot:
    """Every cgroup directory of the host's tree, and what the set-up would change first if it ever
    ran on it (init's cgroups, the controllers enabled at a v2 root). Subtrees named sbxc-docker-* are
    left out: they are Docker tiers' own cgroup parents (this run's and any concurrent one's), where
    dockerd makes and removes each container's cgroup, which is not the host's tree."""
    dirs = set()
    for top, subdirs, _ in os.walk(CGROUP_FS):
        subdirs[:] = [d for d in subdirs if not d.startswith("sbxc-docker-")]
        dirs.add(top)
    subtree = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            point = left.split()[4]
            control = Path(point, "cgroup.subtree_control")
            subtree.append((point, control.read_text().strip() if control.exists() else "?"))
    return Snapshot(frozenset(dirs), Path("/proc/1/cgroup").read_text(), tuple(sorted(subtree)))


@dataclasses.dataclass(frozen=True)
class ContainerRun:
    completed: Completed
    reports: Path
    cgroup_ids: tuple[str, ...]
    hybrid: bool
    why_hybrid: str
    before: Snapshot
    after: Snapshot

    @property
    def out(self) -> str:
        return self.completed.stdout[-4000:] + self.completed.stderr[-6000:]

    def report(self, label: str) -> dict:
        return json.loads((self.reports / f"report-{label}.json").read_text())


@pytest.fixture(scope="module")
def container_run(docker_tier: DockerTier,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerRun]:
    """One `run --mode container --require` for the tests below: it costs a build check, a container and
    two suite runs."""
    needs_witness()
    tmp = tmp_path_factory.mktemp("container-run")
    hybrid, why = memory_bound_to_v1()
    ids = tuple(cgroup_witness_ids())
    skips = tmp / "expected-skips.txt"
    # On a host whose memory controller is bound to v1 these, and only these, cannot run in a
    # container; on any other host nothing may skip.
    # The listed reason is matched inside the actual one: the probe in the container says it has no
    # delegated root (this host binds memory to cgroup v1, so no container gets a cgroup2 memory one).
    skips.write_text("".join(f"{i} | cgroup.delegation: unsupported: no delegated cgroup root\n"
                             for i in (ids if hybrid else ())))
    env = {**docker_tier.env, "PATH": BASE_PATH, "LANG": "C.UTF-8"}
    before = host_cgroup_snapshot()
    c = run([sys.executable, "-m", "sandbox_conformance", "run", "--mode", "container",
             "--base-image", docker_tier.base, "--require", "--expected-skips", str(skips),
             "--junitxml", str(tmp / "junit.xml"), "--json", str(tmp / "report.json")],
            timeout=SETUP_TIMEOUT - 60, env=env, cwd=str(REPO))
    after = host_cgroup_snapshot()
    yield ContainerRun(c, tmp, ids, hybrid, why, before, after)


def test_container_mode_passes_as_root_and_as_the_unprivileged_user(container_run: ContainerRun) -> None:
    c, out = container_run.completed, container_run.out
    assert c.returncode == 0, out
    last = c.stderr.strip().splitlines()[-1]
    m = VERDICT.match(last)
    assert m and m.groups() == ("PASS", "container", "0"), last
    assert "container: as root: PASS" in c.stderr, out
    assert "container: as sbxc: PASS" in c.stderr, out
    # Both legs really ran the suite: each left its own JUnit report with test cases in it, and the
    # image user's leg launched its tasks as that user.
    for label in ("root", "sbxc"):
        report = container_run.reports / f"junit-{label}.xml"
        assert report.exists(), f"no report from the {label} leg: {out}"
        cases = ET.parse(report).getroot().iter("testcase")
        assert any(True for _ in cases), f"the {label} leg ran no tests"
    assert container_run.report("root")["as_user"] is None
    assert container_run.report("sbxc")["as_user"] == "sbxc"


def test_the_cgroup_witnesses_follow_what_the_setup_said(container_run: ContainerRun) -> None:
    """Hybrid host: the set-up names the missing cgroup2 memory controller, the runner shows it, and
    exactly the cgroup witnesses skip (expected, under --require) in both legs, with the probe's
    reason from inside. Unified host: the set-up exports a root and they all run."""
    run_, out = container_run, container_run.out
    assert run_.cgroup_ids, "the witness suite has no cgroup witnesses to check (reference profile [limits])"
    setup_lines = [ln for ln in run_.completed.stderr.splitlines() if "container: cgroup set-up:" in ln]
    assert len(setup_lines) == 1, out
    for label in ("root", "sbxc"):
        doc = run_.report(label)
        tests = [t for p in doc["promises"] for t in p["tests"]]
        skipped = {t["nodeid"].rsplit("::", 1)[-1]: t["detail"] for t in tests if t["outcome"] == "skipped"}
        cgroup_tests = {t["nodeid"].rsplit("::", 1)[-1]: t for t in tests if t["family"] in CGROUP_FAMILIES}
        assert set(cgroup_tests) == set(run_.cgroup_ids)
        if run_.hybrid:
            assert set(skipped) == set(run_.cgroup_ids), (label, skipped)
            for detail in skipped.values():
                # The probe's view from inside: no cgroup2 hierarchy at all in this container.
                assert "cgroup.delegation" in detail and "cgroup2" in detail, detail
            assert doc["cgroup_setup"]["root"] is None
            assert "hybrid" in doc["cgroup_setup"]["reason"] and "memory" in doc["cgroup_setup"]["reason"]
        else:
            assert skipped == {}, (label, skipped)
            assert all(t["outcome"] == "passed" for t in cgroup_tests.values()), cgroup_tests
            assert doc["cgroup_setup"]["root"]
    if run_.hybrid:
        line = setup_lines[0]
        assert "cgroup witnesses unavailable:" in line and "not cgroup2" in line, line
        assert "hybrid" in line and "memory" in line, line
        # Said again after the legs, next to the verdict.
        assert "container: note: cgroup witnesses unavailable:" in run_.completed.stderr, out
    else:
        assert f"exported {ENV_ROOT}=" in setup_lines[0], setup_lines[0]


def test_the_setup_leaves_the_hosts_cgroup_tree_as_it_was(container_run: ContainerRun) -> None:
    before, after = container_run.before, container_run.after
    assert container_run.completed.returncode == 0, container_run.out  # the set-up really ran
    assert after.pid1 == before.pid1
    assert after.unified_subtree == before.unified_subtree
    appeared, vanished = sorted(after.dirs - before.dirs), sorted(before.dirs - after.dirs)
    assert (appeared, vanished) == ([], []), f"host cgroup tree changed: +{appeared} -{vanished}"


def test_the_setup_in_the_hosts_cgroup_namespace_refuses_before_touching_it(docker_tier: DockerTier) -> None:
    """The dangerous shape container mode used to have (the host's namespace and tree bound read-write,
    with CAP_SYS_ADMIN): the set-up recognises the host's cgroup namespace from inside a real container
    and refuses, and the host's tree is as it was."""
    name = f"sbxc-setup-hostns-{secrets.token_hex(4)}"
    before = host_cgroup_snapshot()
    try:
        started = docker_tier.docker_cmd(
            "run", "--detach", "--rm", "--pull", "never", "--name", name, "--network", "none",
            "--cap-add", "SYS_ADMIN", "--security-opt", "seccomp=unconfined",
            "--cgroupns=host", "--volume", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
            "--volume", f"{REPO}:/src:ro", docker_tier.image, "sleep", "infinity")
        assert started.ok, started.stderr
        c = docker_tier.docker_cmd("exec", "--workdir", "/src", "--env", "PYTHONDONTWRITEBYTECODE=1", name,
                                   "python3", "-m", "sandbox_conformance.runners.cgroup_setup", "--in",
                                       "container", timeout=60)
    finally:
        docker_tier.docker_cmd("rm", "--force", name, timeout=60)
    assert c.returncode == 75, c.stdout + c.stderr
    assert "shares the host's cgroup namespace" in c.stderr, c.stderr
    assert ENV_ROOT not in c.stdout
    after = host_cgroup_snapshot()
    assert after.pid1 == before.pid1 and after.unified_subtree == before.unified_subtree
    assert sorted(after.dirs ^ before.dirs) == []


def test_the_setups_writes_land_in_the_containers_own_cgroup(docker_tier: DockerTier) -> None:
    """Give the set-up a real cgroup2 mount to work on, here where it can get one: the host's unified
    hierarchy (which on this hybrid host has no memory controller) mounted afresh inside a container
    with its own cgroup namespace. The set-up moves the container's processes into `supervisor/`, which
    appears under the container's own cgroup on the host; here it then stops, naming the missing memory
    controller (on a unified host it proves its root). Nothing else of the host's tree changes."""
    if not (CGROUP_FS / "cgroup.procs").exists() and not (CGROUP_FS / "unified" / "cgroup.procs").exists():
        pytest.skip("this host has no cgroup2 hierarchy to mount in a container")
    name = f"sbxc-setup-own-{secrets.token_hex(4)}"
    before = host_cgroup_snapshot()
    try:
        started = docker_tier.docker_cmd(
            "run", "--detach", "--rm", "--pull", "never", "--name", name, "--network", "none",
            "--cap-add", "SYS_ADMIN", "--security-opt", "seccomp=unconfined", "--cgroupns=private",
            "--volume", f"{REPO}:/src:ro", docker_tier.image, "sleep", "infinity")
        assert started.ok, started.stderr
        cid = started.stdout.strip()
        remount = docker_tier.docker_cmd(
            "exec", name, "sh", "-c", "umount -R /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup")
        assert remount.ok, remount.stderr
        c = docker_tier.docker_cmd("exec", "--workdir", "/src", "--env", "PYTHONDONTWRITEBYTECODE=1", name,
                                   "python3", "-m", "sandbox_conformance.runners.cgroup_setup", "--in",
                                       "container", timeout=60)
        init_cgroup = docker_tier.docker_cmd("exec", name, "cat", "/proc/1/cgroup").stdout
        # The container's cgroup on the host's v2 hierarchy (hybrid: under unified/), where dockerd put it.
        own = [d / docker_tier.cgroup_parent / cid for d in (CGROUP_FS / "unified", CGROUP_FS)]
        moved_on_host = any((d / "supervisor").is_dir() for d in own if (d / "cgroup.procs").exists())
    finally:
        docker_tier.docker_cmd("rm", "--force", name, timeout=60)
    if memory_bound_to_v1()[0]:
        assert c.returncode == 75, c.stdout + c.stderr
        assert ENV_ROOT not in c.stdout
        # The v2 side has no memory controller to give, and the set-up says why.
        assert "lacks memory" in c.stderr, c.stderr
        assert "memory pids bound to a cgroup v1 hierarchy" in c.stderr, c.stderr
    else:
        assert c.returncode == 0 and f"{ENV_ROOT}=/sys/fs/cgroup/tasks" in c.stdout, c.stdout + c.stderr
    assert "0::/supervisor" in init_cgroup, init_cgroup
    assert moved_on_host, f"no supervisor/ under the container's own cgroup {docker_tier.cgroup_parent}/{cid}"
    after = host_cgroup_snapshot()
    assert after.pid1 == before.pid1 and after.unified_subtree == before.unified_subtree
    assert sorted(after.dirs ^ before.dirs) == []


def test_the_container_is_gone_after_the_run(docker_tier: DockerTier) -> None:
    """Whatever the run did, it left no container behind on the engine."""
    env = {**docker_tier.env, "LANG": "C.UTF-8"}
    c = run([sys.executable, "-m", "sandbox_conformance", "run", "--mode", "container",
             "--image", "no-such-image:x"],
            timeout=300, env=env, cwd=str(REPO))
    assert c.returncode == 75, c.stderr
    assert "starting a container from no-such-image:x failed" in c.stderr
    assert "Traceback" not in c.stderr
    left = docker_tier.docker_cmd("ps", "--all", "--quiet", "--filter", "name=sandbox-conformance-")
    assert left.ok and left.stdout.strip() == "", left.stdout
