"""Handoff: how soon after a release the next waiter holds the key, across processes.

Every participant loops: ``with lock(key, wait=...)``, hold the key for
``hold`` seconds, release, rest ``REST`` seconds (so that the releaser does
not simply take the key back), and wait again. With ``waiters`` + 1
participants, one holds and ``waiters`` wait. Participants run in up to
:data:`PROCESSES` forked processes (threads within them): handoffs between
processes are what a wake-up has to carry. A handoff is the time from the
moment a release began (its call, the storage's round trip included:
``from_release_start_*``) to the
moment the next holder's ``acquire`` returned, both read from the host's
monotonic clock (one clock for every process of the host); ``p50_ms`` and
``p99_ms`` count from the moment the release call returned instead (the next
holder may have the key before the releaser reads its clock: such a handoff
counts as 0). An overlap would be a holder that acquired before the previous
one began its release.

Beside it, in the same run, the raw floors with 1 waiter: PostgreSQL's
``pg_advisory_lock`` queue (the waiter blocks in the server) and a Redis
``PUBLISH`` to a subscribed waiter that then takes the key with ``SET NX``;
and PostgreSQL's row and ``LISTEN``/``NOTIFY`` sent by the raw driver, with
1 and 8 waiting processes, and 8 of which only one acts on the notification
(what waking one process at a time could reach, the others still listening).

The spread: for each participant, how many times it held the key and its
longest wait, to show that no waiter starves while others are woken.
"""

from __future__ import annotations

import itertools
import multiprocessing
import statistics
import threading
import time
from typing import Any

from servers import RUN, Servers, log

#: Seconds a participant rests after its release before it waits again.
REST = 0.005
#: Most processes the participants are spread over.
PROCESSES = 8


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _participant(
    backend: Any, key: str, hold: float, until: float, name: str, out: list[Any]
) -> None:
    from django_tasklock.api.service import TaskLockService

    service = TaskLockService(backend)
    while time.monotonic() < until:
        began = time.monotonic()
        lock = service.lock(key, ttl=60, wait=max(1.0, until - began + 30))
        if not lock.try_acquire():
            continue
        acquired = time.monotonic()
        time.sleep(hold)
        releasing = time.monotonic()
        lock.release()
        out.append((name, began, acquired, releasing, time.monotonic()))
        time.sleep(REST)
    backend.close()


