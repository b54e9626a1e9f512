"""How a run ends early: SIGTERM, SIGINT and SIGHUP become an orderly stop, and a SIGKILL leaves
nothing running (docs/cancellation.md).

    cancel.install("witness")        # commands/cli.py, once, before anything is started
    ...                              # probes.run.run() tracks each child's process group
    except cancel.Cancelled as e:
        return cancel.finish(e)      # the verdict line; 143, 130 or 129

The orderly stop is the normal clean-up path, unwound: the first signal raises `Cancelled` in the
main thread wherever it is, and every `finally` and context manager on the way out runs as on any
other exit (run() stops its child's group, layouts and cgroup leaves are removed, `docker rm` runs).
At the same moment a stopper thread signals every child group still tracked (those run() waits for
in other threads too: the controls' parallel witness runs), and SIGKILLs what is left after
probes.run.STOP_GRACE. Further signals are ignored: they would only abort the clean-up. `finish`
then sweeps what the unwinding missed (probes/owner.py: our own stamped directories, and any of a
dead run), and prints the verdict line.

SIGKILL runs no handler, so two things act without us:
- every child gets a parent-death signal (PR_SET_PDEATHSIG, set in probes.run's preexec);
- the guardian (probes/guardian.py), a process of its own started by install(), holds the read end
  of a pipe only we write. It learns each child group, cgroup leaf and undo command (`docker rm`) as
  we make them, and when the pipe reaches EOF with any still registered, we are dead: it stops them.
Directories are left to the next run's sweep, which says on stderr what it removed."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from probes import child_exit, owner

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
GUARDIAN = Path(__file__).with_name("guardian.py")
PROG = "sandbox-conformance"


class Cancelled(KeyboardInterrupt):
    """The run was asked to stop by a signal. A KeyboardInterrupt, so pytest (the witness command runs
    it in-process) stops the session and tears its fixtures down as it does for ^C, instead of
    recording one failed test and carrying on with the next."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(self.name)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 143 SIGTERM, 130 SIGINT, 129 SIGHUP


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.previous: dict[int, Any] = {}  # the handlers install() replaced
        self.received: Cancelled | None = None
        self.label = "?"
        self.started = time.monotonic()
        self.groups: dict[int, int] = {}  # pgid -> its stop signal
        self.keys = itertools.count(1)
        self.guardian: subprocess.Popen[bytes] | None = None
        self.pipe: IO[bytes] | None = None
        # A child writing to our stderr was stopped mid-line (pytest's progress dots in a container):
        # the verdict line must start a line of its own.
        self.mid_line = False


_state = _State()


def install(label: str) -> None:
    """Turn the three stop signals into Cancelled, and start the guardian. Handlers can only be set
    from the main thread (Python runs them there); elsewhere (a test calling a command in a thread)
    only the guardian is started."""
    _state.label = label
    _state.started = time.monotonic()
    _state.received = None
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            _state.previous[sig] = signal.signal(sig, _handler)
    _start_guardian()


def guardian_pid() -> int | None:
    """Our guardian's pid while it runs: a child of ours that no launch made (conformance/observer.py
    must not take it for an orphan of one)."""
    g = _state.guardian
    return g.pid if g is not None else None


def set_label(label: str) -> None:
    """What the verdict line calls this run (`run` sets the mode it chose)."""
    _state.label = label


def received() -> Cancelled | None:
    return _state.received


def check() -> None:
    """Raise the Cancelled already received (a fresh one: several threads may raise it): for code that
    swallowed it (pytest turns it into an interrupted session and returns)."""
    if _state.received is not None:
        raise Cancelled(_state.received.signum)


def _handler(signum: int, _frame: object) -> None:
    if _state.received is not None:
        return  # already stopping: a second signal would only abort the clean-up under way
    _state.received = Cancelled(signum)
    threading.Thread(target=_stop_all, name="sbxc-stop", daemon=True).start()
    raise _state.received


def _stop_all() -> None:
    from probes.run import STOP_GRACE

    stop_groups(dict(_state.groups), grace=STOP_GRACE, tracked=True)


def stop_groups(groups: Mapping[int, int], *, grace: float, tracked: bool = False) -> None:
    """Each group's stop signal, then SIGKILL for what is still there after `grace`. tracked: wait
    for run() to forget them (it has reaped the leader) rather than for the group to be empty."""
    for pgid, sig in groups.items():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    deadline = time.monotonic() + grace

    def left() -> list[int]:
        if tracked:
            return [g for g in groups if g in _state.groups]
        return [g for g in groups if _group_alive(g)]

    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    for pgid in left():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- what run() and the modes register ---------------------------------------------------------------

