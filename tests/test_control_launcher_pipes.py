"""The control launcher's report pipe: a child that fails before it reports costs no minute."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sandbox_conformance.conformance.control_launchers import reference


def _child(write: int, line: bytes) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        if line:
            os.write(write, line)
        os._exit(0)
    return pid


def test_a_writer_that_ends_without_its_line_ends_the_wait_though_we_hold_the_write_end() -> None:
    # The launcher holds the pipe's write end itself (it forks more writers later), so no EOF comes
    # when the child fails: before, this waited EXEC_LATE_WAIT (60 s).
    read, write = os.pipe()
    try:
        for line, want in ((b"", b""), (b"1234\n", b"1234")):
            pid = _child(write, line)
            began = time.monotonic()
            assert reference._read_line(read, pid) == want
            assert time.monotonic() - began < reference.EXEC_LATE_WAIT / 4
            if not line:
                assert reference._exited(pid)
            assert os.waitpid(pid, 0)[0] == pid  # left to us to reap (WNOWAIT)
    finally:
        os.close(read)
        os.close(write)


@pytest.mark.parametrize("text", [b"not json", b"[1, 2]", b"\xff\xfe", None])
def test_a_spec_that_is_no_task_spec_is_a_one_line_harness_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        text: bytes | None) -> None:
    from sandbox_conformance.conformance.launch import SPEC_ENV

    spec = tmp_path / "spec.json"
    if text is not None:
        spec.write_bytes(text)
    monkeypatch.setenv(SPEC_ENV, str(spec))
    assert reference.main(["--", "true"]) == reference.EX_SOFTWARE
    err = capsys.readouterr().err
    assert err.startswith(f"control launcher: ${SPEC_ENV} {spec}: not a task spec"), err
    assert err.count("\n") == 1 and "Traceback" not in err
