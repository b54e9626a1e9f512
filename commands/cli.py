"""`sandbox-conformance`: one entry point, one subcommand module each.

Each subcommand module exposes `add_arguments(parser)` and `main(args) -> int`; this file turns
UsageError into exit 2 with one line and Refusal into exit 75, so no subcommand prints a traceback
for bad input."""

from __future__ import annotations

import argparse
import atexit
import errno
import gc
import importlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from sandbox_conformance import commands
from sandbox_conformance.processes import cancel
from sandbox_conformance.processes.exits import EXIT_FAIL, EXIT_UNAVAILABLE, EXIT_USAGE, Refusal, UsageError

# name -> (module in this package, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "probe": ("probe", "find out what this host offers, with evidence"),
    "witness": ("witness", "run the witness suite on this host (no mode logic)"),
    "run": ("run", "decide native, container or VM mode, run the witness suite there, or refuse"),
    "controls": ("controls", "prove every witness can go red, for the right reason"),
    "mr-check": ("mr_check", "say which tier covers a change, run it, or hand it over"),
    "adapters": ("adapters", "list the adapters for sandboxes this project did not write"),
    "matrix": ("matrix", "every sandbox this host can run, through one witness set, as one table"),
    "fleet-report": ("fleet_report", "many hosts' probe and witness reports as one table"),
}


# Subcommands that start no sandbox, container or VM: no guardian (probe stays fast; its trials
# still die with it through processes.children).
STARTS_NOTHING = frozenset({"probe", "fleet-report"})

# Subcommands whose process is done in seconds (`run` waits for a witness child, a container or a VM,
# allocating little meanwhile), run without the cyclic garbage collector (main).
SHORT_LIVED = frozenset({"probe", "witness", "run"})


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage dump: exit 2 is a contract.
        print(f"{self.prog}: {message} (see --help)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line: its module is the only one imported, so `probe` does
    not pay for the witness suite's imports (measured: tens of ms of a ~200 ms probe run)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in SUBCOMMANDS else None
    return None


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    parser = _Parser(prog="sandbox-conformance", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    chosen = _chosen(argv)
    for name, (module, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if chosen is not None and name != chosen:
            continue
        mod = importlib.import_module(f".{module}", commands.__name__)
        mod.add_arguments(p)
        p.set_defaults(_main=mod.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command's exit code. As the process's entry point (no argv given), the process ends here."""
    if argv is None and _chosen(sys.argv[1:]) in SHORT_LIVED:
        # A process that ends within seconds: the few cycles it makes (pytest's reports, tracebacks)
        # go with it, and the collector's passes over everything imported (pytest's module graph
        # included) were 10-15 ms of a witness run (bench/witness_bench.py). Not for a call from
        # another program (a test), whose process goes on.
        gc.disable()
    try:
        code = _command(list(sys.argv[1:] if argv is None else argv))
    finally:
        # A stop signal that came before the handlers (or after them: the command is over) ends the
        # process now, by that signal (commands/__init__.py).
        commands.release()
    if argv is None:
        _leave(code)
    return code


def empty_value(argv: Sequence[str]) -> str | None:
    """The option given an empty value, as one line, or None. An empty string never means "the
    default": in CI, `--profile "$PROFILE"` with the variable unset would test the embedded reference
    profile and pass, `--expected-skips ''` would switch the skip gate off (issue 28). Words after
    `--` are pytest's."""
    for i, word in enumerate(argv):
        if word == "--":
            return None
        if word.startswith("-") and word.endswith("=") and len(word) > 2:
            return f"{word[:-1]}: expected a value, got an empty string"
        if word == "":
            before = argv[i - 1] if i and argv[i - 1].startswith("-") else None
            return (f"{before}: expected a value, got an empty string" if before
                    else "an empty argument: expected a value")
    return None


def _command(argv: list[str]) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    empty = empty_value(argv)
    if empty is not None:
        print(f"sandbox-conformance {args.command}: {empty}", file=sys.stderr)
        return EXIT_USAGE
    return run_command(args)


def witness_namespace(values: dict[str, Any]) -> argparse.Namespace:
    """The witness command's arguments as its parser would have made them, from data: every witness
    option at its default (conformance/options.py), then `values` (a None keeps the default). The
    forked standby's way in (runners/native.py): no argv is written out and parsed again."""
    # Here, not at the top: `probe` imports this module and none of the witness's.
    from sandbox_conformance.commands import witness
    from sandbox_conformance.conformance import options

    args = options.namespace(options.WITNESS)
    for key, value in values.items():
        if value is not None:
            setattr(args, key, list(value) if isinstance(value, tuple) else value)
    args.command, args._main = "witness", witness.main
    args.standby_fd = getattr(args, "standby_fd", None)
    args.pytest_args = list(values.get("pytest_args") or ())
    return args


def run_command(args: argparse.Namespace) -> int:
    """A parsed command, run with the contract around it: its exit code, UsageError as exit 2 and
    Refusal as 75 with one line, a stop signal as an orderly stop."""
    if args.command in STARTS_NOTHING:
        commands.release()  # its trials die with it: a stop signal ends it as any process
    try:
        try:
            if args.command not in STARTS_NOTHING:
                # docs/cancellation.md: a signal is an orderly stop from here on, and a SIGKILL
                # leaves the guardian to stop what we started. One that came before, held since the
                # process started, is raised here (commands/__init__.py).
                cancel.install(args.command, held=commands.take())
                if not getattr(sys.modules[args._main.__module__], "BEGINS_ITSELF", False):
                    cancel.begin()
            return int(args._main(args))
        except UsageError as e:
            print(f"sandbox-conformance {args.command}: {e}", file=sys.stderr)
            return EXIT_USAGE
        except Refusal as e:
            print(f"sandbox-conformance {args.command}: refused: {e.reason}", file=sys.stderr)
            for why in e.because:
                print(f"  because: {why}", file=sys.stderr)
            for way in e.ways_on:
                print(f"  way on: {way}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # The disk filled during the run (one full before it is exit 2, processes/outputs.py
            # check_space): a fact about the host, said in one line, not a traceback (issue 28).
            where = f": {e.filename}" if e.filename else ""
            print(f"sandbox-conformance {args.command}: harness error: {e.strerror} "
                  f"({errno.errorcode[e.errno]}){where}", file=sys.stderr)
            return EXIT_FAIL
    except cancel.Cancelled as e:
        return cancel.finish(e)
    except KeyboardInterrupt:  # ^C before the handlers were installed
        return 130
    finally:
        cancel.uninstall()  # done: a late signal now just ends the process
        cancel.close()
        # The run is over and its reports are written and closed: the interpreter's final collection
        # of pytest's object graph (over 100 ms in a witness run, bench/) has nothing left to do.
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()


def _leave(code: int) -> None:
    """End the process now that the command is over: its reports are written and closed, its children
    reaped, its guardian told (cancel.close), and no other thread is left. The exit handlers run, the
    output is flushed, and os._exit skips the interpreter's teardown of every module and object, which
    is all that is left: 15-25 ms of a witness process, and again of `run` waiting for it (bench/). A
    thread still alive, or output that cannot be flushed, takes the interpreter's own way out."""
    if threading.active_count() > 1:
        return
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
