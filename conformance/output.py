"""What `witness` (and `run`, which forwards these options) prints, and where pytest's report goes.

stdout is the promise table (conformance/render.py: `table` on a terminal, `lines` otherwise, or
`markdown`), what else went wrong, and the summary line last. pytest's own report (session header,
warnings, tracebacks) goes to stderr with `-v`, to FILE with `--log FILE` (kept, not named: you
chose it), and otherwise to a log of ours:

    ${XDG_STATE_HOME:-~/.local/state}/sandbox-conformance/logs/KIND-YYYYmmdd-HHMMSS-PID.log

removed when the run passed, kept and named on stderr at the end when it did not (a red run, a
usage error, a crash; a cancelled run's is removed). The XDG Base Directory specification puts logs
in the state directory: they outlive a reboot and are not cache. The newest KEEP logs are kept,
older ones pruned, so a machine that runs red suites all day does not fill up. Where that directory
cannot be made (no home, a read-only one) no log is kept and the end line says to re-run with -v."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from sandbox_conformance.conformance import render
from sandbox_conformance.conformance.render import Format, Row, Style
from sandbox_conformance.processes.exits import EXIT_OK, EXIT_USAGE, UsageError

KEEP = 20
PROG = "sandbox-conformance witness"

FORMAT_HELP = (
    "the promise table as `table` (aligned, for a person), `lines` (`promise: verdict: detail`, what "
    "scripts parse) or `markdown` (to paste into a merge request); default `auto`: table on a "
    "terminal, lines otherwise"
)
VERBOSE_HELP = "show pytest's own report (session header, warnings, tracebacks) on stderr"
LOG_HELP = (
    "write pytest's own report to FILE; default: a log under ~/.local/state/sandbox-conformance/logs, "
    "named at the end and kept only when the run did not pass"
)


def check_arguments(args: Any) -> None:
    """Usage errors of the three options, said before any work starts. Whether --log names a file we
    can replace, and no input or other report, is each command's one check of all its reports
    (processes/outputs.py check_reports)."""
    if args.verbose and args.log:
        raise UsageError("-v shows pytest's report on stderr, --log FILE writes it to FILE: give one")
    if getattr(args, "json", None) == "-" and args.format not in (None, Format.auto, Format.lines):
        raise UsageError(f"--json - prints the JSON report on stdout: no --format {args.format} beside it")


# ---- the log directory ------------------------------------------------------------------------------


def _home(environ: Mapping[str, str]) -> Path | None:
    """HOME as `environ` has it, else the passwd entry's (os.path.expanduser's order)."""
    if environ.get("HOME"):
        return Path(environ["HOME"])
    import pwd

    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:  # no passwd entry
        return None


def log_dir(environ: Mapping[str, str] = os.environ) -> Path | None:
    state = environ.get("XDG_STATE_HOME", "")
    # The spec: a relative path in an XDG_* variable is invalid and is to be ignored.
    if os.path.isabs(state):
        return Path(state) / "sandbox-conformance" / "logs"
    home = _home(environ)
    return home / ".local" / "state" / "sandbox-conformance" / "logs" if home is not None else None


def _anchor(environ: Mapping[str, str]) -> Path | None:
    """What must already exist for the logs directory to be made below it: HOME itself for the default
    (issue 28: `HOME=/nowhere/x`, and root made /nowhere/x/.local/state/... for a log), or the
    directory that holds an XDG_STATE_HOME named explicitly (the base-directory spec says to make
    that one if missing; not its parents)."""
    state = environ.get("XDG_STATE_HOME", "")
    return Path(state).parent if os.path.isabs(state) else _home(environ)


def new_log(kind: str, environ: Mapping[str, str] = os.environ) -> Path | None:
    """A fresh, empty `KIND-YYYYmmdd-HHMMSS-PID.log` in the logs directory, or None where none can be
    made (the run then says where its report went: nowhere; re-run with -v or --log)."""
    d = log_dir(environ)
    anchor = _anchor(environ)
    if d is None or anchor is None or not anchor.is_dir():
        return None
    path = d / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    try:
        d.mkdir(parents=True, exist_ok=True)
        # O_EXCL: never append to, nor follow a link planted at, a name we did not make.
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except OSError:
        return None
    return path


def prune(directory: Path, keep: int = KEEP) -> None:
    """Keep the newest `keep` logs; one that another run removes meanwhile is no error."""
    dated = []
    for p in directory.glob("*.log"):
        with contextlib.suppress(FileNotFoundError):
            dated.append((p.stat().st_mtime, p))
    dated.sort()
    for _, old in dated[:-keep] if keep else dated:
        old.unlink(missing_ok=True)


# ---- the witness command's output -------------------------------------------------------------------


class WitnessOutput:
    """What `witness` prints and where (the module doc says what goes where), settled from its options
    by `from_args`. Not a record but a plain class (docs/architecture.md, "Records"): the default log
    (no --log) is made, and these fields change, as pytest's report starts."""

    __slots__ = ("chosen", "fmt", "json_stdout", "kept_nowhere", "log", "stderr", "stdout", "style",
                 "verbose", "width")

    def __init__(self, fmt: Format, style: Style, verbose: bool, log: Path | None, chosen: bool,
                 json_stdout: bool, stdout: TextIO, stderr: TextIO, width: int = 0,
                 kept_nowhere: bool = False) -> None:
        self.fmt = fmt  # resolved: never auto
        self.style = style
        self.verbose = verbose
        self.log = log  # --log FILE, or the default log once opened
        self.chosen = chosen  # the default log (ours to remove or name), not the user's --log
        self.json_stdout = json_stdout
        self.stdout = stdout
        self.stderr = stderr
        self.width = width
        self.kept_nowhere = kept_nowhere  # the default log could not be made: pytest's report was dropped

    @classmethod
    def from_args(cls, args: Any, *, environ: Mapping[str, str] = os.environ,
                  stdout: TextIO | None = None, stderr: TextIO | None = None) -> WitnessOutput:
        check_arguments(args)
        stdout = sys.stdout if stdout is None else stdout
        stderr = sys.stderr if stderr is None else stderr
        fmt = render.resolve(args.format, stdout)
        width = shutil.get_terminal_size((0, 0)).columns if fmt is Format.table and stdout.isatty() else 0
        return cls(fmt, Style(render.use_colour(stdout, environ)), bool(args.verbose),
                   Path(args.log) if args.log else None, False, getattr(args, "json", None) == "-",
                   stdout, stderr, width)

    @contextlib.contextmanager
    def pytest_report(self) -> Iterator[None]:
        """Where pytest's report goes while it runs. pytest's terminal writer writes to sys.stdout
        as it was when the session was configured (_pytest/terminal.py) and its usage errors to
        sys.stderr (_pytest/config/__init__.py main): both are redirected here."""
        if self.verbose:
            # stdout is the promise table, which runners parse: pytest's report goes beside it.
            with contextlib.redirect_stdout(sys.stderr):
                yield
            return
        if self.log is None:
            self.log, self.chosen = new_log("witness"), True
        sink: TextIO
        if self.log is None:
            self.kept_nowhere = True
            sink = io.StringIO()
        else:
            sink = open(self.log, "w", encoding="utf-8", errors="replace")  # noqa: SIM115 (closed below)
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                yield
        finally:
            sink.close()

    def report(self, rows: Sequence[Row], *, problems: Sequence[str], head: str, word: str,
               tail: str, remedies: Mapping[str, str] | None = None) -> None:
        """The table (or lines, or Markdown) with each BROKEN promise's remedy (by promise id), what
        else went wrong, then the summary line `HEAD: WORD TAIL`, which is what runners and tests read
        last."""
        if self.json_stdout:
            return
        summary = f"{head}: {word} {tail}"
        rows = render.said_once(rows, problems)
        if self.fmt is Format.markdown:
            out = render.witness_markdown(rows, word=word, summary=summary, problems=problems,
                                          remedies=remedies)
        else:
            body = (render.table_text(rows, width=self.width, style=self.style, remedies=remedies)
                    if self.fmt is Format.table else render.lines_text(rows, self.style, remedies))
            out = [*body, *(self.style.paint(p, "yellow") for p in problems),
                   f"{head}: {self.style.verdict(word)} {tail}"]
        self.stdout.write("".join(line + "\n" for line in out))
        self.stdout.flush()

    def refused(self, reason: str, ways_on: Sequence[str]) -> None:
        """A refusal as Markdown on stdout, when that is the format asked for (the one line on
        stderr is commands/cli.py's)."""
        if self.fmt is Format.markdown:
            self.stdout.write("\n".join(render.refusal_markdown(PROG, reason, ways_on=ways_on)) + "\n")

    def finish(self, code: int | None) -> None:
        """The end: the default log removed (a pass; None: a cancelled run) or kept and named."""
        if self.verbose:
            return
        if self.log is not None and code == EXIT_USAGE:
            # pytest's own usage error (`-- --bogus`) went to the log: said here in one line, as every
            # usage error is (issue 28: three lines, pytest's usage and error, then the log's name),
            # and the log goes: nothing was judged.
            said = [ln.split(": error: ", 1)[-1].removeprefix("ERROR: ").strip()
                    for ln in _read(self.log).splitlines() if ": error: " in ln or ln.startswith("ERROR:")]
            said = [ln for ln in said if not ln.startswith("usage: ")] or said
            self.stderr.write(f"{PROG}: -- PYTEST ARGS: pytest refused them: {said[-1] if said else '?'}\n")
            if self.chosen:
                self.log.unlink(missing_ok=True)
            self.stderr.flush()
            return
        passed = code in (None, EXIT_OK)
        if self.kept_nowhere and not passed:
            self.stderr.write(f"{PROG}: pytest's report was not kept (cannot write "
                              f"{log_dir() or '~/.local/state'}): re-run with -v or --log FILE\n")
        elif self.chosen and self.log is not None:
            if passed:
                self.log.unlink(missing_ok=True)
            else:
                prune(self.log.parent)
                self.stderr.write(f"{PROG}: pytest's report: {self.log}\n")
        self.stderr.flush()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


