"""The syscall doors the task tries (conformance/inside.py doors), where the answer is the kernel's
and not a sandbox's: such a door is absent, never a refusal the sandbox gets credit for."""

from __future__ import annotations

import os
import pty

from sandbox_conformance.conformance import inside


def test_tioclinux_on_a_pseudo_terminal_is_absent_not_refused() -> None:
    # Only a virtual console has TIOCLINUX; the terminal launch's is a pty, which answers ENOTTY with
    # no sandbox at all.
    master, slave = pty.openpty()
    saved = os.dup(0)
    try:
        os.dup2(slave, 0)
        got = inside.door_tioclinux()
    finally:
        os.dup2(saved, 0)
        for fd in (saved, master, slave):
            os.close(fd)
    assert got["absent"] is True and got["errno"] == "ENOTTY", got


def test_the_process_listing_includes_the_pids_looked_for_past_its_limit(monkeypatch) -> None:
    # A host with more processes below the harness's pid than the listing holds: the pid witness's
    # evidence (is the harness listed?) must not depend on that. Pids start again at 300 when they wrap
    # (kernel/pid.c RESERVED_PIDS), so ours is always past 1-20.
    me = os.getpid()
    real = os.listdir

    def many(path: str) -> list[str]:
        if path != "/proc":
            return real(path)
        return [*(str(n) for n in range(1, 21)), str(me), "self"]

    monkeypatch.setattr(inside.os, "listdir", many)
    monkeypatch.setattr(inside, "PROCESS_LIMIT", 5)
    listed = {p["pid"]: p for p in inside.processes([me])}
    assert me in listed and listed[me].get("cmdline"), listed.get(me)
    assert len(listed) == 6
    assert me not in {p["pid"] for p in inside.processes()}


def test_a_ptrace_refused_under_yama_scope_2_is_absent_not_a_refusal(monkeypatch) -> None:
    # Yama's scope 2 refuses every attach without CAP_SYS_PTRACE, sandbox or none: not the sandbox's.
    real = inside.read_text
    for scope, absent in (("2", True), ("3", True), ("1", False)):
        monkeypatch.setattr(inside, "read_text", lambda path, limit=4096, scope=scope: scope + "\n"
                            if path == "/proc/sys/kernel/yama/ptrace_scope" else real(path, limit))
        # A pid past PID_MAX_LIMIT (2^22): the attach fails, and its errno is read as Yama's EPERM.
        monkeypatch.setattr(inside, "_errno", lambda: "EPERM")
        got = inside.door_ptrace(2 ** 22 + 1, [])
        assert got.get("absent", False) is absent, (scope, got)
