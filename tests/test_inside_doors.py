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
