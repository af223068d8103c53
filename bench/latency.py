"""The deployment-shaped scenario: each server 1 ms away, the way a database on another host is.

Every request to PostgreSQL, MariaDB and Redis goes through
``django_tasklock.testing.proxy.FaultProxy`` with a ``delay`` on every
request, so each round trip takes the delay longer. The proxies run in a
process of their own: their threads' CPU is not counted as the contenders'.
SQLite, a local file, has no such scenario.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Run by a child process: one FaultProxy per upstream, each request held `delay` s.
_CHILD = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("proxy", sys.argv[1])
proxy = sys.modules["proxy"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(proxy)
delay = float(sys.argv[2])
running = []
for upstream in sys.argv[3:]:
    host, port = upstream.rsplit(":", 1)
    one = proxy.FaultProxy((host, int(port)), lifetime=86400, max_connections=256).start()
    one.delay(delay, times=None)
    running.append(one)
print(" ".join(str(one.port) for one in running), flush=True)
sys.stdin.read()  # until the parent closes it (or dies)
for one in running:
    one.stop()
"""


def _proxy_module() -> str:
    """The path of ``django_tasklock/testing/proxy.py``, found without importing the package."""
    spec = importlib.util.find_spec("django_tasklock")
    if spec is None or spec.origin is None:
        raise RuntimeError("django_tasklock is not installed")
    return str(Path(spec.origin).parent / "testing" / "proxy.py")


@contextmanager
def proxied(delay: float, upstreams: dict[str, tuple[str, int]]) -> Iterator[dict[str, int]]:
    """Proxies to ``upstreams`` (name -> host, port) adding ``delay`` s: name -> local port."""
    names = list(upstreams)
    if not names:
        yield {}
        return
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, _proxy_module(), str(delay)]
        + [f"{host}:{port}" for host, port in upstreams.values()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        ports = [int(port) for port in child.stdout.readline().split()]
        if len(ports) != len(names):
            raise RuntimeError(f"the latency proxies did not start (exit {child.poll()})")
        yield dict(zip(names, ports, strict=True))
    finally:
        assert child.stdin is not None
        child.stdin.close()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
