"""The command layer: one module per subcommand, above probes, conformance, runners and mrcheck
(docs/architecture.md).

A stop signal (SIGTERM, SIGINT, SIGHUP) that comes while the process starts is held here, not obeyed
(issue 28): until commands/cli.py has installed processes/cancel.py's handlers (the chosen command's
imports and its argument checks, up to ~0.3 s of a 0.5 s witness run under load), it ended the
process with no verdict line, or raised into a half-done import. The first one held is raised by
cancel.install as the command's first act, an orderly stop with its verdict line; a process that never
installs them (probe, fleet-report, a usage error) ends by it once it is done with its arguments, as
it would have at once (release). Only in the process the command is (the installed script, or
`python -m sandbox_conformance`): a program that imports us keeps its own handlers. This file runs before
anything else of ours, so it imports only `signal` (~0.6 ms: its `enum` is loaded already)."""

import signal as _signal
import sys as _sys

_STOP = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP)
_held: list[int] = []
_found: dict[int, object] = {}  # the handlers the process started with


def _hold(signum: int, _frame: object) -> None:
    _held.append(signum)


def _is_the_command() -> bool:
    if _sys.argv and _sys.argv[0].rsplit("/", 1)[-1] == "sandbox-conformance":
        return True
    argv = _sys.orig_argv
    return any(argv[i:i + 2] == ["-m", "sandbox_conformance"] for i in range(len(argv)))


def holding() -> bool:
    return bool(_found)


def take() -> int | None:
    """The first stop signal held (None: none came), handed to cancel.install; forgotten here."""
    first = _held[0] if _held else None
    _held.clear()
    return first


def release() -> None:
    """Back to the handlers the process started with. A stop signal held and not taken ends the
    process now, by that signal, as it would have when it came."""
    for sig, found in _found.items():
        _signal.signal(sig, found)  # type: ignore[arg-type]  # what signal.signal returned
    _found.clear()
    if _held:
        sig = _held[0]
        _signal.signal(sig, _signal.SIG_DFL)
        _signal.raise_signal(sig)


if _is_the_command():
    for _sig in _STOP:
        _found[_sig] = _signal.signal(_sig, _hold)
