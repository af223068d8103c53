"""The table the database backend keeps its leases in."""

from __future__ import annotations

from django.db import models


class CacheEntry(models.Model):
    """One row of ``cache_entries``.

    Lock rows have keys starting with ``task-lock:``; other rows may belong to
    general caching and are never touched by the lock service. The primary key
    makes two concurrent acquisitions of one key impossible.
    """

    key = models.CharField(max_length=255, primary_key=True)
    value = models.TextField()
    expires_at = models.DateTimeField(db_index=True)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "cache_entries"
        # What the admin shows of it: the held locks (its permission codenames,
        # view_cacheentry and force_release, are those of the model, and stay).
        verbose_name = "task lock"
        verbose_name_plural = "task locks"
        permissions = [("force_release", "Can force-release task locks")]

    def __str__(self) -> str:
        return self.key


class FenceCounter(models.Model):
    """The last fencing token handed out for a key (the caller's key, no prefix).

    Kept apart from ``cache_entries`` so that no sweep of lock rows (expiry,
    the 24 h cap, ``clear_stale``, a force release) can ever reset it.
    """

    key = models.CharField(max_length=255, primary_key=True)
    value = models.BigIntegerField()

    class Meta:
        db_table = "tasklock_fences"
        verbose_name = "fence counter"
        verbose_name_plural = "fence counters"

    def __str__(self) -> str:
        return f"{self.key}: {self.value}"


class ForcedRelease(models.Model):
    """A lease an operator ended by force, named by its token's digest, kept for 24 h.

    A holder whose release was sent again on a new connection (the first
    connection died with it under way) and finds its row gone cannot tell from
    ``cache_entries`` whether its own first sending deleted the row or an
    operator did: the database keeps no trace of a DELETE. A force release
    writes this row in the transaction that deletes the lease, so the holder
    asks here (see ``backends.database.releases``). Rows older than 24 h (the
    longest a lease can live) are deleted by the next force release.
    """

    #: The SHA-256 of the lease's token, in hex: never the token itself.
    lease = models.CharField(max_length=64, primary_key=True)
    released_at = models.DateTimeField(db_index=True)

    class Meta:
        db_table = "tasklock_forced_releases"
        verbose_name = "forced release"
        verbose_name_plural = "forced releases"

    def __str__(self) -> str:
        return self.lease


class RerunMark(models.Model):
    """A key marked "run once more" while it was held (``on_locked="rerun"``).

    One row per key ever marked (the caller's key, no prefix), kept apart
    from ``cache_entries`` so that no sweep of lock rows ends a mark: a mark
    outlives the lease it was set on, for the key's next holder. ``payload``
    is the latest skipped call's (NULL: not marked now); ``taken_by``,
    ``taken_number`` and ``taken`` are the last take by a live holder (its
    token, the take's number, its answer), so that the same take sent again
    (its reply lost) answers alike, and an earlier one arriving late takes nothing.
    """

    key = models.CharField(max_length=255, primary_key=True)
    payload = models.TextField(null=True)  # noqa: DJ001 - NULL: no mark; "" is one
    marked_at = models.DateTimeField(null=True)
    taken_by = models.TextField(default="")
    taken_number = models.BigIntegerField(default=0)
    taken = models.TextField(null=True)  # noqa: DJ001 - as payload

    class Meta:
        db_table = "tasklock_reruns"
        verbose_name = "rerun mark"
        verbose_name_plural = "rerun marks"

    def __str__(self) -> str:
        return self.key
