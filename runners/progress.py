"""Progress on long work: `PROG: STAGE: started` and `PROG: STAGE: done in 12.3s (RESULT)` lines on
stderr, and only when stderr is a terminal. A pipe, a CI log or mr-check's capture gets none of them:
what a script reads stays what it was.

    progress = Progress("sandbox-conformance run")
    with progress.stage("container image build", heartbeat=HEARTBEAT) as st:
        image = build(...)
        st.result = image
    # or, where one call cannot be wrapped (a boot that ends inside another function):
    boot = progress.begin("vm boot", heartbeat=HEARTBEAT)
    ...
    boot.end("kvm")

runners/orchestrate.py makes the one Progress of a run and hands it down; a runner that was given none uses
`Progress.off()`, so its stages cost nothing and print nothing.

A heartbeat (`PROG: STAGE: 30s so far`) says a long, silent stage is still alive. Only the innermost
open stage with a heartbeat beats: inside a `container run` stage, an image build's `container image
build: 30s so far` says more than the run's own line would, and two lines every 30 s would say it
twice. Lines are written with one write() each, so stages in parallel threads never interleave
inside a line."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from sandbox_conformance.processes.exits import VERDICT_WORDS

# Seconds between "still running" lines of a long stage (a VM run or an image build is silent for
# minutes).
HEARTBEAT = 30.0


def result_word(code: int | None) -> str:
    """A witness run's exit code as the word the verdict line uses (runners/run_verdict.py), for a stage's
    end: None is a run that was stopped at its timeout."""
    if code is None:
        return "timed out"
    return VERDICT_WORDS.get(code, f"exit {code}")


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Stage:
    """One stage under way; `end()` once, from any thread (a second call does nothing). `result` set
    before the end is shown in the end line."""

    def __init__(self, progress: Progress, name: str, heartbeat: float) -> None:
        self.progress, self.name, self.result = progress, name, ""
        self.started = progress.clock()
        self.heartbeat = heartbeat
        self._stop = threading.Event()
        self._ending = threading.Lock()
        self._beat: threading.Thread | None = None
        progress._opened(self)
        if heartbeat > 0 and progress.enabled:
            self._beat = threading.Thread(target=self._heartbeat, args=(heartbeat,), daemon=True,
                                          name=f"progress-{name}")
            self._beat.start()

    @property
    def elapsed(self) -> float:
        return self.progress.clock() - self.started

    @property
    def ended(self) -> bool:
        return self._stop.is_set()

    def _heartbeat(self, every: float) -> None:
        while not self._stop.wait(every):
            if self.progress._innermost_beating() is self:
                self.progress.line(f"{self.name}: {self.elapsed:.0f}s so far")

    def end(self, result: str | None = None, *, word: str = "done in") -> None:
        # The lock: a VM boot is ended by whichever of two threads sees the guest's stage 2 first
        # (runners/vm/qemu.py), and only one end line may be written.
        with self._ending:
            if self._stop.is_set():
                return
            self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join(timeout=1)
        self.progress._closed(self)
        result = self.result if result is None else result
        self.progress.line(f"{self.name}: {word} {self.elapsed:.1f}s" + (f" ({result})" if result else ""))


class Progress:
    """Enabled when the stream (stderr by default) is a terminal, unless told otherwise."""

    def __init__(self, prog: str, *, stream: TextIO | None = None, enabled: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.prog = prog
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _isatty(self.stream) if enabled is None else enabled
        self.clock = clock
        self._lock = threading.Lock()
        self._open: list[Stage] = []  # in the order they began

    @classmethod
    def off(cls) -> Progress:
        """Stages that print nothing: what a runner uses when its caller gave it no Progress."""
        return cls("", enabled=False)

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.stream.write(f"{self.prog}: {text}\n")
            self.stream.flush()

    def _opened(self, stage: Stage) -> None:
        with self._lock:
            self._open.append(stage)

    def _closed(self, stage: Stage) -> None:
        with self._lock:
            if stage in self._open:
                self._open.remove(stage)

    def _innermost_beating(self) -> Stage | None:
        with self._lock:
            beating = [s for s in self._open if s.heartbeat > 0]
        return beating[-1] if beating else None

    def begin(self, name: str, *, heartbeat: float = 0) -> Stage:
        self.line(f"{name}: started")
        return Stage(self, name, heartbeat)

    @contextlib.contextmanager
    def stage(self, name: str, *, heartbeat: float = 0) -> Iterator[Stage]:
        st = self.begin(name, heartbeat=heartbeat)
        try:
            yield st
        except BaseException as e:
            # A cancelled run (probes/cancel.Cancelled is a KeyboardInterrupt) or an error: say the
            # stage stopped, then let it go on up.
            st.end(type(e).__name__, word="stopped after")
            raise
        st.end()
