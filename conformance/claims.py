"""Launches side by side, each judging only what it started.

Through the reference sandbox, a witness session makes the main launch while the lifecycle and
terminal launches run beside it (harness.WitnessSession._attempt_and_more): one after the other,
they were two thirds of a native run's wall time (bench/run_bench.py). The leftover judgement is
what makes that delicate. It finds, among other things, orphans reparented to the harness
(observer.become_subreaper) that started during the launch, and an orphan carries no mark of the
launch it came from: the lifecycle launch's sandbox init, reparented to us once its launcher is
SIGKILLed, would be a leftover of the main launch, and the main launch's clean-up would kill the very
task the lifecycle promise is waiting to see go.

So each launch claims what is its own, as it learns it (Claims.add):
- its launcher, when started (a child of ours, started during the other launch's window);
- its task's pid namespace and session, when the handshake reads them;
- before the lifecycle kill orphans them, every descendant of its launcher (the sandbox's init and
  the task), read from the host's /proc (observer.descendants).
A survivor another launch claimed is not this one's (observer.survivors, `others`), nor is it reaped
here: reaping another launch's launcher would take its exit status from the thread that waits for it.

What no claim covers is an orphan neither launch can place: a daemon a launcher double-forked out of
its session before anything could see it. Both launches then report it, which is true of each (a
sandbox that leaves daemons leaves them from every launch), and no launch kills what it found until
every launch under way has judged (Claims.started, judged, wait_judged): the first to look cannot
remove what the other has yet to see. A launch not started yet is not waited for: it has nothing to
see yet, and the lifecycle and terminal launches run one after the other in one thread, so the
lifecycle launch waiting for the terminal one's judgement waited its whole kill_wait (30 s) for a
launch that could only start once it returned (issue 28: a witness stopped by SIGINT took 33 s)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import NamedTuple


class Claimed(NamedTuple):
    """What the other launches claimed: (pid, starttime) pairs (observer.host_task's start time: a
    reused pid is another process), task pid namespaces, task sessions."""

    pids: frozenset[tuple[int, int]] = frozenset()
    pidns: frozenset[str] = frozenset()
    sids: frozenset[int] = frozenset()

    def holds(self, pid: int, starttime: int, pidns: str, sid: int) -> bool:
        return (pid, starttime) in self.pids or pidns in self.pidns or sid in self.sids


NONE = Claimed()


class Claims:
    """The claims of a fixed set of launches (their keys, known before any starts), which of them are
    under way (`started`, before the launch starts anything), and which of those have judged their
    leftovers (or ended without judging: `judged` from a `finally`)."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._lock = threading.Lock()
        self._pids: dict[str, set[tuple[int, int]]] = {k: set() for k in keys}
        self._pidns: dict[str, set[str]] = {k: set() for k in self._pids}
        self._sids: dict[str, set[int]] = {k: set() for k in self._pids}
        self._pending: set[str] = set()
        self._all_judged = threading.Event()
        self._all_judged.set()

    def started(self, key: str) -> None:
        """`key`'s launch is about to start: from now on, every other launch's kill waits for its
        judgement."""
        with self._lock:
            self._pending.add(key)
            self._all_judged.clear()

    def add(self, key: str, *, pids: Iterable[tuple[int, int]] = (), pidns: str | None = None,
            sid: int | None = None) -> None:
        with self._lock:
            self._pids[key].update(pids)
            if pidns:
                self._pidns[key].add(pidns)
            if sid is not None:
                self._sids[key].add(sid)

    def others(self, key: str) -> Claimed:
        with self._lock:
            return Claimed(
                frozenset(p for k, v in self._pids.items() if k != key for p in v),
                frozenset(n for k, v in self._pidns.items() if k != key for n in v),
                frozenset(s for k, v in self._sids.items() if k != key for s in v),
            )

    def judged(self, key: str) -> None:
        with self._lock:
            self._pending.discard(key)
            if not self._pending:
                self._all_judged.set()

    def wait_judged(self, timeout: float) -> bool:
        """Every launch under way has judged (True), or `timeout` passed."""
        return self._all_judged.wait(timeout)