def track(pgid: int, stop_signal: int = signal.SIGTERM) -> None:
    """A child process group run() started: stopped with the rest if we are cancelled, and by the
    guardian if we die."""
    with _state.lock:
        _state.groups[pgid] = stop_signal
    _tell({"key": -pgid, "group": pgid, "signal": int(stop_signal)})


def untrack(pgid: int) -> None:
    with _state.lock:
        _state.groups.pop(pgid, None)
    _tell({"done": -pgid})


def guard_command(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  timeout: float = 60.0) -> int:
    """A command that undoes something we started outside our process tree (a container: the engine
    runs it). Returns a key for `done` once we have undone it ourselves."""
    key = next(_state.keys)
    _tell({"key": key, "argv": list(argv), "env": dict(env) if env is not None else None,
           "timeout": timeout})
    return key


def guard_cgroup(path: Path | str) -> int:
    key = next(_state.keys)
    _tell({"key": key, "cgroup": str(path)})
    return key


def stopped_sharing_output() -> None:
    """run() stopped a child that wrote to our own stdout/stderr (capture=False)."""
    _state.mid_line = True


def done(key: int) -> None:
    _tell({"done": key})


def _tell(msg: Mapping[str, object]) -> None:
    with _state.lock:
        if _state.pipe is None:
            return
        try:
            _state.pipe.write(json.dumps(msg).encode() + b"\n")
            _state.pipe.flush()
        except OSError:
            _state.pipe = None  # the guardian is gone; the next run's sweep is what is left


def _start_guardian() -> None:
    if _state.guardian is not None:
        return
    try:
        # No parent-death signal and a session of its own: it must outlive us and our group kills.
        _state.guardian = subprocess.Popen(
            [sys.executable, "-I", "-S", str(GUARDIAN), str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
        )
    except OSError as e:
        print(f"{PROG}: no guardian ({e.strerror}): a SIGKILL of this run may leave processes running",
              file=sys.stderr)
        return
    _state.pipe = _state.guardian.stdin


def forked() -> None:
    """In a copy of this process made by fork (probes/run.py Forked), before it does anything: what
    install() set up was its parent's. Its guardian's pipe is closed here, so that guardian sees the
    end of it when the parent dies, not when the copy does; the parent's groups are not ours to stop;
    the copy's own install() starts a guardian of its own."""
    _state.lock = threading.Lock()  # single-threaded at the fork, but a fresh one costs nothing
    if _state.pipe is not None:
        with contextlib.suppress(OSError):
            _state.pipe.close()  # nothing buffered to write twice: _tell flushes every message
    _state.pipe = None
    _state.guardian = None  # the parent's child: only the parent reaps it
    _state.groups.clear()
    _state.previous.clear()
    _state.received = None
    _state.mid_line = False
    # The parent's handlers would raise Cancelled into code that has nothing to stop yet: until the
    # copy's own install(), a stop signal ends it as it would any process that made nothing.
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def close(timeout: float = 5.0) -> None:
    """Our own clean-up is done: close the guardian's pipe and reap it."""
    with _state.lock:
        pipe, _state.pipe = _state.pipe, None
    if pipe is not None:
        with contextlib.suppress(OSError):
            pipe.close()
    if _state.guardian is not None:
        # Woken the moment it exits (Popen.wait with a timeout would look again only ~7 ms later).
        child_exit.wait_exit(_state.guardian, timeout)
        _state.guardian = None


def uninstall() -> None:
    """Back to the handlers install() found (a test calling main() in-process keeps pytest's)."""
    for sig, previous in list(_state.previous.items()):
        signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        del _state.previous[sig]


def finish(exc: Cancelled) -> int:
    """The end of a cancelled run: stop any child group still tracked, sweep what the unwinding
    left (ours, and any dead run's), print the verdict line. Returns the exit code."""
    from probes.run import STOP_GRACE

    _state.received = _state.received or exc  # handlers now ignore further signals
    stop_groups(dict(_state.groups), grace=STOP_GRACE, tracked=True)
    owner.say(owner.sweep(include_self=True))
    close()
    # Our reader may be gone (a parent killed with SIGKILL closed the pipe): the verdict line is then
    # unreadable anyway, and the exit status must still say how the run ended.
    with contextlib.suppress(OSError):
        if _state.mid_line:
            print(file=sys.stderr)
        print(f"{PROG}: KILLED-{exc.name} mode={_state.label} exit={exc.exit_code} "
              f"time={time.monotonic() - _state.started:.1f}s", file=sys.stderr, flush=True)
    return exc.exit_code
