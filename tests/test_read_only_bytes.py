"""A read-only path's content is compared as the task reads it: 4096 bytes, not 4096 characters of
text with newlines translated. A CRLF file, or more than 4096 bytes of multibyte UTF-8, was BROKEN on a
sandbox that keeps it (issue 28; on stock Debian `read_only = ["/usr/share/doc/adduser"]`)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from witness_cli import witness


@pytest.fixture
def host_dir() -> Iterator[Path]:
    # Not under /tmp: the reference sandbox gives its task a /tmp of its own.
    d = Path(tempfile.mkdtemp(prefix="sbxc-ro-bytes-", dir="/var/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_crlf_and_long_multibyte_files_read_the_same_inside(bwrap_path: str, host_dir: Path) -> None:
    (host_dir / "crlf.txt").write_bytes(b"line one\r\nline two\r\n")
    # 3000 two-byte characters: byte 4096 splits one, and 4096 characters would be past the end.
    (host_dir / "utf8.txt").write_text("é" * 3000, encoding="utf-8")
    prof = host_dir / "p.toml"
    prof.write_text('[profile]\nname = "ro-bytes"\n[filesystem]\n'
                    f'read_only = ["{host_dir}/crlf.txt", "{host_dir}/utf8.txt"]\n'
                    # No environment allowlist: the reference bwrap passes the launcher's environment.
                    '[promises]\nnot_claimed = { secrets = "no environment allowlist" }\n')
    done = witness("--profile", str(prof), timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    for name in ("crlf.txt", "utf8.txt"):
        assert f"read_only {host_dir}/{name}: kept" in done.stdout, done.stdout


@pytest.mark.parametrize("content", [b"a\r\nb\r\n", ("\u00e9" * 3000).encode(), b"\r" * 10 + b"x"])
def test_the_hidden_witness_reads_the_host_as_the_task_reads_its_copy(tmp_path: Path, content: bytes) -> None:
    # The hidden witness finds a leak by equality of what the task read with the host's file: read as
    # text, a CRLF file or 4096 bytes of two-byte characters never compared equal, and a sandbox
    # showing the host's content there was judged kept.
    from sandbox_conformance.conformance import inside
    from sandbox_conformance.conformance.witnesses import paths

    f = tmp_path / "f"
    f.write_bytes(content)
    assert paths._host_text(str(f)) == inside.do_read(str(f))
