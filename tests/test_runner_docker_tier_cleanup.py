"""The Docker tier's teardown leaves nothing behind: processes that name its temp dir, mounts under it,
the dir itself (checked on a planted mess, without a daemon)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from probes.run import run


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
