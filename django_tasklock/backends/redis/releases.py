"""The Redis release: by the token, leaving a tombstone that a release sent again recognises.

A client that retries may have run the release already (its reply lost):
ending a lease leaves ``tasklock-released:{<tag>}<key>@<token>`` for as long as
the client may go on sending it (its retry window, at least 60 s: see
``retries``), which the same release sent again finds: ``GONE``, not ``LOST``.

On Redis Cluster, while the lease's slot is being migrated (``MIGRATING`` /
``IMPORTING``, its keys split between two masters), a script runs only on a
node that has every key it names, and the tombstone never exists before the
release: the two-key script is refused (``TRYAGAIN``) on both nodes for as long
as the migration lasts, which would leave the key held until its ``ttl`` ran
out. The release is then sent as a one-key script (which the cluster serves on
whichever node has the lease, following ``ASK``) without a tombstone; one that
does not find its lease reads the tombstone on its own (a release sent before the
migration began may have left it).

The same release sent again finds its tombstone and answers ``GONE`` whoever
holds the key now: its first sending ended the lease (a successor may have
taken the key since), so that is no loss.
"""

from __future__ import annotations

from django_tasklock.backends.base import PERMIT_SEPARATOR, Released
from django_tasklock.backends.redis.calls import Scripts
from django_tasklock.backends.redis.replies import text
from django_tasklock.backends.redis.scripts import held_at, tombstone_key

_OUTCOMES = {1: Released.RELEASED, 2: Released.GONE}


def release_lease(scripts: Scripts, key: str, token: str, hold_ms: int) -> Released:
    """Release ``token``'s lease of ``key`` (``hold_ms`` > 0: end it at acquisition + that)."""
    stored, tombstone = held_at(key), tombstone_key(key, token)
    permit = (key.rpartition(PERMIT_SEPARATOR)[2],) if PERMIT_SEPARATOR in key else ()
    try:
        args = [token, hold_ms, scripts.tombstone_ms, *permit]
        reply = scripts.run("release", [stored, tombstone], args)
    except Exception as exc:
        # redis-py gives up on a TRYAGAIN that lasts with "TTL exhausted" (a bare
        # ClusterError; it says the same after too many MOVED or ASK redirects,
        # which the one-key script also serves). Any other error (CLUSTERDOWN in
        # a failover, a master gone) is raised: sent again later, this release
        # leaves its tombstone.
        if not scripts.cluster or not half_migrated(exc):
            raise
        reply = scripts.run("release_alone", [stored], [token, hold_ms, *permit])
        mark = PERMIT_SEPARATOR.join((token, *permit))  # a permit's names its number
        if int(reply) in (0, 3) and text(scripts.client.get(tombstone) or b"") == mark:
            reply = 2
    return _OUTCOMES.get(int(reply), Released.LOST)


def half_migrated(exc: Exception) -> bool:
    """Whether ``exc`` is a cluster's refusal of a script whose keys a migration split:
    ``TRYAGAIN``, or redis-py giving up on it ("TTL exhausted", a bare ``ClusterError``;
    also said after too many ``MOVED`` or ``ASK`` redirects, which one key serves too)."""
    from redis.exceptions import ClusterError, TryAgainError

    return isinstance(exc, TryAgainError) or type(exc) is ClusterError
