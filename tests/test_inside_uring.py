"""The task's io_uring way to a unix socket (conformance/inside.py uring_unix_connect): a socket made and
connected by IORING_OP_SOCKET and IORING_OP_CONNECT, which a seccomp filter on socket(2) and
connect(2) does not see."""

from __future__ import annotations

import socket
from pathlib import Path

from sandbox_conformance.conformance import inside


def test_io_uring_connects_to_a_stream_and_a_datagram_socket_and_names_what_refused(tmp_path: Path) -> None:
    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        stream.bind(str(tmp_path / "s"))
        stream.listen(1)
        dgram.bind(str(tmp_path / "d"))
        want = {"ok": True, "errno": None, "via": "io_uring", "type": "stream"}
        assert inside.uring_unix_connect(str(tmp_path / "s")) == want
        stream.settimeout(5)
        stream.accept()[0].close()  # the connection the kernel made is really there
        assert inside.uring_unix_connect(str(tmp_path / "d"))["type"] == "dgram"
        missing = inside.uring_unix_connect(str(tmp_path / "none"))
        assert missing == {"ok": False, "errno": "ENOENT", "stage": "io_uring connect"}
    finally:
        stream.close()
        dgram.close()
