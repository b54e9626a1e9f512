"""The pid witness recognises a host process the task lists by its pid AND command line, and the task
reads 512 bytes of /proc/PID/cmdline (conformance/inside.py processes): a longer host command line (the
harness with a long --host-cannot-observe reason) must be compared as the task reads it, or a harness
in plain sight passes for another process."""

from __future__ import annotations

import subprocess
import time

import pytest

from sandbox_conformance.conformance import harness, inside
from sandbox_conformance.conformance.witnesses import isolation


@pytest.mark.parametrize("extra", [0, 100, 600, 5000])
def test_a_command_line_compares_as_the_task_reads_it(extra: int) -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 30; :", "é" * extra, "tail"], stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while (on_host := harness._cmdline(proc.pid))[-1:] != ("tail",) and time.monotonic() < deadline:
            time.sleep(0.01)  # until sh has been exec'd (it stays: "; :" keeps it from exec-ing sleep)
        assert on_host[-1] == "tail"
        # What processes() records for it, read the same way it reads every process.
        seen = inside.read_text(f"/proc/{proc.pid}/cmdline", 512).split("\0")
        while seen and seen[-1] == "":
            seen.pop()
        assert isolation._as_read_inside(on_host) == tuple(seen)
        assert (tuple(seen) == on_host) is (extra < 200)
    finally:
        proc.kill()
        proc.wait()
