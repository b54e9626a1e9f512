"""The one subprocess wrapper: a timeout always, the whole process group killed, a minimal env.

Every child dies with us: it gets a parent-death signal (PR_SET_PDEATHSIG, SIGKILL unless the caller
names a gentler one for a child of ours that cleans up after itself), and its process group is
tracked for processes/cancel.py (stopped on SIGTERM/SIGINT/SIGHUP, and by the guardian if we are
SIGKILLed). The kernel sends the parent-death signal when the THREAD that forked the child exits, not
the process (prctl(2)): run() never returns while its child runs, so the calling thread always
outlives it, whichever thread that is."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from sandbox_conformance.processes import cancel, child_exit, kills

T = TypeVar("T")

# The environment a child gets unless the caller says otherwise: enough to find binaries and speak
# UTF-8, nothing that could carry a secret into a probe or a sandbox.
ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL", "TERM", "TZ")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# How much of a line stderr_tail shows, and how much of each stream of a streamed (launch) child is
# kept: the tail, where a launcher's error and the witness document are (issue 28: a launcher writing
# 100 MB to stderr without a newline took 6.9 GB). stdout keeps more: the witness document is one line
# of it, and a profile with thousands of paths makes it megabytes.
TAIL_LINE_WIDTH = 500
STDERR_KEEP = 64 << 10
STDERR_KEEP_LINES = 200
STDOUT_KEEP = 64 << 20
# A stdout line longer than this is not handed to on_line (an observer looks for short tagged lines).
ON_LINE_MAX = 1 << 20
_CHUNK = 1 << 16


class Completed(NamedTuple):
    """What a child run through this module did: how it ended, what it printed, how long it took. A Runner
    returns one."""

    argv: tuple[str, ...]
    returncode: int | None  # None: killed on timeout
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    not_found: bool = False  # argv[0] could not be executed at all
    pid: int | None = None  # the child's pid (its process group's too)
    # time.monotonic() at its start and when its leader was seen gone: what ran meanwhile (kills.ended)
    started: float | None = None
    exited: float | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def stderr_tail(self, lines: int = 3, width: int = TAIL_LINE_WIDTH) -> str:
        """The last `lines` lines of stderr, each cut to `width` characters (saying how much was cut):
        a launcher that writes one 100 MB line must not have it repeated on every row (issue 28)."""
        return " | ".join(_cut_line(ln, width) for ln in self.stderr.strip().splitlines()[-lines:])


def _cut_line(line: str, width: int) -> str:
    if len(line) <= width:
        return line
    return f"{line[:width]}... ({len(line) - width} more characters)"


class _Tail:
    """The last `limit` characters (and `lines` lines) of a stream, and how many characters were cut
    before them, said once at the start of text()."""

    def __init__(self, limit: int, lines: int | None = None) -> None:
        self.limit, self.lines = limit, lines
        self.parts: list[str] = []
        self.size = 0
        self.cut = 0

    def add(self, chunk: str) -> None:
        self.parts.append(chunk)
        self.size += len(chunk)
        if self.size > 2 * self.limit:  # trimmed now and then, not on every chunk
            self._trim()

    def _trim(self) -> None:
        whole = "".join(self.parts)
        if len(whole) > self.limit:
            self.cut += len(whole) - self.limit
            whole = whole[-self.limit:]
        self.parts, self.size = [whole], len(whole)

    def text(self) -> str:
        self._trim()
        whole = self.parts[0] if self.parts else ""
        if self.lines is not None and whole.count("\n") > self.lines:
            kept = whole.split("\n")[-(self.lines + 1):]
            self.cut += len(whole) - len("\n".join(kept))
            whole = "\n".join(kept)
            self.parts, self.size = [whole], len(whole)
        if not self.cut:
            return whole
        return f"[sandbox-conformance: the first {self.cut} characters of this stream were cut]\n{whole}"


class Runner(Protocol):
    def __call__(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Completed: ...


def minimal_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every child starts from: the caller's locale and terminal settings, and
    DEFAULT_PATH, never the caller's PATH (a pyenv shim first on it became a task's `python3`, and
    added PYENV_* to its environment: issue 29). `extra` is set last, so a caller that means another
    PATH says so (`--launcher-env PATH=...`). Every caller runs a tool from the standard directories
    or names it by its path (sys.executable, the bwrap the probe resolved)."""
    env = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ and k != "PATH"}
    env["PATH"] = DEFAULT_PATH
    env.update(extra or {})
    return env


