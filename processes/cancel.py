"""How a run ends early: SIGTERM, SIGINT and SIGHUP become an orderly stop, and a SIGKILL leaves
nothing running (docs/cancellation.md).

    cancel.install("witness")        # commands/cli.py, once, before anything is started
    ...                              # processes.children.run() tracks each child's process group
    except cancel.Cancelled as e:
        return cancel.finish(e)      # the verdict line; 143, 130 or 129

The orderly stop is the normal clean-up path, unwound: the first signal raises `Cancelled` in the
main thread wherever it is, and every `finally` and context manager on the way out runs as on any
other exit (run() stops its child's group, layouts and cgroup leaves are removed, `docker rm` runs).
At the same moment a stopper thread signals every child group still tracked (those run() waits for
in other threads too: the controls' parallel witness runs), and SIGKILLs what is left after
processes.kills.STOP_GRACE. Further signals are ignored: they would only abort the clean-up. `finish`
then sweeps what the unwinding missed (processes/owner.py: our own stamped directories, and any of a
dead run), and prints the verdict line.

SIGKILL runs no handler, so two things act without us:
- every child gets a parent-death signal (PR_SET_PDEATHSIG, set in processes.children's preexec);
- the guardian (processes/guardian.py), a process of its own started by install(), holds the read end
  of a pipe only we write. It learns each child group, cgroup leaf and undo command (`docker rm`) as
  we make them, and when the pipe reaches EOF with any still registered, we are dead: it stops them.
Directories are left to the next run's sweep, which says on stderr what it removed.

Where the first signal raises matters (issue 28, each seen hanging a witness run): a Cancelled raised
inside importlib (a weakref callback of `_get_module_lock` swallows it, and one raised between that
callback's `_imp.acquire_lock()` and its `try` leaves the import lock held, so the next fork with a
preexec_fn in any thread waits for ever) or anywhere Python swallows what is raised (`Exception
ignored in ...`) is owed again, redelivered to the main thread until it lands in code that can
unwind; a step that must not be cut in two (a child started and not yet tracked, a thread started
and not yet recorded) runs under `deferred()`, which raises it once the step is whole."""

from __future__ import annotations

import _thread
import contextlib
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any

from sandbox_conformance.processes import child_exit, kills, owner

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
        self.shared = False  # the pipe is a forked parent's, to the parent's guardian (forked())
        # A child writing to our stderr was stopped mid-line (pytest's progress dots in a container):
        # the verdict line must start a line of its own.
        self.mid_line = False
        # The main thread is in a deferred() step this deep, and the Cancelled it is owed (the signal
        # came where it could not be raised, or was swallowed there) is still to be raised.
        self.deferring = 0
        self.opening = False  # install() made one of them, until begin()
        self.owed = False
        self.redelivering = False
        self.redeliverer: threading.Thread | None = None  # _redeliver's thread, joined by uninstall()
        self.unraisable: Any = None  # the sys.unraisablehook install() wrapped


_state = _State()


def install(label: str, *, held: int | None = None) -> None:
    """Turn the three stop signals into Cancelled, and start the guardian. Handlers can only be set
    from the main thread (Python runs them there); elsewhere (a test calling a command in a thread)
    only the guardian is started. held: a stop signal that came while the process started, before
    any handler of ours (commands/__init__.py holds it).

    A signal from here on is kept (as in deferred()) until begin(): commands/cli.py calls it at once,
    `run` once its verdict document can say how the run ended. A held one is raised there too."""
    _state.label = label
    _state.started = time.monotonic()
    _state.received = None
    _state.owed = False
    if threading.current_thread() is threading.main_thread():
        if not _state.opening:
            _state.opening = True
            _state.deferring += 1
        for sig in SIGNALS:
            _state.previous[sig] = signal.signal(sig, _handler)
        if _state.unraisable is None:
            _state.unraisable = sys.unraisablehook
            sys.unraisablehook = _unraisable
    if held is not None:
        _state.received = Cancelled(held)
        _state.owed = True
    else:
        _start_guardian()


def begin() -> None:
    """The command's own first step: a stop signal kept since install() (or held before it) is
    raised here."""
    if not _state.opening:
        return
    _state.opening = False
    _state.deferring -= 1
    if not _state.deferring and _state.owed and _state.received is not None:
        _state.owed = False
        raise Cancelled(_state.received.signum)


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
        if threading.current_thread() is threading.main_thread():
            _state.owed = False
        raise Cancelled(_state.received.signum)


