"""Private servers for fault tests: started on free loopback ports, owned by one test.

The shared services (``tests/support/services.py``) must never be stopped or paused:
other tests use them. A test that restarts PostgreSQL, pauses Redis, fails over
a Redis master or talks through PgBouncer gets servers of its own here, made
from the same Debian binaries, and they stop when the test ends.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.services import IN_CI

PG_BIN = Path("/usr/lib/postgresql")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def require_binary(path: str | None, what: str) -> str:
    if path is None or not os.path.exists(path):
        message = f"{what} is not installed (Debian package); .ci/run installs it"
        if IN_CI:
            raise RuntimeError(f"CI=true and {message}")
        pytest.skip(message)
    return path


def _pg_bin(tool: str) -> str:
    versions = sorted(PG_BIN.glob("*/bin"), reverse=True) if PG_BIN.exists() else []
    return require_binary(str(versions[0] / tool) if versions else None, "PostgreSQL server")


def _as_postgres() -> Callable[[], None] | None:
    """Run a child as the ``postgres`` user when we are root (initdb refuses root)."""
    if os.geteuid() != 0:
        return None
    user = pwd.getpwnam("postgres")

    def demote() -> None:
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    return demote


def faketime_library() -> str:
    """libfaketime (Debian package ``faketime``), for a server whose clock a test moves."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    return require_binary(str(found[0]) if found else None, "faketime (libfaketime)")


class PrivatePostgres:
    """A throwaway PostgreSQL cluster (trust auth) that a test may stop and start.

    With ``clock_offset``, the server runs under libfaketime and reads its clock
    offset from a file at every call: :meth:`step_clock` moves the server's
    clock (and only its wall clock: its monotonic clocks keep real time).
    """

    def __init__(self, *, clock_offset: float | None = None) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="tasklock-pg-"))
        self.data = self.dir / "data"
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._env: dict[str, str] | None = None
        self.clock_file = self.dir / "faketime"
        self._run(_pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")
        if clock_offset is not None:
            self._env = {
                **os.environ,
                "LD_PRELOAD": faketime_library(),
                "FAKETIME_TIMESTAMP_FILE": str(self.clock_file),
                "FAKETIME_NO_CACHE": "1",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            }
            self.offset = 0.0
            self.step_clock(clock_offset)

    def step_clock(self, seconds: float) -> None:
        """Move the server's clock ``seconds`` (a server started with ``clock_offset``)."""
        assert self._env is not None, "started without clock_offset"
        self.offset += seconds
        written = self.dir / "faketime.new"
        written.write_text(f"{self.offset:+.3f}\n")
        written.chmod(0o644)
        written.replace(self.clock_file)  # at once: the server reads it at every call

    def _run(self, *args: str, env: dict[str, str] | None = None) -> None:
        # Output goes to a file: the server inherits it, and a pipe would never close.
        with open(self.dir / "log", "ab") as log:
            subprocess.run(
                args,
                check=True,
                stdout=log,
                stderr=log,
                preexec_fn=_as_postgres(),
                cwd=self.dir,
                env=env,
            )

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            _pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "server.log"),
            "-o", options, "-w", "start", env=self._env,
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def private_postgres(*, clock_offset: float | None = None) -> Iterator[PrivatePostgres]:
    server = PrivatePostgres(clock_offset=clock_offset)
    try:
        server.start()
        yield server
    finally:
        server.remove()