STOP_GRACE = kills.STOP_GRACE  # SIGTERM, this long, then SIGKILL (processes/kills.py says why)
# After a timeout's group kill: how long the pipes may take to reach EOF.
DRAIN_SECONDS = 5.0


def kill_group(pgid: int, reason: str = "its leader had exited: what it left in its group") -> None:
    kills.killpg(pgid, signal.SIGKILL, reason)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@functools.cache
def _set_pdeathsig() -> Callable[[int], object]:
    """python-prctl's set_pdeathsig; libc's prctl(2) through ctypes where the package is not importable
    (tests/vm_selfcheck.py runs under `python3 -I -S` in the VM, without site-packages)."""
    try:
        import prctl  # type: ignore[import-untyped]  # python-prctl ships no stubs and no py.typed

        return prctl.set_pdeathsig  # type: ignore[no-any-return]
    except ImportError:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return lambda sig: libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def die_with_parent(sig: int = signal.SIGKILL, *, stderr_is_tty: bool = False) -> Callable[[], None]:
    """A Popen preexec_fn: the child gets `sig` when the thread that started it exits. Everything it
    calls is bound here, in the parent: the child of a threaded process must not import (the import
    lock may be held by a thread that does not exist in the child). If the parent already died
    between fork and prctl, getppid() is no longer the forking process: exit. stderr_is_tty: the
    child's stderr (a terminal) becomes its controlling terminal (TIOCSCTTY, tty_ioctl(4)); it runs
    after setsid, which start_new_session does first."""
    import fcntl
    import termios

    parent = os.getpid()
    set_pdeathsig = _set_pdeathsig()
    ioctl, set_ctty = fcntl.ioctl, termios.TIOCSCTTY

    def preexec() -> None:
        set_pdeathsig(sig)
        if os.getppid() != parent:
            os._exit(125)
        if stderr_is_tty:
            ioctl(2, set_ctty, 0)

    return preexec


def stop(proc: subprocess.Popen[str], grace: float = STOP_GRACE, *, drain: bool = False) -> None:
    """The orderly stop of a child's group: SIGTERM, up to `grace` for the leader to exit, SIGKILL.
    drain: its pipes are ours to read meanwhile (no reader thread has them): a child that writes more
    than a pipe holds (64 KiB) on its way out would otherwise block there until the SIGKILL."""
    kills.killpg(proc.pid, signal.SIGTERM, "stopped: its caller was interrupted or the run cancelled")
    with contextlib.suppress(subprocess.TimeoutExpired):
        if drain and (proc.stdout is not None or proc.stderr is not None):
            proc.communicate(timeout=grace)
        else:
            proc.wait(timeout=grace)
    kill_group(proc.pid, "stopped: the rest of its group after the grace")
    proc.wait()


