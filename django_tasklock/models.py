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
        verbose_name = "cache entry"
        verbose_name_plural = "cache entries"
        permissions = [("force_release", "Can force-release task locks")]

    def __str__(self) -> str:
        return self.key
