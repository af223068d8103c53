"""The Redis release: by the token, leaving a tombstone that a release sent again recognises.

A client that retries may have run the release already (its reply lost):
ending a lease leaves ``tasklock-released:{<tag>}<key>@<token>`` for 60 s (see
``scripts``), which the same release sent again finds: ``GONE``, not ``LOST``.

On Redis Cluster, while the lease's slot is being migrated (``MIGRATING`` /
``IMPORTING``, its keys split between two masters), a script runs only on a
node that has every key it names, and the tombstone never exists before the
release: the two-key script is refused (``TRYAGAIN``) on both nodes for as long
as the migration lasts, which would leave the key held until its ``ttl`` ran
out. The release is then sent as a one-key script (which the cluster serves on
whichever node has the lease, following ``ASK``) without a tombstone; one that
finds the key gone reads the tombstone on its own (a release sent before the
migration began may have left it).
"""

from __future__ import annotations

from django_tasklock.backends.base import Released, storage_key
from django_tasklock.backends.redis.calls import Scripts
from django_tasklock.backends.redis.replies import text
from django_tasklock.backends.redis.scripts import RELEASED_MS, tombstone_key

_OUTCOMES = {1: Released.RELEASED, 2: Released.GONE}


def release_lease(scripts: Scripts, key: str, token: str, hold_ms: int) -> Released:
    """Release ``token``'s lease of ``key`` (``hold_ms`` > 0: end it at acquisition + that)."""
    stored, tombstone = storage_key(key), tombstone_key(key, token)
    try:
        reply = scripts.run("release", [stored, tombstone], [token, hold_ms, RELEASED_MS])
    except Exception as exc:
        from redis.exceptions import ClusterError, TryAgainError

        # redis-py gives up on a TRYAGAIN that lasts with "TTL exhausted" (a bare
        # ClusterError; it says the same after too many MOVED or ASK redirects,
        # which the one-key script also serves). Any other error (CLUSTERDOWN in
        # a failover, a master gone) is raised: sent again later, this release
        # leaves its tombstone.
        half_migrated = isinstance(exc, TryAgainError) or type(exc) is ClusterError
        if not scripts.cluster or not half_migrated:
            raise
        reply = scripts.run("release_alone", [stored], [token, hold_ms])
        if int(reply) == 3 and text(scripts.client.get(tombstone) or b"") == token:
            reply = 2
    return _OUTCOMES.get(int(reply), Released.LOST)