def run(
    argv: Sequence[str],
    *,
    timeout: float,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    capture: bool = True,
    on_line: Callable[[str], None] | None = None,
    after_exit: Callable[[int], None] | None = None,
    die_with: int = signal.SIGKILL,
    pass_fds: Sequence[int] = (),
    on_start: Callable[[int], None] | None = None,
    terminal: int | None = None,
    terminal_master: int | None = None,
) -> Completed:
    """Run argv in a new session; on timeout SIGKILL its whole process group and reap it.

    capture=False: the child writes to our stdout/stderr as it goes (a long witness run or an image
    build the user must see live); the result then carries no output.
    on_line: called (in a reader thread) with each stdout line as it arrives, while the child runs.
    after_exit: called with the process group id once the leader has exited, BEFORE the rest of its
    group is killed, so the caller can see what the child left running. on_start: called with the
    child's pid as soon as it is started (the host-side observer's watch of a launch). terminal: a
    pseudo-terminal's slave descriptor, given to the child as its stderr and made its controlling
    terminal, the way a shell starts a command (the witness's terminal promise); with on_line or
    after_exit, `terminal_master` (its master) is read while the child runs, as its stderr.
    die_with: the child's parent-death signal; SIGTERM for a child of ours that cleans up after
    itself (a witness run under `run` or `controls`). pass_fds: descriptors the child inherits (every
    other one above stderr is closed in it, as Popen does by default). Interrupted (a Cancelled, any
    exception), run() stops the child's group (SIGTERM, STOP_GRACE, SIGKILL) before it re-raises."""
    argv = tuple(str(a) for a in argv)
    worker = threading.current_thread() is not threading.main_thread()
    if cancel.received() is not None and worker:
        # Cancelled: a worker thread starts nothing new. The main thread may, on its way out: its
        # clean-up (`docker rm --force`) runs through here.
        cancel.check()
    started = time.monotonic()
    pipe = subprocess.PIPE if capture else None
    # From the fork to the child's group tracked, a stop signal waits (in the main thread; the
    # handler runs nowhere else): raised inside Popen it left a child running that nothing knew of.
    # It is raised below, inside the try that stops the child.
    hold = cancel.deferred().__enter__()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=pipe,
            stderr=pipe if terminal is None else terminal,
            env=dict(env) if env is not None else minimal_env(),
            cwd=cwd,
            text=True,
            errors="replace",
            start_new_session=True,
            preexec_fn=die_with_parent(die_with, stderr_is_tty=terminal is not None),
            pass_fds=tuple(pass_fds),
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as e:
        hold.release()
        return Completed(argv, 127, "", f"{argv[0]}: {e.strerror}", 0.0, not_found=True)
    except BlockingIOError as e:
        hold.release()
        # fork(2) refused with EAGAIN: RLIMIT_NPROC or pids.max exhausted. A fact about the host,
        # reported as a failed start, not a crash of whoever asked.
        return Completed(argv, None, "", f"{argv[0]}: fork: {errno.errorcode[e.errno or errno.EAGAIN]}", 0.0)
    except BaseException:
        hold.__exit__(*sys.exc_info())
        raise
    cancel.track(proc.pid, signal.SIGTERM)
    try:
        try:
            hold.release()
            if worker and cancel.received() is not None:
                # The stop came while this thread started its child, after the stopper had signalled
                # the groups it knew (issue 28: that launcher ran on to its whole timeout).
                cancel.check()
            if on_start is not None:
                on_start(proc.pid)
        except BaseException:
            stop(proc, drain=on_line is None and after_exit is None)
            if not capture:
                cancel.stopped_sharing_output()
            raise
        if on_line is not None or after_exit is not None:
            return _streamed(proc, argv, input, timeout, started, on_line, after_exit, terminal_master)
        try:
            out, err = proc.communicate(input, timeout=timeout)
            exited = time.monotonic()
            # The leader exited; anything it left in its group (a daemonised grandchild) goes too.
            kill_group(proc.pid)
            return Completed(argv, proc.returncode, out or "", err or "", time.monotonic() - started,
                             pid=proc.pid, started=started, exited=exited)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid, f"our timeout ({timeout:g} s)")
            try:
                out, err = proc.communicate(timeout=DRAIN_SECONDS)
            except subprocess.TimeoutExpired:
                # The group is dead, but a process that left it (setsid) still holds its stdout or
                # stderr: communicate() would wait for that process's end (it waits for EOF, not for the
                # leader). What came is dropped with the pipes.
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()
                proc.wait()
                out, err = "", (f"{argv[0]}: its output was still held open {DRAIN_SECONDS:g} s after its "
                                "group was killed, by a process outside the group: not read")
            return Completed(argv, None, out or "", err or "", time.monotonic() - started, timed_out=True,
                             pid=proc.pid, started=started)
        except BaseException:
            stop(proc, drain=True)
            if not capture:
                cancel.stopped_sharing_output()
            raise
    finally:
        cancel.untrack(proc.pid)