# ---- run's log, shared by the witness runs it starts -------------------------------------------------


class RunLog(NamedTuple):
    """`run` picks the default log itself and hands it to each witness run as `--log` (container and
    VM modes relocate it per leg to `NAME-LABEL.log`, as they do --junitxml), so the log outlives a
    container or a VM and the paths it names are this host's. None: -v or --log FILE was given."""

    path: Path | None

    @classmethod
    def choose(cls, *, verbose: bool, log: str | None, environ: Mapping[str, str] = os.environ) -> RunLog:
        return cls(None if verbose or log else new_log("run", environ))

    def files(self) -> list[Path]:
        """This run's logs: the path itself (native) and its per-leg copies (`STEM-LABEL.log`)."""
        if self.path is None:
            return []
        stem = self.path.stem
        return sorted(p for p in self.path.parent.glob(f"{stem}*.log")
                      if p.name == self.path.name or p.name.startswith(stem + "-"))

    def finish(self, code: int | None) -> list[Path]:
        """Remove every log of a passed (or cancelled: None) run and every empty one; return the
        ones kept, for the caller to name."""
        kept = []
        for p in self.files():
            try:
                empty = p.stat().st_size == 0
            except FileNotFoundError:
                continue
            if code in (None, EXIT_OK) or empty:
                p.unlink(missing_ok=True)
            else:
                kept.append(p)
        if kept and self.path is not None:
            prune(self.path.parent)
        return kept
