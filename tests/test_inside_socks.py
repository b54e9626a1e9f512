"""The task asks a SOCKS5 proxy (RFC 1928, with RFC 1929 username/password) to tunnel, as it asks an
HTTP proxy (conformance/inside.py socks5_tunnel): an agent sandbox's SOCKS side is a way out of its own.
Against a small SOCKS5 server here that lets one name through and refuses the rest."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from sandbox_conformance.conformance import inside


def _serve_echo(srv: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn, _ = srv.accept()
        with conn:
            conn.sendall(conn.recv(1024))


@contextlib.contextmanager
def socks_server(allowed: str, echo_port: int, user: str | None = None) -> Iterator[tuple[int, list[str]]]:
    srv = socket.create_server(("127.0.0.1", 0))
    asked: list[str] = []

    def one(conn: socket.socket) -> None:
        with conn:
            _, n = conn.recv(2)
            methods = conn.recv(n)
            want = 2 if user is not None else 0
            if want not in methods:
                conn.sendall(b"\x05\xff")
                return
            conn.sendall(bytes([5, want]))
            if want == 2:
                _, ulen = conn.recv(2)
                u = conn.recv(ulen).decode()
                (plen,) = conn.recv(1)
                conn.recv(plen)
                conn.sendall(b"\x01\x00" if u == user else b"\x01\x01")
                if u != user:
                    return
            atyp = conn.recv(4)[3]
            host = conn.recv(conn.recv(1)[0]).decode() if atyp == 3 else socket.inet_ntoa(conn.recv(4))
            (port,) = struct.unpack(">H", conn.recv(2))
            asked.append(f"{host}:{port}")
            ok = host == allowed
            bound = socket.inet_aton("127.0.0.1") + struct.pack(">H", 0)
            conn.sendall(bytes([5, 0 if ok else 2, 0, 1]) + bound)
            if ok:
                with socket.create_connection(("127.0.0.1", echo_port), timeout=5) as up:
                    up.sendall(conn.recv(1024))
                    conn.sendall(up.recv(1024))

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield srv.getsockname()[1], asked
    finally:
        srv.close()


def test_a_socks5_proxy_is_asked_to_tunnel_and_its_answer_read() -> None:
    echo = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_serve_echo, args=(echo,), daemon=True).start()
    try:
        with socks_server("example.test", echo.getsockname()[1]) as (port, asked):
            proxy = {"host": "127.0.0.1", "port": port, "user": None, "password": ""}
            listed = inside.socks5_tunnel(proxy, {"host": "example.test", "port": 443, "echo": True}, "n0nce")
            assert listed == {"status": "SOCKS5 reply 0", "established": True, "echoed": True}
            for host in ("127.0.0.1", "unlisted.test"):
                refused = inside.socks5_tunnel(proxy, {"host": host, "port": 22}, "n0nce")
                assert refused == {"status": "SOCKS5 reply 2", "established": False, "echoed": None}
            assert asked == ["example.test:443", "127.0.0.1:22", "unlisted.test:22"]
    finally:
        echo.close()


def test_a_socks5_proxy_with_a_password_is_asked_with_it() -> None:
    with socks_server("example.test", 9, user="agent") as (port, asked):
        proxy = {"host": "127.0.0.1", "port": port, "user": "agent", "password": "pw"}
        got = inside.socks5_tunnel(proxy, {"host": "vm", "port": 80}, "n")
        assert got["established"] is False and asked == ["vm:80"]
        wrong = inside.socks5_tunnel({**proxy, "user": "other"}, {"host": "vm", "port": 80}, "n")
        assert wrong == {"status": "SOCKS5 authentication refused", "established": False, "echoed": None}
        none = inside.socks5_tunnel({**proxy, "user": None}, {"host": "vm", "port": 80}, "n")
        assert none["status"].startswith("SOCKS5 greeting refused")


def _proxy_task(*offered: dict[str, object]) -> object:
    from sandbox_conformance.conformance import plan

    proxy_plan = {"targets": [{"kind": "unlisted", "host": "unlisted.test", "port": 443}]}
    the_plan = SimpleNamespace(proxy=proxy_plan)
    doc = {"proxies": {"offered": list(offered), "direct": []}}
    return plan.Task(doc=doc, plan=the_plan, values={}, host=None,  # type: ignore[arg-type]
                     host_after={}, launcher="x")


HTTP_REFUSED = {"proxy": "http://localhost:3128", "scheme": "http", "connect": {"ok": True}, "tunnels": [
    {"kind": "unlisted", "host": "unlisted.test", "port": 443,
     "result": {"status": "HTTP/1.1 403", "established": False, "echoed": None}}]}


def refuses(task: object) -> None:
    from sandbox_conformance.conformance.witnesses import network

    network.test_the_proxy_refuses_unlisted_names_loopback_and_the_hosts_addresses(task)  # type: ignore[arg-type]


def test_a_proxy_the_task_could_not_try_is_no_refusal() -> None:
    tls = {"proxy": "https://localhost:8443", "scheme": "https", "connect": {"ok": True}, "tunnels": []}
    with pytest.raises(AssertionError, match="could connect to but not try"):
        refuses(_proxy_task(HTTP_REFUSED, tls))
    gone = {**tls, "connect": {"ok": False, "errno": "ECONNREFUSED"}}  # nothing there: no way out
    refuses(_proxy_task(HTTP_REFUSED, gone))


def test_a_socks_proxy_that_tunnels_an_unlisted_name_is_red_beside_an_http_one_that_refuses() -> None:
    socks = {"proxy": "socks5h://localhost:1080", "scheme": "socks5h", "connect": {"ok": True}, "tunnels": [
        {"kind": "unlisted", "host": "unlisted.test", "port": 443,
         "result": {"status": "SOCKS5 reply 0", "established": True, "echoed": None}}]}
    with pytest.raises(AssertionError, match="socks5h://localhost:1080"):
        refuses(_proxy_task(HTTP_REFUSED, socks))