def _process(make: Any, key: str, hold: float, until: float, names: list[str], queue: Any) -> None:
    backend = make()
    out: list[Any] = []
    threads = [
        threading.Thread(target=_participant, args=(backend, key, hold, until, name, out))
        for name in names
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    queue.put(out)


def scenario(make: Any, group: str, waiters: int, hold: float, seconds: float) -> dict[str, Any]:
    """One storage, ``waiters`` waiters, holds of ``hold`` s, for about ``seconds``."""
    from django.db import connections

    key = f"{RUN}handoff-{group}-{waiters}-{hold:g}"
    names = [f"p{i}" for i in range(waiters + 1)]
    spread = [names[i :: min(PROCESSES, len(names))] for i in range(min(PROCESSES, len(names)))]
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    connections.close_all()  # nothing of the parent's is shared with the children
    until = time.monotonic() + 2.0 + seconds  # the children start within 2 s
    procs = [
        ctx.Process(target=_process, args=(make, key, hold, until, part, queue)) for part in spread
    ]
    for proc in procs:
        proc.start()
    records: list[Any] = []
    for _ in procs:
        records += queue.get(timeout=seconds + 120)
    for proc in procs:
        proc.join(30)
    records.sort(key=lambda record: record[2])
    # Warm-up: the first holds (processes starting) are left out.
    start = until - seconds
    pairs = list(itertools.pairwise(records))
    counted = [(before, after) for before, after in pairs if before[2] >= start]
    handoffs = [max(0.0, after[2] - before[4]) * 1000 for before, after in counted]
    from_start = [(after[2] - before[3]) * 1000 for before, after in counted]
    overlaps = sum(1 for before, after in pairs if after[2] < before[3])
    counts = {name: 0 for name in names}
    longest = {name: 0.0 for name in names}
    for name, began, acquired, *_ in records:
        if acquired >= start:
            counts[name] += 1
            longest[name] = max(longest[name], acquired - began)
    waits = [acquired - began for _, began, acquired, *_ in records if acquired >= start]
    return {
        "handoffs": len(handoffs),
        "p50_ms": round(statistics.median(handoffs), 2) if handoffs else None,
        "p99_ms": round(_quantile(handoffs, 0.99), 2) if handoffs else None,
        "max_ms": round(max(handoffs), 2) if handoffs else None,
        "from_release_start_p50_ms": round(statistics.median(from_start), 2) if handoffs else None,
        "from_release_start_p99_ms": round(_quantile(from_start, 0.99), 2) if handoffs else None,
        "overlaps": overlaps,
        "holds_per_participant": {"min": min(counts.values()), "max": max(counts.values())},
        "longest_wait_s": round(max(longest.values()), 3),
        "wait_p50_s": round(statistics.median(waits), 3) if waits else None,
        "wait_p99_s": round(_quantile(waits, 0.99), 3) if waits else None,
    }


def _raw_advisory(alias: str, hold: float, rounds: int) -> dict[str, Any]:
    """``pg_advisory_lock``: the waiter blocks in the server; handoff after the unlock."""
    from django.db import connections

    settings = connections[alias].get_connection_params()
    database = connections[alias].Database
    ctx = multiprocessing.get_context("fork")
    go, results = ctx.Queue(), ctx.Queue()
    connections.close_all()

    def waiter() -> None:
        conn = database.connect(**settings)
        conn.autocommit = True
        cur = conn.cursor()
        for _ in range(rounds):
            go.get(timeout=60)  # held by now
            cur.execute("SELECT pg_advisory_lock(7461736)")
            results.put(time.monotonic())
            cur.execute("SELECT pg_advisory_unlock(7461736)")
        conn.close()

    conn = database.connect(**settings)
    conn.autocommit = True
    cur = conn.cursor()
    proc = ctx.Process(target=waiter)
    proc.start()
    handoffs = []
    for _ in range(rounds):
        cur.execute("SELECT pg_advisory_lock(7461736)")
        go.put(None)
        time.sleep(hold)  # the waiter is blocked in the server by now
        releasing = time.monotonic()
        cur.execute("SELECT pg_advisory_unlock(7461736)")
        released = time.monotonic()
        acquired = results.get(timeout=60)
        handoffs.append((max(0.0, acquired - released) * 1000, (acquired - releasing) * 1000))
    proc.join(30)
    conn.close()
    return _summary(handoffs)


def _raw_notify(alias: str, waiters: int, one_acts: bool, rounds: int) -> dict[str, Any]:
    """PostgreSQL, the raw driver: a row and ``LISTEN``/``NOTIFY``, as ours, and nothing else.

    ``waiters`` processes ``LISTEN``; the holder's release deletes its row and
    notifies in one statement; told, each waiter inserts the row (all of
    them, or with ``one_acts`` only the round's own one while the others only
    listen), and the one whose ``INSERT`` succeeds has the key, which the
    holder then takes back as it is (no statement) for the next round. Holds of 50 ms.
    """
    from django.db import connections

    settings = connections[alias].get_connection_params()
    database = connections[alias].Database
    table, channel = "bench_raw_notify", f"{RUN}raw_notify".replace("-", "_")
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    connections.close_all()
    conn = database.connect(**settings)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE IF NOT EXISTS {table} (key text PRIMARY KEY, round int)")
    cur.execute(f"DELETE FROM {table}")
    cur.execute(f"INSERT INTO {table} VALUES ('k', -1)")

    def waiter(me: int) -> None:
        import selectors

        listening = database.connect(**settings)
        listening.autocommit = True
        listening.cursor().execute(f"LISTEN {channel}")
        work = database.connect(**settings)
        work.autocommit = True
        wcur = work.cursor()
        results.put((-1, 0.0))  # listening
        told: list[str] = []
        with selectors.DefaultSelector() as selector:
            selector.register(listening.fileno(), selectors.EVENT_READ)
            while True:
                selector.select(60)
                if hasattr(listening, "pgconn"):
                    listening.pgconn.consume_input()
                    while (notify := listening.pgconn.notifies()) is not None:
                        told.append(notify.extra.decode())
                else:
                    listening.poll()
                    told += [n.payload for n in listening.notifies]
                    listening.notifies.clear()
                while told:
                    payload = told.pop(0)
                    if payload == "stop":
                        listening.close()
                        work.close()
                        return
                    if one_acts and int(payload) % waiters != me:
                        continue
                    try:
                        wcur.execute(f"INSERT INTO {table} VALUES ('k', %s)", [int(payload)])
                    except database.IntegrityError:
                        continue
                    results.put((int(payload), time.monotonic()))

    procs = [ctx.Process(target=waiter, args=(me,)) for me in range(waiters)]
    for proc in procs:
        proc.start()
    for _ in procs:
        results.get(timeout=60)
    handoffs = []
    release = (
        f"WITH ended AS (DELETE FROM {table} RETURNING key) "
        f"SELECT pg_notify('{channel}', %s) FROM ended"
    )
    for number in range(rounds):
        time.sleep(0.05)  # the row there: held
        releasing = time.monotonic()
        cur.execute(release, [str(number)])
        released = time.monotonic()
        won, acquired = results.get(timeout=60)
        while won != number:  # a round nobody won in time: not this one's
            won, acquired = results.get(timeout=60)
        handoffs.append((max(0.0, acquired - released) * 1000, (acquired - releasing) * 1000))
    cur.execute("SELECT pg_notify(%s, 'stop')", [channel])
    for proc in procs:
        proc.join(30)
    cur.execute(f"DROP TABLE {table}")
    conn.close()
    return _summary(handoffs)


def _raw_pubsub(url: str, hold: float, rounds: int) -> dict[str, Any]:
    """Redis: ``DEL`` + ``PUBLISH`` by the holder; the subscribed waiter takes it by ``SET NX``."""
    import redis

    key, channel = f"{RUN}raw-pubsub", f"{RUN}raw-pubsub-released"
    ctx = multiprocessing.get_context("fork")
    go, results = ctx.Queue(), ctx.Queue()

    def waiter() -> None:
        client = redis.Redis.from_url(url)
        pubsub = client.pubsub()
        pubsub.subscribe(channel)
        pubsub.get_message(timeout=5)  # the confirmation
        for _ in range(rounds):
            go.get(timeout=60)  # held by now
            while not client.set(key, "w", nx=True, px=60_000):
                pubsub.get_message(timeout=5)
            results.put(time.monotonic())
            client.delete(key)
        pubsub.close()

    client = redis.Redis.from_url(url)
    proc = ctx.Process(target=waiter)
    proc.start()
    handoffs = []
    for _ in range(rounds):
        while not client.set(key, "h", nx=True, px=60_000):
            time.sleep(0.001)
        go.put(None)
        time.sleep(hold)
        releasing = time.monotonic()
        client.delete(key)
        client.publish(channel, "")
        released = time.monotonic()
        acquired = results.get(timeout=60)
        handoffs.append((max(0.0, acquired - released) * 1000, (acquired - releasing) * 1000))
    proc.join(30)
    return _summary(handoffs)


def _summary(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    """(from the release's return, from its start), in ms, per handoff."""
    after, since = [pair[0] for pair in pairs], [pair[1] for pair in pairs]
    return {
        "handoffs": len(pairs),
        "p50_ms": round(statistics.median(after), 2),
        "p99_ms": round(_quantile(after, 0.99), 2),
        "max_ms": round(max(after), 2),
        "from_release_start_p50_ms": round(statistics.median(since), 2),
        "from_release_start_p99_ms": round(_quantile(since, 0.99), 2),
    }


def handoff(up: Servers, quick: bool) -> dict[str, Any]:
    """Every storage that answered: 1, 8 and 32 waiters, holds of 50 ms and 1 s; the floors."""
    from django_tasklock.backends.database import DatabaseBackend
    from django_tasklock.backends.redis import RedisBackend

    makers: dict[str, Any] = {
        group: (lambda alias=alias: DatabaseBackend(using=alias))
        for group, alias in up.aliases.items()
    }
    if up.redis_url:
        makers["redis"] = lambda: RedisBackend(url=up.redis_url)
    out: dict[str, Any] = {"rest_s": REST, "processes_at_most": PROCESSES}
    for group, make in makers.items():
        for hold in (0.05, 1.0):
            for waiters in (1, 8, 32):
                seconds = (3.0 if hold < 1 else 6.0) if quick else (8.0 if hold < 1 else 25.0)
                log(f"handoff {group}: {waiters} waiters, holds of {hold:g} s ...")
                out.setdefault(group, {})[f"waiters_{waiters}_hold_{hold:g}s"] = scenario(
                    make, group, waiters, hold, seconds
                )
    rounds = 30 if quick else 100
    if "postgres" in up.aliases:
        log("handoff floor: pg_advisory_lock ...")
        out["raw_pg_advisory_lock"] = _raw_advisory(up.aliases["postgres"], 0.05, rounds)
        for waiters, one in ((1, False), (8, False), (8, True)):
            log(f"handoff floor: LISTEN/NOTIFY and INSERT, {waiters} waiters ...")
            name = f"raw_pg_notify_{waiters}" + ("_one_acts" if one else "")
            out[name] = _raw_notify(up.aliases["postgres"], waiters, one, rounds)
    if up.redis_url:
        log("handoff floor: Redis pub/sub ...")
        out["raw_redis_pubsub"] = _raw_pubsub(up.redis_url, 0.05, rounds)
    return out
