"""Which MariaDB sessions wait for a row lock, read from ``SHOW ENGINE INNODB STATUS``.

Not from ``information_schema.INNODB_TRX`` / ``INNODB_LOCK_WAITS``: InnoDB
fills those from a cache it refreshes only when nobody read it in the last
0.1 s, server-wide, so another poller of the same server (the other tox
environment, run side by side, in the same test) can keep it from ever
refreshing, and the wait is never seen. The status is made when asked.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

_THREAD = re.compile(r"^MariaDB thread id (\d+),", re.MULTILINE)
_WAITED = re.compile(r"^------- TRX HAS BEEN WAITING .*\n(.*)$", re.MULTILINE)


class RowWait(NamedTuple):
    thread_id: int
    #: The lock waited for: "RECORD LOCKS space id 5 page no 3 ... of table `db`.`t` ..."
    lock: str


def innodb_row_waits(connection: Any) -> list[RowWait]:
    """The sessions of the server whose transaction is in LOCK WAIT, and what they wait for."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW ENGINE INNODB STATUS")
        status = cursor.fetchone()[2]
    waits = []
    for block in status.split("\n---TRANSACTION ")[1:]:
        thread, waited = _THREAD.search(block), _WAITED.search(block)
        if "\nLOCK WAIT " in block and thread and waited:
            waits.append(RowWait(int(thread.group(1)), waited.group(1)))
    return waits
