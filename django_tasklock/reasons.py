"""Why a lease was lost: the ``reason`` of ``lock_lost`` and of a lost lock.

Stable strings: compare with these constants (or the strings themselves).
"""

from __future__ import annotations

#: No refresh was confirmed before the lease's local deadline (the last
#: confirmed refresh, or the acquisition, was sent ``ttl`` ago): the storage may
#: have let it expire, whatever the reason (paused process, storage stalled or
#: unreachable, an acquisition answered after its ``ttl``).
EXPIRED = "expired"
#: A refresh or the release found the key held by another lease.
TAKEN = "taken"
#: A refresh or the release found the key free before the local deadline (a
#: release sent twice that finds its own lease gone is no loss):
#: someone deleted the lease (``manage.py tasklock release``, the admin, a
#: hand-written DELETE), or the storage lost it (a Redis restarted without
#: persistence).
RELEASED_BY_OPERATOR = "released_by_operator"
#: The lease reached acquisition + ``max_lifetime``: no longer extended.
MAX_LIFETIME = "max_lifetime"

REASONS = (EXPIRED, TAKEN, RELEASED_BY_OPERATOR, MAX_LIFETIME)
