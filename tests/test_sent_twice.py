"""Every lock call sent twice has the outcome of sending it once.

A reply lost after the storage acted makes the call go out again: the
database backend re-sends a release (or a force release's deletion) on a new
connection, and redis-py retries a command whose connection broke. Through a
:class:`FaultProxy` that lets the request through and drops the connection
before the reply arrives, on PostgreSQL, MariaDB and Redis.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import DatabaseError, connections

from django_tasklock.backends.base import BaseBackend, lease_id, storage_key
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.service import TaskLockService, new_token
from django_tasklock.signals import lock_lost, lock_released
from django_tasklock.testing.proxy import FaultProxy
from django_tasklock.testing.support import LIFE, LONG, SignalRecorder, wait_until
from tests.proxied import PROXIED, proxied_backend, statement_of, upstream

pytestmark = pytest.mark.databases


@pytest.fixture(params=PROXIED)
def storage(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def proxy(storage: str) -> Iterator[FaultProxy]:
    with FaultProxy(upstream(storage), lifetime=120) as running:
        yield running


@pytest.fixture
def direct(storage: str, key: str) -> Iterator[BaseBackend]:
    """The same storage, not through the proxy: the other workers."""
    if storage != "redis":
        yield DatabaseBackend(using=storage)
        return
    import redis

    from django_tasklock.backends.redis import RedisBackend

    assert settings.REDIS_URL is not None
    yield RedisBackend(url=settings.REDIS_URL)
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(*[stored for stored in client.scan_iter(match=storage_key(key) + "*")] or [key])


def a_write_of(storage: str, backend: BaseBackend, key: str) -> Callable[[bytes], bool]:
    """The request that deletes ``key``: a DELETE, or any Redis command on it but a look."""
    if storage != "redis":
        return lambda data: b"DELETE" in data
    inspect = statement_of(storage, backend, "inspect", b"")
    stored = storage_key(key).encode()
    return lambda data: stored in data and inspect not in data


# -- 1. force release ------------------------------------------------------------


def test_force_release_whose_reply_was_lost_never_ends_the_successors_lease(
    storage: str, proxy: FaultProxy, direct: BaseBackend, key: str
) -> None:
    first, successor = new_token(), new_token()
    with proxied_backend(storage, proxy) as operator:
        assert direct.acquire(key, first, ttl=LONG, max_lifetime=LIFE)
        deletion = a_write_of(storage, operator, key)
        proxy.drop_reply(match=deletion)
        proxy.delay(2.0, match=deletion)  # the re-send waits while a successor takes the key
        took: list[bool] = []

        def successor_takes() -> None:
            try:
                wait_until(lambda: proxy.dropped == 1, timeout=20)
                took.append(direct.acquire(key, successor, ttl=LONG, max_lifetime=LIFE))
            finally:
                direct.close()  # this thread's connection

        thread = threading.Thread(target=successor_takes)
        thread.start()
        released = operator.force_release(key)
        thread.join(30)
    assert took == [True], "the first deletion did not happen, or the successor could not take"
    assert (proxy.dropped, proxy.delayed) == (1, 1), "the deletion was not sent twice"
    held = direct.peek(key)
    assert held is not None, "the re-sent deletion ended the successor's lease"
    assert held.lease == lease_id(successor)
    assert direct.refresh(key, successor, ttl=LONG, max_lifetime=LIFE)
    # The lease the operator's call ended is named, although its reply was lost.
    assert released, "a force release that ended the lease said it ended nothing"
    assert released.lease == lease_id(first)
    assert direct.release(key, successor)


# -- 2. release ------------------------------------------------------------------


@pytest.mark.parametrize("min_hold", [None, 20.0], ids=["release", "min_hold"])
def test_release_whose_reply_was_lost_is_not_a_loss(
    storage: str,
    proxy: FaultProxy,
    direct: BaseBackend,
    key: str,
    min_hold: float | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    signals = SignalRecorder()
    lock_lost.connect(signals, weak=False)
    lock_released.connect(signals, weak=False)
    try:
        with proxied_backend(storage, proxy) as backend:
            # No refresh comes due: the heartbeat's thread does not see the proxied alias.
            lock = TaskLockService(backend).lock(key, ttl=LONG, min_hold=min_hold)
            with caplog.at_level(logging.WARNING, logger="django_tasklock"):
                lock.acquire()
                proxy.drop_reply(match=statement_of(storage, backend, "release", b"task-lock:"))
                lock.release()
    finally:
        lock_lost.disconnect(signals)
        lock_released.disconnect(signals)
    assert proxy.dropped == 1, "the release's reply was not lost"
    assert not lock.lost
    assert "was lost" not in caplog.text
    assert [name for name, _ in signals.sent] == ["released"]
    held = direct.peek(key)
    if min_hold is None:
        assert held is None
    else:  # kept until acquisition + min_hold, by the first send
        assert held is not None
        assert 15 < held.seconds_left <= min_hold


def test_release_sent_again_after_a_successor_took_the_key_is_a_loss(
    storage: str, proxy: FaultProxy, direct: BaseBackend, key: str
) -> None:
    """The other side of the rule: a key that is someone else's is a loss, re-sent or not."""
    successor = new_token()
    with proxied_backend(storage, proxy) as backend:
        lock = TaskLockService(backend).lock(key, ttl=LONG)
        lock.acquire()
        deletion = statement_of(storage, backend, "release", b"task-lock:")
        proxy.drop_reply(match=deletion)
        proxy.delay(2.0, match=deletion)
        took: list[bool] = []

        def successor_takes() -> None:
            try:
                wait_until(lambda: proxy.dropped == 1, timeout=20)
                took.append(direct.acquire(key, successor, ttl=LONG, max_lifetime=LIFE))
            finally:
                direct.close()

        thread = threading.Thread(target=successor_takes)
        thread.start()
        lock.release()
        thread.join(30)
    assert took == [True]
    assert lock.lost
    assert direct.release(key, successor), "the re-sent release ended the successor's lease"


