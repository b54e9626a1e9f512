"""How a `sandbox-conformance run` ended, as one JSON document (`run --verdict-json FILE`, or
SANDBOX_CONFORMANCE_VERDICT_JSON=FILE).

The verdict line on stderr says the same for a person; this is for a program (mr-check reads it, so it
never parses the runner's prose). Written for every outcome once the options parse: PASS, FAIL,
REFUSED (with the reason and the ways on), ERROR (with the usage error), and KILLED-<SIGNAL> for a run
stopped by a signal. Its schema is conformance/schemas/run-verdict.schema.json; docs/json-documents.md
lists the keys.

The witness reports themselves stay where `--json` puts them: a refused run has none, and the
consumers of those files (fleet-report, the Ansible witness module) read them as witness reports. What a
program needs of them to say why a run went red travels here too, one Leg per witness run (native's one,
container's and the VM's per user): its promise rows, the problems printed after its table and its
summary line, read from its report (`run` gives its witness a scratch `--json` when this document is
asked for and no `--json` was: runners/orchestrate.py)."""

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

from sandbox_conformance.conformance.render import VERDICTS, Row
from sandbox_conformance.processes import cancel
from sandbox_conformance.processes.exits import EXIT_UNAVAILABLE, VERDICT_WORDS, Refusal

VERSION = 1
FLAG = "--verdict-json"
ENV = "SANDBOX_CONFORMANCE_VERDICT_JSON"  # the environment form of FLAG
# The words of the verdict line (Verdict.done), then KILLED-<SIGNAL> (processes/cancel.py).
WORDS = ("PASS", "FAIL", "REFUSED", "ERROR")


class Leg(NamedTuple):
    """One witness run of `run` (a container's or a VM's leg, or native's one), as its witness report
    said it: what mr-check shows of a red run, read as data instead of from the witness's stdout."""

    label: str  # native; root or the unprivileged user in a container or a VM
    exit: int  # the witness command's, as its report says
    summary: str  # its summary line, as printed (witness report `summary.line`)
    problems: tuple[str, ...] = ()  # printed after its table: the first harness error, ...
    promises: tuple[Row, ...] = ()  # (promise, verdict, detail), in the report's order

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "exit": self.exit, "summary": self.summary,
                "problems": list(self.problems),
                "promises": [{"promise": p, "verdict": v, "detail": d} for p, v, d in self.promises]}

    @classmethod
    def from_json(cls, doc: object) -> Leg:
        """KeyError, TypeError or ValueError when it is not one."""
        if not isinstance(doc, Mapping):
            raise TypeError("object")
        rows = doc["promises"]
        if not isinstance(rows, Sequence) or isinstance(rows, str):
            raise TypeError("list of promises")
        promises = tuple(_row(r) for r in rows)
        return cls(str(doc["label"]), int(doc["exit"]), str(doc["summary"]), _strings(doc["problems"]),
                   promises)

    @classmethod
    def from_report(cls, label: str, report: object) -> Leg:
        """A leg from its witness report (commands/witness.py _document); ValueError when the report
        has no summary line (one this version did not write) or is not a report at all."""
        try:
            if not isinstance(report, Mapping) or not isinstance(report["summary"], Mapping):
                raise TypeError("witness report")
            return cls.from_json({"label": label, "exit": report["exit"],
                                  "summary": report["summary"]["line"], "problems": report["problems"],
                                  "promises": report["promises"]})
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"a witness report without a valid {e}") from None


def _row(value: object) -> Row:
    if not isinstance(value, Mapping) or value["verdict"] not in VERDICTS:
        raise ValueError("promise row")
    return str(value["promise"]), str(value["verdict"]), str(value["detail"])


def read_leg(label: str, path: str | Path) -> Leg | None:
    """The leg whose witness report is at `path`, or None when there is none or it is not one (the
    witness died before writing it, or a report of another version is there)."""
    try:
        return Leg.from_report(label, json.loads(Path(path).read_text()))
    except (OSError, ValueError):
        return None


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
    legs: tuple[Leg, ...] = ()  # each witness run's rows and summary; none when no report was read

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "verdict": self.verdict, "mode": self.mode,
                "requested_mode": self.requested_mode, "exit": self.exit, "seconds": round(self.seconds, 3),
                "line": self.line, "reason": self.reason, "because": list(self.because),
                "ways_on": list(self.ways_on), "notes": list(self.notes),
                "legs": [leg.to_json() for leg in self.legs]}

    @classmethod
    def from_json(cls, doc: object) -> RunVerdict:
        """The document back; ValueError when it is not one this version wrote."""
        if not isinstance(doc, Mapping) or doc.get("version") != VERSION:
            raise ValueError(f"not a run verdict document of version {VERSION}")
        try:
            out = cls(str(doc["verdict"]), str(doc["mode"]), str(doc["requested_mode"]), int(doc["exit"]),
                      float(doc["seconds"]), str(doc["line"]),
                      None if doc["reason"] is None else str(doc["reason"]),
                      _strings(doc["because"]), _strings(doc["ways_on"]), _strings(doc["notes"]),
                      # Added within version 1 (docs/json-documents.md): an older writer's has none.
                      tuple(Leg.from_json(leg) for leg in _list(doc.get("legs", []))))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"a run verdict document without a valid {e}") from None
        return out


def _strings(value: object) -> tuple[str, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise TypeError("list of strings")
    return tuple(str(v) for v in value)


def _list(value: object) -> Sequence[object]:
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise TypeError("list")
    return value


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

    __slots__ = ("_mode", "because", "legs", "notes", "path", "reason", "requested", "say", "started",
                 "ways_on")

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
        self.legs: tuple[Leg, ...] = ()

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
                         self.because, self.ways_on, self.notes, self.legs)
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
