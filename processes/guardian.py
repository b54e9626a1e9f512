"""The guardian: a small process that outlives its owner (a `sandbox-conformance` command) and undoes
what the owner left running when it dies without its own clean-up, that is, by SIGKILL.

    python3 -I -S processes/guardian.py OWNER_PID      # stdin: the owner's end of a pipe

It reads one JSON line per registration from stdin, which only its owner and `run`'s forked
witness can write (processes/cancel.py):
    {"key": 3, "group": 4242, "signal": 15}              a process group the owner started
    {"key": 4, "cgroup": "/sys/fs/cgroup/.../task-..."}  a cgroup leaf the owner made
    {"key": 5, "argv": [...], "env": {...}, "timeout": 60} a command that undoes something (docker rm)
    {"done": 3}                                          the owner undid it itself
    {"part": 4243, "text": "...", "end": 1}              pieces of one registration over PIPE_BUF,
                                                         by writer (cancel.py guardian_lines)
EOF on stdin means the owner is gone, however it went (the kernel closes a dead process's pipes). The
owner's own path ends with nothing registered, so then the guardian just exits. Otherwise it stops
every group still registered (its stop signal, then SIGKILL after GRACE seconds), kills and removes
every cgroup leaf, runs every command, says so on stderr, and exits.

It runs in a session of its own (a group kill aimed at the owner's children never reaches it), gets
no parent-death signal, and is stdlib-only under `-I -S`: it must start in milliseconds and import
nothing a broken venv could break. Every `witness` and `run` starts one (`run`'s forked witness
shares its parent's: processes/cancel.py forked) while its own start-up, probes and first launch want
the CPU, so at start it imports only `_signal` (for SIG_IGN: `signal` would bring enum); json's C
half (`_json`: the package would bring re, ~9 ms of CPU in all) when the first line comes;
subprocess only when a command must run; never pathlib or contextlib (~10 and ~4.5 ms under -I -S),
hence try/except where `suppress` would read better.

A process group is identified by its number: the kernel does not reuse a pid while a process group
of that number has members, and the owner forgets a group seconds after it has reaped its leader
(once what the leader left is judged), before the cyclic pid allocation could come round to it
again: the guardian signals either that group or, in practice, nothing (docs/cancellation.md)."""

from __future__ import annotations

import errno
import os
import sys
import time

TYPE_CHECKING = False  # mypy takes it as true; at run time `typing` (~3 ms) is never imported
if TYPE_CHECKING:
    import signal
    from typing import Any
else:
    # signal's C half, built into the interpreter: the same functions and the constants as plain ints,
    # without the Python half's enum (~4.5 ms of CPU of this process's start, measured with perf stat).
    import _signal as signal

GRACE = 5.0  # seconds between a group's stop signal and SIGKILL
PROG = "sandbox-conformance guardian"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal(pgid: int, sig: int) -> None:
    try:  # noqa: SIM105 - not contextlib.suppress: see the docstring
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_groups(groups: dict[int, int], grace: float = GRACE) -> list[str]:
    done = []
    for pgid, sig in groups.items():
        if _group_alive(pgid):
            _signal(pgid, sig)
            done.append(f"stopped process group {pgid}")
    deadline = time.monotonic() + grace
    while any(_group_alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pgid in groups:
        if _group_alive(pgid):
            _signal(pgid, signal.SIGKILL)
            done.append(f"killed process group {pgid}")
    return done


def remove_cgroup(path: str, timeout: float = 10.0) -> str:
    """cgroup.kill, then rmdir bottom-up (processes/owner.py remove_cgroup: duplicated here, this file
    imports nothing of ours)."""
    if not os.path.isdir(path):
        return ""
    try:
        # No O_CREAT: on cgroupfs the file is there (Linux >= 5.14) or cannot be made; in any other
        # directory a stray cgroup.kill would only make the rmdir below fail.
        fd = os.open(os.path.join(path, "cgroup.kill"), os.O_WRONLY)
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)
    except OSError:
        pass
    deadline = time.monotonic() + timeout
    # Children before parents (cgroupfs removes only a directory with no children): os.walk
    # bottom-up gives every directory after all of its own.
    dirs = [d for d, _, _ in os.walk(path, topdown=False)]
    while True:
        pids = []
        for d in dirs:
            try:
                with open(os.path.join(d, "cgroup.procs"), "rb") as f:
                    pids += [int(x) for x in f.read().split()]
            except OSError:
                pass
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:
            try:  # noqa: SIM105 - not contextlib.suppress: see the docstring
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)
    for d in dirs:
        while True:
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    return f"could not remove cgroup {d}: {errno.errorcode.get(e.errno or 0, e.errno)}"
                time.sleep(0.02)
    return f"removed cgroup {path}"


