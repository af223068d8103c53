"""The database backend: leases as rows of the ``cache_entries`` table.

One module a concern, the way Django's ``db/backends/<vendor>/`` reads:
``backend`` (the backend class), ``acquisitions`` (the INSERT that takes a
key, and the take-over of a stale row), ``releases`` (the statements that end
a lease, and what they found), ``statements`` (its compiled SQL),
``connections`` (which connection each statement uses, and the acquire's
savepoint), ``retries`` (re-sending after a dead connection, a busy file or a
deadlock), ``timeouts`` (the refresh's statement timeout, scoped to it),
``rows`` (which rows are live or stale), ``functions`` (the server's UTC
clock), ``fences``, ``checks`` (its system check) and ``postgres`` (the
variant that insists on PostgreSQL).
"""

from django_tasklock.backends.database.backend import DatabaseBackend
from django_tasklock.backends.database.postgres import PostgresBackend

__all__ = ["DatabaseBackend", "PostgresBackend"]