class PrivateRedis:
    """A ``redis-server`` without persistence on a free port; restartable."""

    def __init__(self, *extra: str) -> None:
        self.binary = require_binary(shutil.which("redis-server"), "redis-server")
        self.port = free_port()
        self.extra = extra
        self.started = False
        # A replica's full sync writes an RDB file even with --save "": not in the checkout.
        self.dir = tempfile.mkdtemp(prefix="tasklock-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it; on its first start, on another free port if another process took
        this one between ``free_port()`` and the server's bind (a parallel test worker)."""
        for _ in range(5):
            self.process = subprocess.Popen(
                [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self.dir, *self.extra],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            if self._answers_itself():
                self.started = True
                return
            self.process.kill()
            self.process.wait(10)
            if self.started:
                break  # a restart: its port must stay the same
            self.port = free_port()
        raise RuntimeError(f"redis-server could not listen on 127.0.0.1:{self.port}")

    def _answers_itself(self) -> bool:
        """Whether this server, not another process's, answers on the port."""
        import redis

        assert self.process is not None
        end = time.monotonic() + 20
        while time.monotonic() < end and self.process.poll() is None:
            with contextlib.suppress(redis.RedisError):
                client = redis.Redis(port=self.port, socket_timeout=1)
                try:
                    return bool(client.info("server")["process_id"] == self.process.pid)
                finally:
                    client.close()
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


@contextlib.contextmanager
def private_redis(*extra: str) -> Iterator[PrivateRedis]:
    server = PrivateRedis(*extra)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )


def start_pgbouncer(
    target_host: str, target_port: int, *, mode: str = "transaction"
) -> tuple[int, Callable[[], None]]:
    """PgBouncer in ``mode`` pooling in front of the server; returns its port and a stopper."""
    binary = require_binary(pgbouncer_binary(), "pgbouncer")
    port, folder = free_port(), Path(tempfile.mkdtemp(prefix="tasklock-pgbouncer-"))
    (folder / "users.txt").write_text('"postgres" ""\n')
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={target_host} port={target_port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'users.txt'}\n"
        f"pool_mode = {mode}\nmax_client_conn = 500\ndefault_pool_size = 20\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
    )
    if os.geteuid() == 0:
        for path in (folder, folder / "users.txt", folder / "pgbouncer.ini"):
            shutil.chown(path, "postgres", "postgres")
    process = subprocess.Popen(
        [binary, str(folder / "pgbouncer.ini")],
        preexec_fn=_as_postgres(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def stop() -> None:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)

    try:
        wait_for_port(port)
    except TimeoutError:
        stop()
        raise
    return port, stop


class PrivateSentinel:
    """A Redis master, its replica and one sentinel watching them as ``mymaster``."""

    service = "mymaster"

    def __init__(self, master: PrivateRedis, replica: PrivateRedis) -> None:
        self.master, self.replica = master, replica
        binary = shutil.which("redis-sentinel") or shutil.which("redis-server")
        self.binary = require_binary(binary, "redis-sentinel")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="tasklock-sentinel-"))
        (self.dir / "sentinel.conf").write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\n"
            f"sentinel monitor {self.service} 127.0.0.1 {master.port} 1\n"
            f"sentinel down-after-milliseconds {self.service} 1000\n"
            f"sentinel failover-timeout {self.service} 5000\n"
        )
        self.process = subprocess.Popen(
            [self.binary, str(self.dir / "sentinel.conf"), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port)

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.port}/{self.service}/0"

    def client(self) -> Any:
        import redis

        return redis.Redis(port=self.port, decode_responses=True)

    def master_port(self) -> int:
        return int(self.client().sentinel_get_master_addr_by_name(self.service)[1])

    def wait_for_replica(self, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            replicas = self.client().sentinel_slaves(self.service)
            if any(
                r["port"] == self.replica.port and r["master-link-status"] == "ok"
                for r in replicas
            ):
                return
            time.sleep(0.1)
        raise TimeoutError("the sentinel never saw the replica")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def private_sentinel() -> Iterator[PrivateSentinel]:
    with contextlib.ExitStack() as stack:
        master = stack.enter_context(private_redis())
        replica = stack.enter_context(private_redis("--replicaof", "127.0.0.1", str(master.port)))
        sentinel = PrivateSentinel(master, replica)
        stack.callback(sentinel.stop)
        sentinel.wait_for_replica()
        yield sentinel
