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


def test_the_process_listing_includes_the_pids_looked_for_past_its_first_300(monkeypatch) -> None:
    # A host with more than 300 processes below the harness's pid: the pid witness's evidence (is the
    # harness listed?) must not depend on that.
    me = os.getpid()
    real = os.listdir

    def many(path: str) -> list[str]:
        if path != "/proc":
            return real(path)
        return [*(str(n) for n in range(1, 600) if n != me), str(me), "self"]

    monkeypatch.setattr(inside.os, "listdir", many)
    assert me > 600, "this test needs a pid past the fake ones"
    listed = {p["pid"]: p for p in inside.processes([me])}
    assert me in listed and listed[me].get("cmdline"), listed.get(me)
    assert me not in {p["pid"] for p in inside.processes()}