def _read_terminal(master: int, into: _Tail, gone: int) -> None:
    """A pseudo-terminal's output, as it comes, until the child's leader is gone (`gone` readable) and
    nothing is left. Never a blocking read of the master: the caller holds the slave open (to read
    what was typed into it), so the master would never see the end of it (a read gets EIO only once
    every slave is closed, pty(7)). Closes `gone`."""
    import codecs
    import select

    text = codecs.getincrementaldecoder("utf-8")(errors="replace")
    drained_by: float | None = None
    try:
        while True:
            wait = None if drained_by is None else 0.0
            ready, _, _ = select.select([master, gone] if drained_by is None else [master], [], [], wait)
            if gone in ready:
                # What is left is read, for a second at most: a survivor that goes on writing is
                # after_exit's to judge.
                drained_by = time.monotonic() + 1.0
                continue
            if not ready or (drained_by is not None and time.monotonic() > drained_by):
                break
            try:
                chunk = os.read(master, _CHUNK)
            except OSError:  # EIO: every slave closed
                break
            if not chunk:
                break
            into.add(text.decode(chunk))
        into.add(text.decode(b"", final=True))
    finally:
        os.close(gone)


def settle_fork_hooks() -> None:
    """Import, in this thread and before another thread forks, the modules that register at-fork
    handlers in pairs (os.register_at_fork: a lock taken before a fork, released after it): logging
    and concurrent.futures.thread. A Popen with a preexec_fn runs those handlers; one of the modules
    imported by this thread between another thread's before- and after-fork calls has its `after`
    run alone and releases a lock it never took (RuntimeError: cannot release un-acquired lock,
    printed as "Exception ignored in: <function _releaseLock>"). pytest imports logging, and the
    witness's launches fork beside that import: seen in `run`'s forked witness, whose precondition
    probes (which import these first, conformance/preconditions.py) were handed down, not run."""
    import concurrent.futures.thread  # noqa: F401  # imports logging too


