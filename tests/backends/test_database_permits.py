"""What only the database backend does for permits: the anchor row, and the statements sent."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_tasklock.api.service import new_token
from django_tasklock.backends.base import permit_key, storage_key
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.models import CacheEntry
from tests.backends.test_database import _kinds, _statements_sent, alias
from tests.conftest import require_service

__all__ = ["alias"]  # the fixture of test_database, used here

pytestmark = [pytest.mark.databases, pytest.mark.django_db(transaction=True, databases="__all__")]

LONG, LIFE = timedelta(seconds=30), timedelta(hours=1)


def test_a_limited_keys_anchor_row_keeps_its_limit_and_goes_with_the_next_mutex(
    alias: str, key: str
) -> None:
    backend = DatabaseBackend(using=alias)
    token = new_token()
    name = backend.acquire_permit(key, token, limit=3, ttl=LONG, max_lifetime=LIFE)
    assert name == permit_key(key, 0)
    rows = CacheEntry.objects.using(alias)
    assert rows.get(key=storage_key(key)).value == "\x1flimit=3"
    assert rows.get(key=storage_key(name)).value == token
    assert backend.release(name, token)
    assert rows.filter(key=storage_key(key)).exists()  # the anchor stays after its permits

    mutex = new_token()
    assert backend.acquire(key, mutex, ttl=LONG, max_lifetime=LIFE)  # the anchor goes
    assert rows.get(key=storage_key(key)).value == mutex
    assert backend.release(key, mutex)


def test_a_permit_is_one_transaction_of_four_writes_at_most_on_postgres(key: str) -> None:
    """BEGIN, the anchor's lock, one SELECT, the anchor and the permit written, COMMIT."""
    require_service("postgres")
    backend = DatabaseBackend(using="postgres")
    terms = {"limit": 2, "ttl": LONG, "max_lifetime": LIFE}
    backend.peek("warm-up")  # connect outside the measurement
    a, b, c = new_token(), new_token(), new_token()
    first = _statements_sent("postgres", lambda: backend.acquire_permit(key, a, **terms))
    assert _kinds(first) == ["BEGIN", "UPDATE", "SELECT", "INSERT", "INSERT", "COMMIT"], first
    second = _statements_sent("postgres", lambda: backend.acquire_permit(key, b, **terms))
    assert _kinds(second) == ["BEGIN", "UPDATE", "SELECT", "UPDATE", "INSERT", "COMMIT"], second
    refused = _statements_sent("postgres", lambda: backend.acquire_permit(key, c, **terms))
    assert _kinds(refused) == ["BEGIN", "UPDATE", "SELECT", "COMMIT"], refused
    assert backend.release(permit_key(key, 0), a)
    assert backend.release(permit_key(key, 1), b)
