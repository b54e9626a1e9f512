"""Progress on long work: `PROG: STAGE: started` and `PROG: STAGE: done in 12.3s (RESULT)` lines on
stderr, and only when stderr is a terminal. A pipe, a CI log or mr-check's capture gets none of them:
what a script reads stays what it was.

    progress = Progress("sandbox-conformance run")
    with progress.stage("container image build", heartbeat=30) as st:
        image = build(...)
        st.result = image
    # or, where one call cannot be wrapped (a boot that ends inside another function):
    boot = progress.begin("vm boot", heartbeat=15)
    ...
    boot.end("kvm")

A heartbeat (`PROG: STAGE: 30s so far`) says a long, silent stage is still alive. Lines are written
with one write() each, so stages in parallel threads never interleave inside a line."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Stage:
    """One stage under way; `end()` once (a second call does nothing). `result` set before the end
    is shown in the end line."""

    def __init__(self, progress: Progress, name: str, heartbeat: float) -> None:
        self.progress, self.name, self.result = progress, name, ""
        self.started = progress.clock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        if heartbeat > 0 and progress.enabled:
            self._beat = threading.Thread(target=self._heartbeat, args=(heartbeat,), daemon=True,
                                          name=f"progress-{name}")
            self._beat.start()

    @property
    def elapsed(self) -> float:
        return self.progress.clock() - self.started

    def _heartbeat(self, every: float) -> None:
        while not self._stop.wait(every):
            self.progress.line(f"{self.name}: {self.elapsed:.0f}s so far")

    def end(self, result: str | None = None, *, word: str = "done in") -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=1)
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

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.stream.write(f"{self.prog}: {text}\n")
            self.stream.flush()

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
