"""One lock: its options and their validation, keys, acquire / wait / release.

:class:`~django_tasklock.locking.lock.Lock` (sync and asyncio) takes one key
through the backend contract, holds it as a lease of ``leases``, waits with a
jittered backoff, keeps a grant made inside the caller's transaction until
that transaction ends, and lets the work act on a loss.

May import: ``leases``, ``backends`` and the base modules. Never ``api`` or
anything above it.
"""