class Background(Generic[T]):
    """fn(*args) on its own thread, started at once; result() waits and returns its value or re-raises
    what it raised. The probes' concurrency (concurrent.futures would import logging, ~4 ms of every
    `probe` start-up). A child started from this thread keeps its parent-death signal for as long as
    run() waits for it, as above."""

    def __init__(self, fn: Callable[..., T], *args: Any, name: str = "sbxc-probe",
                 daemon: bool | None = None) -> None:
        """`daemon`: the interpreter may exit while fn is still running (threading: daemon threads are not
        joined at exit); for work that can block where no timeout reaches, a stat(2) on a dead network
        filesystem, whose caller gives up on it with wait(). None: as the thread that starts it
        (threading.Thread's rule), so what a daemon starts cannot hold the exit either."""
        self._value: T | None = None
        self._error: BaseException | None = None
        # Waited for by this event, never by Thread.join: on Python 3.11 (read in 3.11.7's threading.py) a
        # join interrupted by a signal handler's exception (^C, our Cancelled) releases the thread's state
        # lock and marks the thread stopped while it still runs (_wait_for_tstate_lock, the bpo-45274
        # handling), so every later join or is_alive() says it ended. Measured: the wait after a ^C
        # returned at once and the probe's `finally` never ran.
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._body, args=(fn, args), name=name, daemon=daemon)
        self._thread.start()

    def _body(self, fn: Callable[..., T], args: tuple[Any, ...]) -> None:
        try:
            self._value = fn(*args)
        except BaseException as e:  # handed to whoever asks for the result, in their thread
            self._error = e
        finally:
            self._ended.set()

    def join(self) -> None:
        """Wait for it to end, whatever it ended with."""
        self._ended.wait()

    def done(self) -> bool:
        """It has ended (as concurrent.futures.Future.done says)."""
        return self._ended.is_set()

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for it to end; whether it has."""
        return self._ended.wait(max(0.0, timeout))

    def where(self, depth: int = 3) -> list[str]:
        """Where it is now, innermost frame first ("file:line function"): the evidence for a caller
        that gave up waiting. Empty once it has ended."""
        # From the frames alone: traceback's summaries go through linecache, which stats and reads each
        # frame's source file, and this is asked of a thread stuck in the filesystem.
        frame = sys._current_frames().get(self._thread.ident or -1)
        where: list[str] = []
        while frame is not None and len(where) < depth:
            code = frame.f_code
            where.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}")
            frame = frame.f_back
        return where

    def result(self) -> T:
        self._ended.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class Forked:
    """body() in a forked copy of this process, held as run() holds a command: a session of its own
    (killed as a group), `die_with` as its parent-death signal, tracked for processes/cancel.py and the
    guardian, a timeout in wait(). What a child of ours gains by being forked rather than executed:
    the interpreter and every module this process has imported, ready (runners/native.py Standby).

    Only from a process with one thread (NotForkable otherwise): a lock another thread held at the
    fork would stay held in the child for ever (fork(2): the child has one thread). The child
    forgets its parent's clean-up duties (cancel.forked) and takes up its own; it leaves through
    os._exit, never back into its parent's frames, whatever body() does."""

    def __init__(self, body: Callable[[], int], *, die_with: int = signal.SIGTERM) -> None:
        if threading.active_count() > 1:
            raise NotForkable(f"{threading.active_count()} threads")
        parent = os.getpid()
        set_pdeathsig = _set_pdeathsig()
        for stream in (sys.stdout, sys.stderr):  # or what is buffered would be written twice
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        hold = cancel.deferred().__enter__()  # a stop signal waits until the child is known, as in run()
        try:
            pid = os.fork()
        except BaseException:  # EAGAIN, ENOMEM: no child; the hold goes (or every later signal waits)
            hold.__exit__(*sys.exc_info())
            raise
        if pid == 0:  # pragma: no cover (the child; its effects are what the tests see)
            _child(body, parent, set_pdeathsig, die_with)
        self.pid = pid
        self.started = time.monotonic()
        self.returncode: int | None = None
        self.reaped = False
        cancel.track(pid, signal.SIGTERM)
        try:
            hold.release()
        except BaseException:  # stopped as wait() stops it: nobody else will wait for it
            kills.killpg(pid, signal.SIGTERM, "a forked child stopped: its start was interrupted")
            if not self._reap(STOP_GRACE):
                kill_group(pid)
                self._reap(None)
            cancel.untrack(pid)
            raise

    def wait(self, timeout: float) -> int | None:
        """Its exit code (-N for a signal, as Popen says it), or None: it ran past `timeout` from its
        start and its group was killed. Interrupted (a Cancelled), its group is stopped as run()
        stops a command's (SIGTERM, STOP_GRACE, SIGKILL) before this re-raises."""
        if self.reaped:
            return self.returncode
        try:
            if not self._reap(self.started + timeout - time.monotonic()):
                kill_group(self.pid)
                self._reap(None)
                self.returncode = None  # killed on the timeout, as run() says it
            kill_group(self.pid)  # what it left in its group goes with it, as in run()
            return self.returncode
        except BaseException:
            if not self.reaped:
                kills.killpg(self.pid, signal.SIGTERM, "a forked child stopped: its wait was interrupted")
                if not self._reap(STOP_GRACE):
                    kill_group(self.pid)
                    self._reap(None)
            cancel.stopped_sharing_output()
            raise
        finally:
            cancel.untrack(self.pid)

    def _reap(self, within: float | None) -> bool:
        """Reap it, waiting up to `within` seconds (None: for as long as it takes): True once it is
        reaped, its code in returncode. A pidfd wakes the moment it exits (processes/child_exit.py);
        where there is none, a short poll."""
        if within is not None:
            exited = child_exit.exited(self.pid, within)
            if exited is None:
                deadline = time.monotonic() + within
                while not self._waitpid(os.WNOHANG) and time.monotonic() < deadline:
                    time.sleep(0.01)
                return self.reaped
            if not exited:
                return self._waitpid(os.WNOHANG)
        return self._waitpid(0)

    def _waitpid(self, flags: int) -> bool:
        """One waitpid; the child is recorded reaped the moment it is, so a signal arriving right after
        (a Cancelled) never makes the stop path wait for a child that is gone."""
        if self.reaped:
            return True
        try:
            done, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped, its status lost to an interruption right after
            self.reaped = True
            return True
        if done:
            self.returncode, self.reaped = os.waitstatus_to_exitcode(status), True
        return self.reaped


