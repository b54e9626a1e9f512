"""The task's io_uring way to a unix socket (conformance/inside.py uring_unix_connect): a socket made and
connected by IORING_OP_SOCKET and IORING_OP_CONNECT, which a seccomp filter on socket(2) and
connect(2) does not see."""

from __future__ import annotations

import os
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



def test_io_uring_reaches_a_socket_past_sun_paths_length(tmp_path: Path) -> None:
    # sun_path holds 108 bytes (unix(7)): a socket deeper than that is still a way out, and the plain
    # syscall path reaches it through /proc/self/fd (inside._connect_long); io_uring must too.
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / "s")
    assert len(path.encode()) > 108
    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(deep, os.O_PATH | os.O_DIRECTORY)
    try:
        stream.bind(f"/proc/self/fd/{fd}/s")  # bind(2) has the same limit
        stream.listen(1)
        want = {"ok": True, "errno": None, "via": "io_uring", "type": "stream"}
        assert inside.uring_unix_connect(path) == want
        stream.settimeout(5)
        stream.accept()[0].close()
        assert inside.uring_unix_connect(str(deep / "none"))["errno"] == "ENOENT"
        refused = {"ok": False, "errno": "ENOENT", "stage": "path"}
        assert inside.uring_unix_connect(str(deep / "x" / "s")) == refused
    finally:
        os.close(fd)
        stream.close()
