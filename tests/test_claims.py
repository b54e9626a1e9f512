"""conformance/claims.py and kernel/procfs.py against real processes: two launches side by side each
judge only their own leftovers, and the /proc scans read what os.* reads."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sandbox_conformance.conformance import claims, observer
from sandbox_conformance.kernel import procfs

NO_TASK = observer.Seen(0, {}, "error", "error", "error", "", "error")


def _orphan() -> int:
    """A sleep whose parent exited: reparented to us (the subreaper), as a launcher's daemon is."""
    out = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True,
                         text=True, timeout=10, start_new_session=True, check=True)
    return int(out.stdout)


def _reap(*pids: int) -> None:
    for pid in pids:
        os.kill(pid, 9)
        os.waitpid(pid, 0)  # ours since it was reparented


def _survivors(others: claims.Claimed, since: int) -> list[int]:
    found = observer.survivors(NO_TASK, -1, host_namespaces={}, harness_sid=os.getsid(0), since=since,
                               others=others)
    return [p["pid"] for p in found]


def test_what_another_launch_claimed_is_not_this_ones_leftover() -> None:
    observer.become_subreaper()
    since = observer.boot_ticks() - 1
    mine, theirs = _orphan(), _orphan()
    try:
        book = claims.Claims(("main", "end"))
        started = observer.host_task(theirs)
        assert started is not None
        book.add("end", pids=[(theirs, started)])
        seen_by_main = _survivors(book.others("main"), since)
        seen_by_end = _survivors(book.others("end"), since)
        # Unclaimed, an orphan is both launches'; claimed, it is only its claimer's.
        assert mine in seen_by_main and theirs not in seen_by_main
        assert mine in seen_by_end and theirs in seen_by_end
    finally:
        _reap(mine, theirs)


def test_a_claim_is_of_that_process_not_of_its_pid_reused() -> None:
    observer.become_subreaper()
    since = observer.boot_ticks() - 1
    pid = _orphan()
    try:
        book = claims.Claims(("main", "end"))
        book.add("end", pids=[(pid, 1)])  # the same number, another start: another process
        assert pid in _survivors(book.others("main"), since)
    finally:
        _reap(pid)


def test_a_launchs_pid_namespace_and_session_are_its_own() -> None:
    own = claims.Claimed(pidns=frozenset({"pid:[1]"}), sids=frozenset({7}))
    assert own.holds(99, 5, "pid:[1]", 3) and own.holds(99, 5, "pid:[2]", 7)
    assert not own.holds(99, 5, "pid:[2]", 3)


def test_descendants_are_the_whole_tree_below_a_process() -> None:
    tree = subprocess.Popen(["sh", "-c", "sh -c 'sleep 60' & sleep 60"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        below: list[tuple[int, str]] = []
        while len(below) < 3 and time.monotonic() < deadline:  # sh, its sh and the two sleeps
            time.sleep(0.02)
            below = observer.descendants(tree.pid)
        comms = sorted(Path(f"/proc/{p}/comm").read_text().strip() for p, _ in below)
        assert comms.count("sleep") == 2, comms
        assert all(observer.host_task(p) == s for p, s in below)
    finally:
        os.killpg(tree.pid, 9)
        tree.wait(timeout=10)


def test_no_launch_kills_before_every_launch_has_judged() -> None:
    book = claims.Claims(("main", "end"))
    book.started("main")
    book.started("end")
    book.judged("end")
    assert not book.wait_judged(0.05)
    later = threading.Timer(0.05, book.judged, ("main",))
    later.start()
    assert book.wait_judged(10)
    later.join()
    assert claims.Claims(()).wait_judged(0)


def test_a_launch_not_started_yet_holds_no_one_up() -> None:
    # The lifecycle and terminal launches run one after the other in one thread: the lifecycle launch,
    # finding leftovers, waited its whole kill_wait for the terminal launch's judgement, which could
    # only come after it returned (a witness stopped by SIGINT took 33 s, issue 28).
    book = claims.Claims(("main", "lifecycle", "terminal"))
    book.started("main")
    book.started("lifecycle")
    book.judged("lifecycle")
    assert not book.wait_judged(0.05)  # main is under way
    book.judged("main")
    assert book.wait_judged(0)  # terminal has not started: nothing of it to wait for
    book.started("terminal")
    assert not book.wait_judged(0.05)  # under way now
    book.judged("terminal")
    assert book.wait_judged(0)


def test_procfs_reads_what_os_reads() -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        for _ in range(20):  # processes come and go between the two listings: until a quiet moment
            if set(procfs.pids()) == {n for n in os.listdir("/proc") if n.isdigit()}:
                break
        else:
            pytest.fail("procfs.pids() never matched os.listdir('/proc')")
        assert str(child.pid) in procfs.pids()
        assert procfs.read_small(f"/proc/{child.pid}/comm") == Path(f"/proc/{child.pid}/comm").read_text()
        # The fields that do not move while it sleeps (its fault counts and sizes may, just after exec).
        ours = procfs.read_small(f"/proc/{child.pid}/stat")
        theirs = Path(f"/proc/{child.pid}/stat").read_text()
        assert ours.split()[:5] == theirs.split()[:5] and ours.split()[21] == theirs.split()[21]
        for link in ("ns/pid", "ns/net", "fd/0", "cwd"):
            assert procfs.readlink(f"/proc/{child.pid}/{link}") == os.readlink(f"/proc/{child.pid}/{link}")
    finally:
        child.kill()
        child.wait(timeout=10)
    with pytest.raises(FileNotFoundError):
        procfs.read_small(f"/proc/{child.pid}/stat")
    with pytest.raises(FileNotFoundError):
        procfs.readlink(f"/proc/{child.pid}/ns/pid")
    with pytest.raises(NotADirectoryError):
        procfs.pids("/proc/self/stat")