class NotForkable(RuntimeError):
    pass


def _child(body: Callable[[], int], parent: int, set_pdeathsig: Callable[[int], object], sig: int) -> None:
    code = 1
    try:
        os.setsid()
        set_pdeathsig(sig)
        if os.getppid() != parent:
            os._exit(125)  # the parent died before the signal was set, as in die_with_parent
        cancel.forked()
        code = body()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except cancel.Cancelled as e:  # stopped by a signal: its own clean-up has run; no traceback
        code = e.exit_code
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def _streamed(
    proc: subprocess.Popen[str],
    argv: tuple[str, ...],
    input: str | None,
    timeout: float,
    started: float,
    on_line: Callable[[str], None] | None,
    after_exit: Callable[[int], None] | None,
    master: int | None = None,
) -> Completed:
    """run() with stdout read line by line as it comes (one thread per pipe, so neither can fill up
    and stall the child)."""
    out = _Tail(STDOUT_KEEP)
    err = _Tail(STDERR_KEEP, STDERR_KEEP_LINES)
    failed: list[BaseException] = []

    def feed() -> None:
        if proc.stdin is None:
            return
        with contextlib.suppress(OSError):  # a child that exits without reading: EPIPE
            if input is not None:
                proc.stdin.write(input)
        with contextlib.suppress(OSError):
            proc.stdin.close()

    def read_out() -> None:
        # readline with a limit: a line without end is read in pieces, never whole into memory.
        assert proc.stdout is not None
        line: list[str] = []
        size = 0
        while piece := proc.stdout.readline(_CHUNK):
            out.add(piece)
            if size <= ON_LINE_MAX:
                line.append(piece)
            size += len(piece)
            if not piece.endswith("\n"):
                continue
            if on_line is not None and not failed and size <= ON_LINE_MAX:
                try:
                    on_line("".join(line))
                except BaseException as e:  # re-raised in the caller's thread below
                    failed.append(e)
            line, size = [], 0

    # Written once the leader is gone: wakes the terminal's reader at once (it never blocks on the master).
    leader_gone: tuple[int, int] | None = None

    def read_err() -> None:
        if proc.stderr is not None:
            while chunk := proc.stderr.read(_CHUNK):
                err.add(chunk)
        elif master is not None and leader_gone is not None:
            _read_terminal(master, err, leader_gone[0])

    readers = [threading.Thread(target=f, daemon=True) for f in (read_out, read_err)]
    threads = [threading.Thread(target=feed, daemon=True), *readers]
    try:
        # Inside the try that stops the child: a thread refused (pids.max, RLIMIT_NPROC) or a pipe
        # refused (EMFILE) left it running, forgotten.
        leader_gone = os.pipe() if master is not None else None
        for t in threads:
            t.start()
        timed_out = not child_exit.wait_exit(proc, timeout)
        exited = time.monotonic()
        if timed_out:
            # Our timeout: the launcher's group goes now. What it started outside its group (a setsid
            # daemon, now ours as the subreaper's) is judged and killed by after_exit below, as after
            # a launcher that exited by itself (issue 28: it was left running with ppid 1).
            kill_group(proc.pid, f"our timeout ({timeout:g} s)")
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        # The leader is gone; its output may still be in the pipes. A survivor that holds them keeps
        # the readers waiting: bounded, then after_exit sees (and kills) it.
        if leader_gone is not None:
            os.write(leader_gone[1], b"!")
        for t in readers:
            t.join(timeout=1.0)
        if after_exit is not None:
            after_exit(proc.pid)
    except BaseException:
        stop(proc)
        raise
    finally:
        kill_group(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if leader_gone is not None:
            os.close(leader_gone[1])  # the read end is the reader's to close
    for t in threads:
        t.join(timeout=5)
    if failed:
        raise failed[0]
    return Completed(
        argv,
        None if timed_out else proc.returncode,
        out.text(),
        err.text(),
        time.monotonic() - started,
        timed_out=timed_out,
        pid=proc.pid,
        started=started,
        exited=exited,
    )
