"""How a `sandbox-conformance run` ended, as one JSON document (`run --verdict-json FILE`, or
SANDBOX_CONFORMANCE_VERDICT_JSON=FILE).

The verdict line on stderr says the same for a person; this is for a program (mr-check reads it, so it
never parses the runner's prose). Written for every outcome once the options parse: PASS, FAIL,
REFUSED (with the reason and the ways on), ERROR (with the usage error), and KILLED-<SIGNAL> for a run
stopped by a signal. Its schema is conformance/schemas/run-verdict.schema.json; docs/json-documents.md
lists the keys.

The witness reports themselves stay where `--json` puts them: a refused run has none, and the
consumers of those files (fleet-report, the Ansible witness module) read them as witness reports."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from sandbox_conformance.processes import cancel
from sandbox_conformance.processes.exits import EXIT_UNAVAILABLE, VERDICT_WORDS, Refusal

VERSION = 1
FLAG = "--verdict-json"
ENV = "SANDBOX_CONFORMANCE_VERDICT_JSON"  # the environment form of FLAG
# The words of the verdict line (Verdict.done), then KILLED-<SIGNAL> (processes/cancel.py).
WORDS = ("PASS", "FAIL", "REFUSED", "ERROR")


class RunVerdict(NamedTuple):
    """How one `run` ended, as the verdict document holds it (`to_json`, `from_json`): the verdict and exit,
    the mode, and for a refusal its reason and the ways on."""

    verdict: str  # PASS, FAIL, REFUSED, ERROR, or KILLED-SIGTERM / -SIGINT / -SIGHUP
    mode: str  # the mode the run chose; the one requested when it chose none
    requested_mode: str  # auto, native, container, vm
    exit: int
    seconds: float
    line: str  # the verdict line as printed on stderr
    reason: str | None = None  # REFUSED: the refusal; ERROR with exit 2: the usage error
    because: tuple[str, ...] = ()  # a refused decision's further reasons
    ways_on: tuple[str, ...] = ()  # what would let it run
    notes: tuple[str, ...] = ()  # the decision's notes (what this host cannot test, and where it could)

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "verdict": self.verdict, "mode": self.mode,
                "requested_mode": self.requested_mode, "exit": self.exit, "seconds": round(self.seconds, 3),
                "line": self.line, "reason": self.reason, "because": list(self.because),
                "ways_on": list(self.ways_on), "notes": list(self.notes)}

    @classmethod
    def from_json(cls, doc: object) -> RunVerdict:
        """The document back; ValueError when it is not one this version wrote."""
        if not isinstance(doc, Mapping) or doc.get("version") != VERSION:
            raise ValueError(f"not a run verdict document of version {VERSION}")
        try:
            out = cls(str(doc["verdict"]), str(doc["mode"]), str(doc["requested_mode"]), int(doc["exit"]),
                      float(doc["seconds"]), str(doc["line"]),
                      None if doc["reason"] is None else str(doc["reason"]),
                      _strings(doc["because"]), _strings(doc["ways_on"]), _strings(doc["notes"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"a run verdict document without a valid {e}") from None
        return out


def _strings(value: object) -> tuple[str, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise TypeError("list of strings")
    return tuple(str(v) for v in value)


def write(path: str | Path, verdict: RunVerdict) -> None:
    """Atomically (a temp file in the same directory, then rename(2)): a reader never sees half a
    document, and a run killed mid-write leaves the previous file or none."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)  # Path("f").parent is Path(".")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(verdict.to_json(), f, indent=2)
            f.write("\n")
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read(path: str | Path) -> RunVerdict | None:
    """The document at `path`, or None when there is none or it is not one (the runner died before it
    wrote one, or something else wrote the file)."""
    try:
        return RunVerdict.from_json(json.loads(Path(path).read_text()))
    except (OSError, ValueError):
        return None


class Verdict:
    """How this run is ending, as it goes: prints the one verdict line, whatever path the run leaves by
    (a cancelled run's is printed by processes/cancel.py, with the mode known at that moment), and
    writes the same as a RunVerdict document for --verdict-json, with the refusal's reason and ways on.
    Not a record: the mode, the reason and the notes are set as the run learns them."""

    __slots__ = ("_mode", "because", "notes", "path", "reason", "requested", "say", "started", "ways_on")

    def __init__(self, requested: str, path: str | None, say: Callable[[str], None]) -> None:
        self.started = time.monotonic()
        self.requested = requested
        self.mode = requested
        self.path = path
        self.say = say  # one line of the command's, on stderr
        self.reason: str | None = None
        self.because: tuple[str, ...] = ()
        self.ways_on: tuple[str, ...] = ()
        self.notes: tuple[str, ...] = ()

    def refused(self, e: Refusal) -> None:
        """Say a Refusal (its reason, the further reasons, each way on); the first said is the run's."""
        self.say(f"refused: {e.reason}")
        for r in e.because:
            self.say(f"  because: {r}")
        for w in e.ways_on:
            self.say(f"  way on: {w}")
        if self.reason is None:
            self.reason, self.because = e.reason, e.because
        self.ways_on += e.ways_on

    def killed(self, exc: cancel.Cancelled) -> None:
        """A cancelled run's document; processes/cancel.py prints its line once the clean-up is done."""
        seconds = time.monotonic() - self.started
        word = f"KILLED-{exc.name}"
        self._write(word, exc.exit_code, seconds,
                    f"sandbox-conformance: {word} mode={self.mode} exit={exc.exit_code} time={seconds:.1f}s")

    def _write(self, word: str, code: int, seconds: float, line: str) -> None:
        if self.path is None:
            return
        doc = RunVerdict(word, self.mode, self.requested, code, seconds, line, self.reason,
                         self.because, self.ways_on, self.notes)
        try:
            write(self.path, doc)
        except OSError as e:
            self.say(f"{FLAG} {self.path}: not written: {e.strerror}")

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        self._mode = mode
        cancel.set_label(mode)

    def done(self, code: int, word: str | None = None) -> int:
        word = word or VERDICT_WORDS.get(code, "ERROR")
        if code == EXIT_UNAVAILABLE and self.reason is None:
            # The witness child refused on its own (its stderr is the user's, not ours to read).
            self.reason = "the witness command did not run: its own `refused:` line above says why"
        seconds = time.monotonic() - self.started
        line = f"sandbox-conformance: {word} mode={self.mode} exit={code} time={seconds:.1f}s"
        self._write(word, code, seconds, line)
        print(line, file=sys.stderr, flush=True)
        return code
