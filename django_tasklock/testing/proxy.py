"""A TCP proxy that fails on purpose, for tests of what a lost reply does.

A storage call whose reply is lost may be sent again (by the backend, or by
the client library's own retries) after the storage already acted on it. To
prove a backend safe against that, put :class:`FaultProxy` between the client
and the server (PostgreSQL, MariaDB, Redis: anything that speaks TCP) and
arm a fault:

* :meth:`FaultProxy.drop_reply`: let a request through, then close the
  connection when the server's reply arrives, before the client reads it
  ("reply lost after the storage acted");
* :meth:`FaultProxy.delay`: hold a request back for a while;
* :meth:`FaultProxy.hold`: hold a request back until the test lets it go, for
  a request that arrives late: after the client gave up on it (its socket
  timeout), sent it again on a new connection and went on;
* :meth:`FaultProxy.blackhole`: forward nothing more either way, leaving the
  connections open (a network that stopped answering), until :meth:`heal`.

Example, with a redis-py client that retries a command whose connection
broke (``redis.Redis(...)`` does, 10 times by default in redis-py 8)::

    with FaultProxy(("127.0.0.1", 6379)) as proxy:
        client = redis.Redis(host=proxy.host, port=proxy.port, db=15)
        backend = RedisBackend(client=client)
        proxy.drop_reply(match=b"task-lock:report")  # the acquisition's request
        token, ttl = new_token(), timedelta(seconds=30)
        assert backend.acquire("report", token, ttl=ttl, max_lifetime=ttl)
        assert proxy.dropped == 1  # it ran twice; the second found its own lease

Requests are matched by a byte string they contain (or a predicate), read
from the client as they arrive: a request of a few kilobytes arrives in one
read on loopback. The proxy listens on loopback only, serves at most
``max_connections`` at a time and stops by itself after ``lifetime`` seconds
(or on leaving the ``with`` block). Threads, not asyncio, so that it works
beside any test runner. For tests only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType

Match = bytes | Callable[[bytes], bool] | None

_POLL = 0.1  # seconds between looks at the stop flag while a socket is idle
_CHUNK = 65536
_LATE_ANSWER = 10.0  # seconds a held request's connection waits for the server's answer


@dataclasses.dataclass
class _Rule:
    kind: str  # "drop_reply" or "delay"
    match: Match
    times: int | None  # None: every match
    probability: float = 1.0
    seconds: float = 0.0
    until: threading.Event | None = None  # a delay that ends when this is set

    def matches(self, data: bytes) -> bool:
        if self.match is None:
            return True
        if isinstance(self.match, bytes):
            return self.match in data
        return self.match(data)


class _Pipe:
    """One client connection and its connection to the server."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.drop_next_reply = False
        self.blackholed = False
        #: A held request went out on this pipe; its answer is awaited.
        self.late = False
        self.closed = threading.Event()

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class FaultProxy:
    """Forwards loopback TCP connections to ``upstream`` (host, port), failing as armed.

    Counters: :attr:`dropped` (replies withheld), :attr:`delayed` (held
    back, by :meth:`delay` or :meth:`hold`), :attr:`delivered` (requests
    :meth:`hold` held that the server has since taken), :attr:`connections`
    (accepted so far).
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        lifetime: float = 300.0,
        max_connections: int = 64,
        seed: int | None = None,
    ) -> None:
        self.upstream = upstream
        self.lifetime = lifetime
        self.max_connections = max_connections
        self.dropped = 0
        self.delayed = 0
        self.delivered = 0
        self.connections = 0
        self._random = random.Random(seed)
        self._rules: list[_Rule] = []
        self._pipes: set[_Pipe] = set()
        self._blackholed = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(_POLL)
        self.host, self.port = "127.0.0.1", self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="fault-proxy", daemon=True)

    # -- running -------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listener and every connection; idempotent."""
        self._stop.set()
        with self._lock:
            pipes = list(self._pipes)
        for pipe in pipes:
            pipe.close()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(5)
        self._listener.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- faults --------------------------------------------------------------

    def drop_reply(
        self, match: Match = None, *, times: int | None = 1, probability: float = 1.0
    ) -> None:
        """Forward the next ``times`` matching requests (each with ``probability``),
        then close their connection when the reply comes, unread. ``times=None``: every one."""
        self._add(_Rule("drop_reply", match, times, probability))

    def delay(self, seconds: float, match: Match = None, *, times: int | None = 1) -> None:
        """Hold the next ``times`` matching requests back ``seconds`` before forwarding them."""
        self._add(_Rule("delay", match, times, seconds=seconds))

    def hold(self, match: Match = None) -> threading.Event:
        """Hold the next matching request back until the event returned is set, then forward it.

        The moment is the test's, not a time's: a client whose socket timeout
        passes meanwhile gives the request up, closes its connection and may
        send it again on a new one (which passes: the fault is armed once);
        set the event once that has happened and the copy may arrive late.
        Its connection then stays open towards the server until the server
        answers the request or closes (it has read it either way):
        :attr:`delivered` counts the requests held so that the server took.
        """
        until = threading.Event()
        self._add(_Rule("delay", match, 1, until=until))
        return until

    def blackhole(self) -> None:
        """From now on forward nothing, either way, on any connection; keep them open."""
        self._blackholed = True

    def heal(self) -> None:
        """Forget every armed fault; new connections work again (black-holed ones stay silent)."""
        with self._lock:
            self._rules.clear()
        self._blackholed = False

    def _add(self, rule: _Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def _fault_for(self, data: bytes) -> _Rule | None:
        with self._lock:
            for rule in self._rules:
                if not rule.matches(data):
                    continue
                if rule.probability < 1.0 and self._random.random() >= rule.probability:
                    return None
                if rule.times is not None:
                    rule.times -= 1
                    if rule.times <= 0:
                        self._rules.remove(rule)
                return rule
        return None

    # -- forwarding ----------------------------------------------------------

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                if time.monotonic() - self._started > self.lifetime:
                    break
                try:
                    client, _ = self._listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    break
                with self._lock:
                    full = len(self._pipes) >= self.max_connections
                if full:
                    client.close()
                    continue
                try:
                    server = socket.create_connection(self.upstream, timeout=5)
                except OSError:
                    client.close()
                    continue
                for sock in (client, server):  # forward each write as it comes
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                pipe = _Pipe(client, server)
                with self._lock:
                    self._pipes.add(pipe)
                    self.connections += 1
                for args in ((pipe, True), (pipe, False)):
                    threading.Thread(target=self._pump, args=args, daemon=True).start()
        finally:
            self._stop.set()
            self._listener.close()
            with self._lock:
                pipes = list(self._pipes)
            for pipe in pipes:
                pipe.close()

    def _pump(self, pipe: _Pipe, upstream: bool) -> None:
        source, sink = (pipe.client, pipe.server) if upstream else (pipe.server, pipe.client)
        try:
            source.settimeout(_POLL)  # an OSError if the pipe was closed before we started
            while not self._stop.is_set() and not pipe.closed.is_set():
                try:
                    data = source.recv(_CHUNK)
                except TimeoutError:
                    continue
                if not upstream and pipe.late:
                    pipe.late = False  # its answer, or the server's close: it was read
                    with self._lock:
                        self.delivered += 1
                if not data:
                    break
                if self._blackholed or pipe.blackholed:
                    pipe.blackholed = True
                    continue
                if upstream:
                    rule = self._fault_for(data)
                    if rule is not None and rule.kind == "delay":
                        with self._lock:
                            self.delayed += 1
                        if not self._held(rule):
                            break
                        if rule.until is not None:
                            pipe.late = True
                    elif rule is not None and rule.kind == "drop_reply":
                        pipe.drop_next_reply = True
                elif pipe.drop_next_reply:
                    with self._lock:
                        self.dropped += 1
                    break  # the server acted and answered; the client never hears it
                sink.sendall(data)
        except OSError:
            pass
        finally:
            if upstream and pipe.late:
                # The client is gone (or went quiet) after a held request went out:
                # only our writing half closes, so that the server's answer (or its
                # close) still comes back and says it read the request.
                with contextlib.suppress(OSError):
                    pipe.server.shutdown(socket.SHUT_WR)
                pipe.closed.wait(_LATE_ANSWER)
            pipe.close()
            with self._lock:
                self._pipes.discard(pipe)

    def _held(self, rule: _Rule) -> bool:
        """Wait as the delay ``rule`` says; False if the proxy stopped meanwhile."""
        if rule.until is None:
            return not self._stop.wait(rule.seconds)
        while not rule.until.wait(_POLL):
            if self._stop.is_set():
                return False
        return True
