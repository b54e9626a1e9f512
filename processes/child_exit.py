"""Waiting for a child of ours to exit, woken the moment it does.

Popen.wait(timeout=...) polls, sleeping 0.5, 1, 2, 4 ... up to 50 ms between looks
(subprocess.Popen._wait), so a child that exits is noticed up to 50 ms late: a witness launch paid
that on every task, and every command paid ~7 ms waiting for its guardian to go (processes/cancel.py
close). A pidfd (pidfd_open(2), Linux 5.3) becomes readable the moment the child exits. Imported by
processes/children.py and processes/cancel.py, so it imports neither."""

from __future__ import annotations

import os
import select
import subprocess
import time


def exited(pid: int, timeout: float) -> bool | None:
    """Wait up to `timeout` for our child `pid` to exit, without reaping it: True once it has, False
    while it still runs, None where there is no pidfd and the caller must wait its own way. The child
    is ours and not yet reaped, so its pid cannot have been reused."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        deadline = time.monotonic() + max(0.0, timeout)
        while not poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
            if time.monotonic() >= deadline:
                return False
        return True
    finally:
        os.close(pidfd)


def wait_exit(proc: subprocess.Popen[str] | subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait up to `timeout` for the child to exit and reap it: True, or False when it is still running.
    Where there is no pidfd, Popen.wait as before."""
    done = exited(proc.pid, timeout)
    if done is None:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    if done:
        proc.wait()  # exited: this reaps it at once
        return True
    return proc.poll() is not None
