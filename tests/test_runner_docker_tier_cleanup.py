"""The Docker tier's teardown leaves nothing behind: processes that name its temp dir, mounts under it,
the dir itself (checked on a planted mess, without a daemon)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox_conformance.processes.children import run

if TYPE_CHECKING:
    from docker_tier import DockerTier

pytest_plugins = ["docker_tier"]


def test_teardown_kills_our_processes_unmounts_and_removes_the_dir(root_only: None) -> None:
    # Imported here, not at module level: the tier is loaded as a pytest plugin elsewhere, and an
    # earlier plain import would stop pytest from rewriting its asserts.
    from docker_tier import _mounts_under, _our_processes, teardown

    tmp = Path(tempfile.mkdtemp(prefix="sbxc-docker-test."))
    straggler = None
    try:
        # A containerd-shim stand-in: a process whose command line names the exec root.
        straggler = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", f"{tmp}/exec/x"],
                                     start_new_session=True)
        # An overlay the daemon "forgot": a tmpfs mounted under the data root.
        point = tmp / "data" / "overlay2" / "merged"
        point.mkdir(parents=True)
        assert run(["mount", "-t", "tmpfs", "tmpfs", str(point)], timeout=30).ok
        assert _mounts_under(tmp) == [str(point)]
        assert straggler.pid in _our_processes(tmp)

        forced = teardown(tmp, None, "docker", {})

        assert any("killed" in f for f in forced) and any("unmounted" in f for f in forced)
        deadline = time.monotonic() + 5
        while straggler.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert straggler.poll() is not None, "the straggler survived the teardown"
        assert _mounts_under(tmp) == []
        assert not tmp.exists()
    finally:
        if straggler is not None and straggler.poll() is None:
            straggler.kill()
            straggler.wait()
        for point in _mounts_under(tmp):
            run(["umount", "--lazy", point], timeout=30)
        subprocess.run(["rm", "-rf", str(tmp)], check=False, timeout=60)


def test_removing_a_cgroup_tree_takes_children_first_and_touches_nothing_else(tmp_path: Path) -> None:
    from docker_tier import cgroup_dirs, remove_cgroup_tree

    fs = tmp_path / "cgroup"
    for hierarchy in ("memory", "pids", "unified"):
        (fs / hierarchy / "sbxc-docker-abcd" / "c0ffee" / "inner").mkdir(parents=True)
        (fs / hierarchy / "docker").mkdir()  # somebody else's: must survive
    (fs / "unified" / "sbxc-docker-abcd" / "cgroup.procs").touch()  # would make rmdir fail if left
    (fs / "unified" / "sbxc-docker-abcd" / "cgroup.procs").unlink()
    tops = cgroup_dirs("sbxc-docker-abcd", fs)
    assert sorted(t.parent.name for t in tops) == ["memory", "pids", "unified"]
    for top in tops:
        remove_cgroup_tree(top)
    assert cgroup_dirs("sbxc-docker-abcd", fs) == []
    assert sorted(p.name for p in fs.glob("*/docker")) == ["docker", "docker", "docker"]


def test_the_tiers_containers_live_under_its_own_cgroup_parent(docker_tier: DockerTier) -> None:
    """dockerd's default `docker` parent in every hierarchy would outlive the tier; ours is removed."""
    started = docker_tier.docker_cmd("run", "--detach", "--rm", docker_tier.image, "sleep", "60", timeout=60)
    assert started.ok, started.stderr
    cid = started.stdout.strip()
    try:
        pid = docker_tier.docker_cmd("inspect", "--format", "{{.State.Pid}}", cid, timeout=30).stdout.strip()
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        paths = [line.split(":", 2)[2] for line in lines]
        assert paths and all(p.startswith(f"/{docker_tier.cgroup_parent}/") for p in paths if p != "/"), lines
    finally:
        docker_tier.docker_cmd("rm", "--force", cid, timeout=60)
