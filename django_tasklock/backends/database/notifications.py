"""PostgreSQL: a release tells the waiting processes by ``NOTIFY``, only when one waits.

Every process that has a waiter keeps one connection of its own (see
``backends.listening``) that ``LISTEN``\\ s on :data:`CHANNEL` and holds a
shared advisory lock per watched key (``pg_advisory_lock_shared(NAMESPACE,
hashtext(key))``). The release's DELETE (:func:`notifying`) asks in the same
statement for that lock exclusively, for its transaction: granted, nobody
waits and nothing is sent; refused, ``pg_notify`` names the key. So a release
nobody waits for costs one lock-table lookup, not ``NOTIFY``'s queue and the
lock every notifying commit in the cluster takes in turn (measured here: 8
concurrent releasers lost ~30 % of their rate to an unconditional ``NOTIFY``,
~5 % to the lookup). Two keys whose ``hashtext`` agree only cost a look in vain.

The payload names the key and one waiting process: the server process id of
a listening connection holding that shared lock, picked at random from
``pg_locks`` (no FIFO, no favourite). That process's waiters ask for the key
at once, the others' :data:`LOOK_LATER` after: eight waiting processes woken
at once all sent their ``INSERT`` together, and on two cores the winner's
waited for the CPU the losers took (measured here: handoff p50 2.6 ms with
eight waiting processes, 1.6 ms since). A release that named a process
whose waiter stopped waiting meanwhile costs the others those 10 ms.

Behind PgBouncer's transaction pooling ``LISTEN`` hears nothing: the listener
proves on connecting that a notification sent from another connection
reaches it within :data:`PROBE_WAIT` (:meth:`PostgresListener.connect`), else
it reports this storage deaf and its waiters poll (asked again after
``listening.DEAF_FOR``).
"""

from __future__ import annotations

import contextlib
import selectors
import time
import uuid
from collections.abc import Iterable
from typing import Any

from django.db import connections

from django_tasklock.backends.forksafe import ForkSafeLock
from django_tasklock.backends.listening import Listener

#: The channel every release notifies, with the stored key as its payload.
CHANNEL = "tasklock_released"
#: The first half of the advisory locks that say "a process waits for this key".
NAMESPACE = 0x7461736B  # "task"
#: How the listener's connections show in ``pg_stat_activity``.
APPLICATION_NAME = "django-tasklock listener"
#: Seconds a listener waits for its own proof notification.
PROBE_WAIT = 5.0
#: Between the key and the waiting process the release chose, in a notification's payload.
CHOSEN = chr(30)
#: Seconds the waiters of a process the release did not choose wait before they look.
LOOK_LATER = 0.01


def notifying(delete_sql: str) -> str:
    """``delete_sql`` (a DELETE of lock rows) that also notifies the waiters of each row deleted.

    Its row count stays the number of rows deleted. A permit's row
    (``task-lock:<key>\x1f<n>``) notifies the waiters of its key: the stored
    key up to the separator (U+001F, ``chr(31)``), which waiters watch.
    """
    table = delete_sql.split(" WHERE ", 1)[0].removeprefix("DELETE FROM ")
    key = f'{table}."key"'
    chosen = (
        "(SELECT l.pid::text FROM pg_locks l WHERE l.locktype = 'advisory' "
        f"AND l.classid = {NAMESPACE}::oid AND l.objid = hashtext(ended.key)::oid "
        "AND l.objsubid = 2 AND l.granted ORDER BY random() LIMIT 1)"
    )
    return (
        f"WITH ended AS ({delete_sql} RETURNING split_part({key}, chr(31), 1) AS key) "
        f"SELECT CASE WHEN pg_try_advisory_xact_lock({NAMESPACE}, hashtext(ended.key)) "
        f"THEN NULL ELSE pg_notify('{CHANNEL}', "
        f"ended.key || chr({ord(CHOSEN)}) || coalesce({chosen}, '')) END FROM ended"
    )


