"""The fault proxy itself (``django_tasklock.testing.proxy``), against a local echo server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from django_tasklock.testing.proxy import FaultProxy
from django_tasklock.testing.support import wait_until


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A server that answers each read with the same bytes."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()
    stop.set()
    thread.join(2)
    server.close()


def ask(proxy: FaultProxy, data: bytes, timeout: float = 2.0) -> bytes:
    with socket.create_connection((proxy.host, proxy.port), timeout=timeout) as conn:
        conn.sendall(data)
        return conn.recv(4096)


def test_forwards_and_drops_the_reply_of_a_matching_request_once(
    echo: tuple[str, int],
) -> None:
    with FaultProxy(echo) as proxy:
        assert ask(proxy, b"hello") == b"hello"
        proxy.drop_reply(match=b"DELETE")
        assert ask(proxy, b"SELECT 1") == b"SELECT 1"
        assert ask(proxy, b"DELETE 1") == b"", "the reply reached the client"
        assert proxy.dropped == 1
        assert ask(proxy, b"DELETE 2") == b"DELETE 2", "armed once, dropped twice"


def test_delays_a_matching_request(echo: tuple[str, int]) -> None:
    with FaultProxy(echo) as proxy:
        proxy.delay(0.5, match=lambda data: data.startswith(b"slow"))
        started = time.monotonic()
        assert ask(proxy, b"slow one") == b"slow one"
        assert time.monotonic() - started >= 0.5
        assert proxy.delayed == 1


def test_holds_a_request_until_let_go_and_counts_it_delivered_once_answered(
    echo: tuple[str, int],
) -> None:
    with FaultProxy(echo) as proxy:
        let_go = proxy.hold(match=b"late")
        with socket.create_connection((proxy.host, proxy.port), timeout=0.3) as conn:
            conn.sendall(b"late one")
            with pytest.raises(TimeoutError):
                conn.recv(4096)  # the client gives up on it and closes
        assert ask(proxy, b"late again") == b"late again", "armed once, held twice"
        assert (proxy.delayed, proxy.delivered) == (1, 0)
        let_go.set()
        # Forwarded after its client left, and answered by the server all the same.
        wait_until(lambda: proxy.delivered == 1, timeout=10)
        assert ask(proxy, b"after") == b"after"


def test_black_holes_until_healed_and_stops_by_itself(echo: tuple[str, int]) -> None:
    with FaultProxy(echo, lifetime=2.0) as proxy:
        proxy.blackhole()
        with pytest.raises(TimeoutError):
            ask(proxy, b"anyone?", timeout=0.5)
        proxy.heal()
        assert ask(proxy, b"back") == b"back"
        time.sleep(2.5)  # past its lifetime: closed
        with pytest.raises(ConnectionRefusedError):
            ask(proxy, b"late", timeout=0.5)


def test_a_connection_closed_before_its_pump_starts_ends_quietly(echo: tuple[str, int]) -> None:
    # Stopping the proxy just after it accepted a connection closes the
    # sockets before the forwarding threads run: each must end, not raise
    # (an unhandled OSError in a thread, an error under filterwarnings).
    from django_tasklock.testing.proxy import _Pipe

    proxy = FaultProxy(echo)
    client, server = socket.socketpair()
    pipe = _Pipe(client, server)
    pipe.close()
    proxy._pump(pipe, True)
    proxy._pump(pipe, False)
    proxy.stop()