def _handler(signum: int, frame: FrameType | None) -> None:
    if _state.received is None:
        _state.received = Cancelled(signum)
        threading.Thread(target=_stop_all, name="sbxc-stop", daemon=True).start()
        _state.owed = True
    if not _state.owed:
        return  # already stopping: a second signal would only abort the clean-up under way
    if _state.deferring:
        return  # raised when the step is whole (deferred)
    if not _can_unwind(frame):
        _redeliver()
        return
    _state.owed = False
    raise Cancelled(_state.received.signum)


# Where a raise would be swallowed or cut a lock's acquire from its release: the import machinery
# (`_get_module_lock`'s weakref callback takes `_imp.acquire_lock()` one bytecode before its `try`).
_NO_UNWIND = "<frozen importlib._bootstrap"


def _can_unwind(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith(_NO_UNWIND):
            return False
        frame = frame.f_back
    return True


def _redeliver() -> None:
    """The Cancelled is owed: ask again, every few ms, until it is raised (the main thread runs the
    handler at its next check, _thread.interrupt_main(2)), out of the import or callback that could
    not take it."""
    if _state.redelivering or _state.received is None:
        return
    _state.redelivering = True
    signum = signal.Signals(_state.received.signum)

    def again() -> None:
        try:
            while True:
                time.sleep(0.005)
                # Owed still, after the sleep: one interrupt more, once it was raised and the command
                # ended, met the handler the process started with, Python's for SIGINT, and raised
                # KeyboardInterrupt into threading._shutdown after the verdict line (issue 28's
                # signal test, under load).
                if not _state.owed:
                    break
                if not _state.deferring:
                    _thread.interrupt_main(signum)
        finally:
            _state.redelivering = False

    _state.redeliverer = threading.Thread(target=again, name="sbxc-redeliver", daemon=True)
    _state.redeliverer.start()


def _unraisable(unraisable: Any) -> None:
    """sys.unraisablehook: a Cancelled raised where Python swallows what is raised (a weakref
    callback, a __del__) is owed again, not lost (it was, as `Exception ignored in ...`, and the run
    went on past 100 s)."""
    if isinstance(unraisable.exc_value, Cancelled) and _state.received is not None:
        _state.owed = True
        _redeliver()
        return
    (_state.unraisable or sys.__unraisablehook__)(unraisable)


class deferred(contextlib.AbstractContextManager["deferred"]):  # lower case: `with cancel.deferred():`
    """A step a stop signal must not cut in two: in the main thread, a signal that comes inside it
    is raised as it ends (elsewhere it changes nothing: handlers run in the main thread only). With
    `release()`, the caller picks where: inside its own try, once what it started is known."""

    def __init__(self) -> None:
        self._main = threading.current_thread() is threading.main_thread()
        self._held = False

    def __enter__(self) -> deferred:
        if self._main and not self._held:
            self._held = True
            _state.deferring += 1
        return self

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        _state.deferring -= 1
        if not _state.deferring and _state.owed and _state.received is not None:
            _state.owed = False
            raise Cancelled(_state.received.signum)

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            self.release()
        elif self._held:  # already unwinding: a Cancelled is what was owed; another error takes it along
            self._held = False
            _state.deferring -= 1
            if isinstance(value, Cancelled):
                _state.owed = False
            elif _state.owed and not _state.deferring:
                _redeliver()


def _stop_all() -> None:
    stop_groups(dict(_state.groups), grace=kills.STOP_GRACE, tracked=True)


def stop_groups(groups: Mapping[int, int], *, grace: float, tracked: bool = False) -> None:
    """Each group's stop signal, then SIGKILL for what is still there after `grace`. tracked: wait
    for run() to forget them (it has reaped the leader) rather than for the group to be empty."""
    for pgid, sig in groups.items():
        kills.killpg(pgid, sig, "the run was cancelled")
    deadline = time.monotonic() + grace

    def left() -> list[int]:
        if tracked:
            return [g for g in groups if g in _state.groups]
        return [g for g in groups if _group_alive(g)]

    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    for pgid in left():
        kills.killpg(pgid, signal.SIGKILL, "the run was cancelled: still there after the grace")


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
    # The guardian is told first: finish() goes on to close its pipe once a group is forgotten here,
    # and a "done" sent after that was lost. The guardian then stopped a group run() had reaped, whose
    # last members, reparented to us as their subreaper, were zombies only our exit could reap: every
    # stop of a run with a probe's trial under way took the guardian's whole 5 s (bench/signal_bench.py).
    # Both steps or neither: a stop signal raised between them (or inside _tell) left the group
    # registered here, and finish() waited its whole grace for a group nobody would reap again.
    with deferred():
        _tell({"done": -pgid})
        with _state.lock:
            _state.groups.pop(pgid, None)


def undo_on_death(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  timeout: float = 60.0) -> int:
    """A command that undoes something we started outside our process tree (a container: the engine
    runs it). Returns a key for `done` once we have undone it ourselves."""
    key = next(_state.keys)
    _tell({"key": key, "argv": list(argv), "env": dict(env) if env is not None else None,
           "timeout": timeout})
    return key


def empty_on_death(path: Path | str) -> int:
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
            for line in guardian_lines(msg, os.getpid()):
                # One write per line, each whole: run's forked witness writes to the same pipe, and
                # pipe(7) keeps a write of at most PIPE_BUF bytes from being interleaved with another's.
                _state.pipe.write(line)
                _state.pipe.flush()
        except OSError:
            _state.pipe = None  # the guardian is gone; the next run's sweep is what is left


def guardian_lines(msg: Mapping[str, object], writer: int, limit: int = select.PIPE_BUF) -> list[bytes]:
    """`msg` as the guardian's lines, none longer than `limit` bytes: one line if it fits, else parts
    the guardian joins by writer ({"part": pid, "text": ..., "end": 1} on the last). A registration
    is a few hundred bytes, but an undo command carries its engine's environment (a PATH, a
    DOCKER_CONFIG), whose size is the user's: one line over PIPE_BUF, written while the other writer
    wrote, would have lost both registrations."""
    text = json.dumps(msg)  # ensure_ascii: a character is a byte, and escaping one at most doubles it
    if len(text) < limit:
        return [text.encode() + b"\n"]
    step = (limit - 64) // 2  # room for the wrapper and for every character of a piece escaped
    pieces = [text[i:i + step] for i in range(0, len(text), step)]
    return [json.dumps({"part": writer, "text": piece, **({"end": 1} if i == len(pieces) - 1 else {})})
            .encode() + b"\n" for i, piece in enumerate(pieces)]


def _start_guardian() -> None:
    if _state.guardian is not None or (_state.shared and _state.pipe is not None):
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
    """In a copy of this process made by fork (processes/children.py Forked), before it does anything: what
    install() set up was its parent's. The parent's groups are not ours to stop, and its guardian is
    not ours to reap; but its pipe is kept, and the copy's own install() starts no guardian: one per
    run, not one per process (a guardian's start is ~15 ms of CPU, bench/README.md session 12). The
    guardian reads both writers (a line under PIPE_BUF is written whole, pipe(7)); it sees EOF, and
    undoes what is still registered, once both have closed their ends, however each went. A copy
    SIGKILLed while its parent lives leaves what it registered to the parent's end: the parent reaps
    it, finishes and closes (`run` has nothing long left to do by then). The copy's keys are its own
    (its pid in the high bits), never one its parent will use."""
    _state.lock = threading.Lock()  # single-threaded at the fork, but a fresh one costs nothing
    _state.shared = _state.pipe is not None
    _state.keys = itertools.count(os.getpid() << 32)
    _state.guardian = None  # the parent's child: only the parent reaps it
    _state.groups.clear()
    _state.previous.clear()
    _state.received = None
    _state.mid_line = False
    _state.deferring, _state.owed, _state.redelivering, _state.opening = 0, False, False, False
    _state.redeliverer = None  # the parent's thread: not in this copy
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
    """Back to the handlers install() found (a test calling main() in-process keeps pytest's). Nothing
    is owed any more, and a redelivery under way is over first: an interrupt it sent after this would
    run the handler put back here, not ours."""
    _state.owed = False
    redeliverer = _state.redeliverer
    if redeliverer is not None and redeliverer is not threading.current_thread():
        redeliverer.join(timeout=1.0)  # it looks at `owed` every 5 ms
    _state.redeliverer = None
    for sig, previous in list(_state.previous.items()):
        signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        del _state.previous[sig]
    if threading.current_thread() is threading.main_thread():
        if _state.unraisable is not None:
            sys.unraisablehook, _state.unraisable = _state.unraisable, None
        if _state.opening:
            _state.opening = False
            _state.deferring -= 1
    _state.owed = False


def finish(exc: Cancelled) -> int:
    """The end of a cancelled run: stop any child group still tracked, sweep what the unwinding
    left (ours, and any dead run's), print the verdict line. Returns the exit code."""

    _state.received = _state.received or exc  # handlers now ignore further signals
    _state.owed = False  # it is being handled here
    stop_groups(dict(_state.groups), grace=kills.STOP_GRACE, tracked=True)
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