# -- 3. acquire ------------------------------------------------------------------


def test_acquire_whose_reply_was_lost_is_acquired_or_an_error_never_held(
    storage: str, proxy: FaultProxy, direct: BaseBackend, key: str
) -> None:
    """Redis: the client runs the script again, which finds its own lease: acquired.
    The database backend does not send an INSERT twice: the caller gets the error,
    and the lease the INSERT made is released by its token (a re-sent INSERT that
    finds its own row is acquired too: the contract's ResendCases)."""
    ran: list[bool] = []
    with proxied_backend(storage, proxy) as backend:
        proxy.drop_reply(match=statement_of(storage, backend, "acquire", b"INSERT"))
        if storage == "redis":
            result = TaskLockService(backend).run_exclusive(
                key, lambda: ran.append(True), ttl=LONG
            )
            assert (result.acquired, ran, result.lost) == (True, [True], False)
        else:
            with pytest.raises(DatabaseError):
                TaskLockService(backend).run_exclusive(key, lambda: ran.append(True), ttl=LONG)
            assert ran == []
    assert proxy.dropped == 1, "the acquisition's reply was not lost"
    assert direct.peek(key) is None, "a lease nobody runs was left behind"


# -- 4. at volume ----------------------------------------------------------------

OPERATIONS = 10_000
DROP_RATE = 0.03
KEYS = 4  # per worker
WORKERS = 4


