"""Calls sent twice, at volume: 10,000 per storage through a proxy that loses replies.

The one-by-one cases, and what the proxy does, are in ``tests/faults/test_sent_twice.py``.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections import Counter
from typing import Any

import pytest
from django.db import connections

from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.base import BaseBackend, lease_id
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.signals import lock_lost
from django_tasklock.testing.proxy import FaultProxy
from django_tasklock.testing.support import LIFE, LONG, SignalRecorder
from tests.support import proxied
from tests.support.proxied import proxied_backend

# The fixtures (see tests/support/proxied.py).
storage, proxy, direct = proxied.storage, proxied.proxy, proxied.direct

pytestmark = [pytest.mark.databases, pytest.mark.slow]

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