class PostgresListener(Listener):
    """The process's ``LISTEN`` connection to one PostgreSQL database (``alias``)."""

    def __init__(self, alias: str) -> None:
        super().__init__(f"postgres:{alias}")
        self.alias = alias
        self._raw: Any = None
        self._heard: list[str] = []
        self._psycopg3 = False
        #: The listening connection's server process id, as a release names it.
        self._pid = ""

    def _forget(self) -> None:
        super()._forget()
        self._raw, self._heard = None, []  # the parent's connection: left to the parent

    def _open(self) -> Any:
        wrapper: Any = connections[self.alias]
        params = {**wrapper.get_connection_params(), "application_name": APPLICATION_NAME}
        raw = wrapper.Database.connect(**params)
        raw.autocommit = True
        return raw

    def connect(self) -> bool:
        raw = self._raw = self._open()
        self._psycopg3 = hasattr(raw, "pgconn")
        if self._psycopg3:
            raw.add_notify_handler(lambda notify: self._heard.append(notify.payload))
        self._execute(f"LISTEN {CHANNEL}")
        cursor = raw.cursor()
        try:
            cursor.execute("SELECT pg_backend_pid()")  # the server's, through a pooler too
            self._pid = str(cursor.fetchone()[0])
        finally:
            cursor.close()
        probe = f"probe:{uuid.uuid4().hex}"
        sender = self._open()
        try:
            sender.cursor().execute("SELECT pg_notify(%s, %s)", [CHANNEL, probe])
        finally:
            sender.close()
        deadline = time.monotonic() + PROBE_WAIT
        while probe not in self._heard:
            left = deadline - time.monotonic()
            if left <= 0:  # deaf: PgBouncer's transaction pooling, say
                with contextlib.suppress(Exception):
                    self._execute("UNLISTEN *")  # not left on a pooled server connection
                self.close()
                return False
            with selectors.DefaultSelector() as selector:
                selector.register(self.fileno(), selectors.EVENT_READ)
                selector.select(left)
            self._drain()
        return True

    def _execute(self, sql: str, params: list[Any] | None = None) -> None:
        cursor = self._raw.cursor()
        try:
            cursor.execute(sql, params)
        finally:
            cursor.close()

    def add(self, stored: Iterable[str]) -> None:
        self._execute(
            f"SELECT pg_advisory_lock_shared({NAMESPACE}, hashtext(k)) FROM unnest(%s::text[]) k",
            [list(stored)],
        )

    def drop(self, stored: Iterable[str]) -> None:
        self._execute(
            f"SELECT pg_advisory_unlock_shared({NAMESPACE}, hashtext(k)) "
            "FROM unnest(%s::text[]) k",
            [list(stored)],
        )

    def fileno(self) -> int:
        return int(self._raw.fileno())

    def _drain(self) -> None:
        raw = self._raw
        if self._psycopg3:
            pgconn = raw.pgconn
            pgconn.consume_input()
            while (notify := pgconn.notifies()) is not None:
                self._heard.append(notify.extra.decode())
        else:
            raw.poll()
            while raw.notifies:
                self._heard.append(raw.notifies.pop(0).payload)

    def read(self) -> Iterable[str]:
        """The keys released, told now; those whose release chose another process, later."""
        self._drain()
        heard, self._heard = self._heard, []
        now: list[str] = []
        for payload in heard:
            key, _, chosen = payload.partition(CHOSEN)
            if chosen and chosen != self._pid:
                self.defer(key, LOOK_LATER)
            else:
                now.append(key)
        return now

    def close(self) -> None:
        raw, self._raw = self._raw, None
        self._heard = []
        if raw is not None:
            raw.close()


_listeners: dict[str, PostgresListener] = {}
_listeners_mutex = ForkSafeLock()


def listener_for(alias: str) -> PostgresListener:
    """The process's listener of the database ``alias`` (one, whatever the backends)."""
    with _listeners_mutex:
        listener = _listeners.get(alias)
        if listener is None:
            listener = _listeners[alias] = PostgresListener(alias)
        return listener