class Tally:
    """What the run saw: operations by kind and outcome, and each kind of wrong."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.wrong: list[str] = []
        self.seen: dict[str, list[str]] = {}  # key -> what its last operations did
        self.failed_releases: list[logging.LogRecord] = []

    def count(self, key: str, outcome: str) -> None:
        self.outcomes[outcome] += 1
        self.seen[key] = [*self.seen.get(key, [])[-3:], outcome]

    def check(self, direct: BaseBackend, key: str, expected: str | None, after: str) -> None:
        held = direct.peek(key)
        seen = None if held is None else held.lease
        if seen != (None if expected is None else lease_id(expected)):
            self.wrong.append(f"{after}: {key} held by {seen}, expected {expected}")


@pytest.mark.slow
def test_ten_thousand_calls_with_lost_replies_change_nothing_but_the_outcome(
    storage: str, proxy: FaultProxy, direct: BaseBackend, key: str
) -> None:
    """Acquire, refresh, release and force release, 3 % of replies lost, by workers
    through the proxy with a successor beside each: each call's outcome is that of
    one sending. A call that raised (the database backend re-sends only releases)
    left no lease behind that anyone runs: its caller was told."""
    lost_signals = SignalRecorder()
    failures = _Failures()
    tallies = [Tally() for _ in range(WORKERS)]
    lock_lost.connect(lost_signals, weak=False)
    logging.getLogger("django_tasklock").addHandler(failures)
    proxy.drop_reply(match=b"task-lock:", times=None, probability=DROP_RATE)
    try:
        workers = [
            threading.Thread(
                target=_work,
                args=(storage, proxy, direct, f"{key}-{n}", random.Random(n), tally, failures),
            )
            for n, tally in enumerate(tallies)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(600)
    finally:
        lock_lost.disconnect(lost_signals)
        logging.getLogger("django_tasklock").removeHandler(failures)
    outcomes: Counter[str] = sum((tally.outcomes for tally in tallies), Counter())
    wrong = [each for tally in tallies for each in tally.wrong]
    print(f"\n{storage}: {outcomes.total()} operations, {proxy.dropped} replies lost:")
    print(dict(sorted(outcomes.items())))
    assert wrong == [], wrong[:10]
    assert outcomes.total() >= OPERATIONS
    assert proxy.dropped > OPERATIONS * DROP_RATE / 3, "too few replies were lost to prove it"
    reported = [kw for _, kw in lost_signals.sent if kw["key"].startswith(key)]
    expected = outcomes["release after a force release: lost"]
    assert len(reported) == expected, "a loss was reported that did not happen"


def _work(
    storage: str,
    proxy: FaultProxy,
    direct: BaseBackend,
    prefix: str,
    rng: random.Random,
    tally: Tally,
    failures: _Failures,
) -> None:
    """One worker's share of the operations, on keys of its own, in its own thread."""
    tally.failed_releases = failures.of_this_thread()
    keys = [f"{prefix}-{n}" for n in range(KEYS)]
    ours: dict[str, Any] = {}  # key -> our held Lock
    theirs: dict[str, str] = {}  # key -> the successor's token
    try:
        with proxied_backend(storage, proxy) as backend:
            service = TaskLockService(backend)
            for _ in range(OPERATIONS // WORKERS):
                _one_operation(
                    rng.choice(keys), rng, service, backend, direct, ours, theirs, tally
                )
            for each, lock in ours.items():
                failed = len(tally.failed_releases)
                lock.release()
                if len(tally.failed_releases) > failed:  # logged; left to expire
                    direct.release(each, lock._lease.token)
        for each, token in theirs.items():
            direct.release(each, token)
        for each in keys:
            tally.check(direct, each, None, "the end")
    except Exception as exc:  # the main thread asserts on what the workers found
        tally.wrong.append(f"{prefix}: {exc!r}")
    finally:
        direct.close()


def _one_operation(
    key: str,
    rng: random.Random,
    service: TaskLockService,
    backend: BaseBackend,
    direct: BaseBackend,
    ours: dict[str, Any],
    theirs: dict[str, str],
    tally: Tally,
) -> None:
    if key in theirs:
        # An operator ends the successor's lease, by the lease seen.
        shown = direct.peek(key)
        if shown is None or shown.lease != lease_id(theirs[key]):
            tally.wrong.append(f"the successor's lease of {key} is gone: {tally.seen[key]}")
            del theirs[key]
            return
        try:
            ended = backend.force_release(key, shown.lease)
        except Exception:
            _after_error(backend)
            # The operator is told (the error); its deletion, sent twice, may have happened.
            if direct.peek(key) is None:
                tally.count(key, "force release: raised, after ending the lease")
                del theirs[key]
            else:
                tally.count(key, "force release: raised")
                tally.check(direct, key, theirs[key], "force release that raised")
            return
        tally.count(key, "force release")
        if ended is None or ended.lease != shown.lease:
            tally.wrong.append(f"force release of {key} said {ended}")
        del theirs[key]  # whether it is gone, the next acquisition of the key says
    elif key not in ours:
        # No refresh comes due in the heartbeat's thread, which cannot see the proxied alias.
        lock = service.lock(key, ttl=LONG * 2, refresh_interval=LONG * 1.5)
        try:
            acquired = lock.try_acquire()
        except Exception:
            _after_error(backend)
            left = direct.peek(key)
            if left is None:
                tally.count(key, "acquire: raised")
            elif left.holder.pid == os.getpid():
                # Its reply lost, then the release by its token too: the caller was
                # told (the error) and the lease expires by itself.
                tally.count(key, "acquire: raised, left to expire")
                direct.force_release(key, left.lease)
            else:
                tally.wrong.append(f"{key} free before an acquisition that raised: {left}")
            return
        tally.count(key, f"acquire: {acquired}")
        if not acquired:  # the key was free: a re-send that found its own lease said "held"
            tally.wrong.append(f"acquire of free {key} said held")
            tally.check(direct, key, None, "acquire said held")
            return
        ours[key] = lock  # whether it is ours, the refresh or the release says
    else:
        lock = ours[key]
        token = lock._lease.token
        action = rng.random()
        if action < 0.4:
            try:
                refreshed = backend.refresh(key, token, ttl=LONG, max_lifetime=LIFE)
            except Exception:
                _after_error(backend)
                tally.count(key, "refresh: raised")
            else:
                tally.count(key, f"refresh: {refreshed}")
                if not refreshed:
                    tally.wrong.append(f"refresh of {key} found it lost")
        elif action < 0.8:
            failures = len(tally.failed_releases)
            lock.release()  # never raises: a failure is logged
            del ours[key]
            _after_error(backend)
            if lock.lost:
                tally.wrong.append(f"release of {key} reported a loss")
            if len(tally.failed_releases) > failures:
                tally.count(key, "release: failed, logged")
                direct.release(key, token)  # if it was left to expire
            else:  # whether it is free, the next acquisition of the key says
                tally.count(key, "release")
        else:
            # Force-released by the other worker's operator, then taken by a successor:
            # our release, re-sent or not, must report the loss and spare the successor.
            assert direct.force_release(key) is not None
            successor = new_token()
            assert direct.acquire(key, successor, ttl=LONG, max_lifetime=LIFE)
            failures = len(tally.failed_releases)
            lock.release()
            del ours[key]
            _after_error(backend)
            if len(tally.failed_releases) > failures:
                # Every sending failed: logged, and nothing can be said of the lease.
                tally.count(key, "release after a force release: failed, logged")
            elif lock.lost:
                tally.count(key, "release after a force release: lost")
            else:
                tally.wrong.append(f"release of {key} after a successor took it saw no loss")
            theirs[key] = successor  # whether it is still theirs, the next look says


class _Failures(logging.Handler):
    """Collects the lock's "Releasing ... failed" warnings, by thread."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.by_thread: dict[int | None, list[logging.LogRecord]] = {}

    def of_this_thread(self) -> list[logging.LogRecord]:
        return self.by_thread.setdefault(threading.get_ident(), [])

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Releasing task lock"):
            self.by_thread.setdefault(record.thread, []).append(record)


def _after_error(backend: BaseBackend) -> None:
    """Drop a dead connection, as Django does between requests (``close_old_connections``)."""
    if isinstance(backend, DatabaseBackend):
        connections[backend.using].close_if_unusable_or_obsolete()