def run_command(argv: list[str], env: dict[str, str] | None, timeout: float) -> str:
    import subprocess  # only once the owner is dead and left a command to run: ~11 ms at every start

    try:
        done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout, check=False, start_new_session=True)
    except subprocess.TimeoutExpired:
        return f"ran {' '.join(argv)}: timed out after {timeout:.0f} s"
    except OSError as e:
        return f"could not run {argv[0]}: {e.strerror}"
    return f"ran {' '.join(argv)}: exit {done.returncode}"


def undo(entries: dict[int, dict[str, Any]]) -> list[str]:
    """Everything still registered, newest first within each kind: processes, then cgroups, then
    commands (a container is removed once nothing of ours still talks to it)."""
    ordered = [entries[k] for k in sorted(entries, reverse=True)]
    groups = {int(e["group"]): int(e.get("signal", signal.SIGKILL)) for e in ordered if "group" in e}
    said = stop_groups(groups)
    for e in ordered:
        if "cgroup" in e:
            said.append(remove_cgroup(str(e["cgroup"])))
    for e in ordered:
        if "argv" in e:
            said.append(run_command(list(e["argv"]), e.get("env"), float(e.get("timeout", 60))))
    return [s for s in said if s]


def _scanner() -> Any:
    """json.loads's C scanner (conformance/inside.py _json_codec: the same, for the same reason): it
    returns a document and where it ended, or raises StopIteration or ValueError."""
    import _json

    class Context:  # what json.decoder.JSONDecoder hands the C scanner
        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = float

    return _json.make_scanner(Context())  # type: ignore[arg-type]  # typeshed: the context is a scanner


def _document(scan: Any, line: bytes) -> dict[str, Any] | None:
    try:
        text = line.decode().strip()
        msg, end = scan(text, 0)
    except (StopIteration, ValueError):  # not a document (a malformed one: JSONDecodeError)
        return None
    return msg if end == len(text) and isinstance(msg, dict) else None


def main(argv: list[str]) -> int:
    owner = argv[1] if len(argv) > 1 else "?"
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
        # A terminal's ^C reaches the owner's process group, not us; but a stray SIGTERM or SIGHUP
        # (a logout, `kill -- -SID`) must not take the guardian before its owner: the owner's own
        # stop path closes our stdin, which is how we end.
        signal.signal(sig, signal.SIG_IGN)
    entries: dict[int, dict[str, Any]] = {}
    parts: dict[int, str] = {}  # a long registration's text so far, by writer
    scan = None
    for line in sys.stdin.buffer:
        if scan is None:  # here, not at start: the first line comes once the owner starts something
            scan = _scanner()
        msg = _document(scan, line)
        if msg is not None and isinstance(msg.get("part"), int):  # a piece of a long one (cancel.py)
            writer = msg["part"]
            text = parts.get(writer, "") + str(msg.get("text", ""))
            if not msg.get("end"):
                parts[writer] = text
                continue
            parts.pop(writer, None)
            msg = _document(scan, text.encode())
        if msg is None:
            continue
        if "done" in msg:
            entries.pop(int(msg["done"]), None)
        elif "key" in msg:
            entries[int(msg["key"])] = msg
    if not entries:
        return 0
    said = undo(entries)
    try:
        for s in said:
            print(f"{PROG}: pid {owner} is gone: {s}", file=sys.stderr, flush=True)
    except OSError:
        pass  # nobody reads our stderr any more: the undoing is done all the same
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    # Its owner waits for it to go (processes/cancel.py close): out at once, without the interpreter's
    # teardown of every module (a few ms of every command's end). Nothing is buffered but stderr.
    try:  # noqa: SIM105 - not contextlib.suppress: see the docstring
        sys.stderr.flush()
    except OSError:
        pass  # nobody reads it any more (main says the same)
    os._exit(code)
