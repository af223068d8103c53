"""Contract cases: namespacing, peek/list/clear_stale, bad input.

docs/guarantees.md, "What you can rely on", item 10 and the paragraph on bad input.
"""

from __future__ import annotations

import functools
import time
from datetime import timedelta
from typing import Any

import pytest

from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.base import KEY_PREFIX, BaseBackend, Holder, lease_id, storage_key
from django_tasklock.testing.support import (
    LIFE,
    LONG,
    ContractBackend,
    require,
)


async def _async_work(value: int = 0) -> int:  # pragma: no cover - never called
    return value


class OperationCases:
    """The namespace and the operators' view, and what callers may not pass."""

    # -- 10. namespacing -------------------------------------------------------------

    def test_stored_key_is_exactly_prefixed(
        self, contract_backend: ContractBackend, key: str
    ) -> None:
        stored_keys = require(contract_backend, "stored_keys")
        token = new_token()
        assert contract_backend.backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert KEY_PREFIX + key in stored_keys()
        assert contract_backend.backend.release(key, token)
        assert KEY_PREFIX + key not in stored_keys()

    def test_entries_outside_the_namespace_are_never_touched(
        self, contract_backend: ContractBackend, key: str
    ) -> None:
        put_foreign, stored_keys = (
            require(contract_backend, "put_foreign"),
            require(contract_backend, "stored_keys"),
        )
        backend = contract_backend.backend
        # The prefix is matched case-sensitively (SQLite's LIKE is not).
        foreign = {f"cache:{key}", f"task-lock{key}", key, f"TASK-LOCK:{key}"}
        for stored in foreign:
            put_foreign(stored)
        if contract_backend.plant is not None:
            # A live row that looks like a lease but for the case of its prefix.
            foreign.add(f"Task-Lock:{key}")
            contract_backend.plant(f"Task-Lock:{key}", new_token(), timedelta(0), LONG)
        backend.acquire(key, new_token(), ttl=timedelta(seconds=0.2), max_lifetime=LIFE)
        time.sleep(0.3)
        backend.clear_stale()
        assert not backend.force_release(f"../{key}")
        assert all(held.key != key for held in backend.list())
        assert foreign <= stored_keys()

    def test_keys_compare_byte_for_byte(self, backend: BaseBackend, key: str) -> None:
        # Case, trailing spaces and accents make different keys, whatever a
        # database's default collation would fold.
        keys = sorted(
            f"{key}-{each}" for each in ("Report", "report", "report ", "résumé", "resume")
        )
        tokens = {each: new_token() for each in keys}
        for each in keys:
            assert backend.acquire(each, tokens[each], ttl=LONG, max_lifetime=LIFE), each
        assert sorted(held.key for held in backend.list() if held.key.startswith(key)) == keys
        for each in keys:
            held = backend.peek(each)
            assert held is not None
            assert held.key == each
            assert backend.release(each, tokens[each]), each

    # -- operating: peek, list, clear_stale ----------------------------------------------

    def test_peek_and_list_show_live_leases_only(self, backend: BaseBackend, key: str) -> None:
        life = timedelta(hours=1)
        assert backend.acquire(
            key + "-b", new_token(), ttl=timedelta(seconds=30), max_lifetime=life
        )
        assert backend.acquire(
            key + "-a", new_token(), ttl=timedelta(seconds=30), max_lifetime=life
        )
        assert backend.acquire(
            key + "-x", new_token(), ttl=timedelta(seconds=0.2), max_lifetime=life
        )
        time.sleep(0.3)
        mine = [held for held in backend.list() if held.key.startswith(key)]
        assert [held.key for held in mine] == [key + "-a", key + "-b"]
        for held in mine:
            assert held.acquired_at < held.expires_at
            assert 29 <= held.seconds_left <= 30
            assert abs((held.expires_at - held.acquired_at).total_seconds() - 30) < 1
        assert backend.peek(key + "-x") is None

    def test_a_value_the_lock_did_not_write_shows_an_unknown_holder(
        self, contract_backend: ContractBackend, key: str
    ) -> None:
        # Another tool's live row in the namespace, or a damaged one: it holds
        # its key, but never breaks peek or list for every other lock.
        plant = require(contract_backend, "plant")
        backend = contract_backend.backend
        foreign = {
            f"{key}-superscript-pid": "host:\u00b2:secret",  # isdigit(), but not int()
            f"{key}-arabic-pid": "host:\u0663:secret",  # int() would read 3
            f"{key}-huge-pid": "host:" + "9" * 5000 + ":secret",  # past int()'s digit limit
            f"{key}-no-secret": "host:12:",
            f"{key}-no-token": "not a lock",
            f"{key}-empty": "",
        }
        for foreign_key, value in foreign.items():
            plant(storage_key(foreign_key), value, timedelta(0), LONG)
        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        listed = {held.key: held for held in backend.list() if held.key.startswith(key)}
        assert set(listed) == {key, *foreign}
        assert listed[key].holder == Holder.from_token(token)
        assert listed[key].holder.pid is not None
        for foreign_key in foreign:
            assert listed[foreign_key].holder == Holder("?", None), foreign_key
            seen = backend.peek(foreign_key)
            assert seen is not None
            assert seen.holder == Holder("?", None), foreign_key
            assert not backend.acquire(foreign_key, new_token(), ttl=LONG, max_lifetime=LIFE)

    def test_clear_stale_deletes_expired_and_abandoned_leases_only(
        self, contract_backend: ContractBackend, backend: BaseBackend, key: str
    ) -> None:
        # Without planting a 24 h old lease and looking at the storage, neither
        # the counts nor dry_run could be checked: skip, never pass silently.
        plant = require(contract_backend, "plant")
        stored_keys = require(contract_backend, "stored_keys")
        life = timedelta(hours=1)
        assert backend.acquire(key + "-live", new_token(), ttl=LONG, max_lifetime=life)
        assert backend.acquire(
            key + "-gone", new_token(), ttl=timedelta(seconds=0.2), max_lifetime=life
        )
        abandoned = {storage_key(key + "-old"), storage_key(key + "-older")}
        for stored in abandoned:
            plant(stored, new_token(), timedelta(hours=25), LIFE)
        time.sleep(0.3)
        # Counts are of the whole storage, which other tests may share: ask
        # only for what this test planted. (A storage with its own expiry may
        # already have dropped the "-gone" lease by itself.)
        stale = abandoned | {storage_key(key + "-gone")}
        before = stale & stored_keys()
        assert abandoned <= before
        assert backend.clear_stale(dry_run=True) >= len(abandoned)
        assert before <= stored_keys(), "a dry run deleted something"
        assert storage_key(key + "-live") in stored_keys()
        assert backend.clear_stale() >= len(abandoned)
        assert not stale & stored_keys()
        assert backend.peek(key + "-live") is not None
        assert backend.force_release(key + "-live")

    # -- force release of the lease shown -------------------------------------------

    def test_force_release_ends_the_lease_named_and_says_which(
        self, backend: BaseBackend, key: str
    ) -> None:
        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        shown = backend.peek(key)
        assert shown is not None
        assert shown.lease == lease_id(token)
        assert token not in repr(shown), "the token is never shown"
        released = backend.force_release(key, shown.lease)
        assert released is not None
        assert released.lease == shown.lease
        assert backend.peek(key) is None
        assert backend.force_release(key, shown.lease) is None, "nothing left to end"
        assert backend.force_release(key) is None

    def test_force_release_of_a_lease_that_changed_hands_ends_nothing(
        self, backend: BaseBackend, key: str
    ) -> None:
        first, second = new_token(), new_token()
        assert backend.acquire(key, first, ttl=LONG, max_lifetime=LIFE)
        shown = backend.peek(key)  # what the operator's page showed
        assert shown is not None
        assert backend.release(key, first)
        assert backend.acquire(key, second, ttl=LONG, max_lifetime=LIFE)
        assert backend.force_release(key, shown.lease) is None
        now = backend.peek(key)
        assert now is not None
        assert now.lease == lease_id(second) != shown.lease
        assert backend.refresh(key, second, ttl=LONG, max_lifetime=LIFE)
        # Without a lease named, the holder of the moment is released, and named.
        released = backend.force_release(key)
        assert released is not None
        assert released.lease == lease_id(second)
        assert not backend.refresh(key, second, ttl=LONG, max_lifetime=LIFE)

    # -- bad input ---------------------------------------------------------------------

    @pytest.mark.parametrize(
        ("kwargs", "error", "names"),
        [
            ({"key": ""}, ValueError, "key"),
            ({"key": 7}, TypeError, "key"),
            ({"key": "k" * 246}, ValueError, "key"),
            ({"fn": "not callable"}, TypeError, "fn"),
            ({"ttl": 0}, ValueError, "ttl"),
            ({"ttl": -1}, ValueError, "ttl"),
            ({"ttl": timedelta(0)}, ValueError, "ttl"),
            ({"ttl": "60"}, TypeError, "ttl"),
            ({"ttl": True}, TypeError, "ttl"),
            ({"ttl": float("nan")}, ValueError, "ttl"),
            ({"refresh_interval": 0}, ValueError, "refresh_interval"),
            ({"ttl": 10, "refresh_interval": 10}, ValueError, "refresh_interval"),
            ({"max_lifetime": 0}, ValueError, "max_lifetime"),
            ({"max_lifetime": timedelta(hours=24, seconds=1)}, ValueError, "max_lifetime"),
            ({"on_locked": 3}, TypeError, "on_locked"),
            # Nothing that rounds to zero, nothing too large to store.
            ({"ttl": 1e-7}, ValueError, "ttl"),
            ({"refresh_interval": 1e-7}, ValueError, "refresh_interval"),
            ({"max_lifetime": 1e-7}, ValueError, "max_lifetime"),
            ({"max_lifetime": timedelta(microseconds=1)}, ValueError, "max_lifetime"),
            ({"ttl": 1e14}, ValueError, "ttl"),
            ({"ttl": 10**400}, ValueError, "ttl"),
            ({"ttl": float("inf")}, ValueError, "ttl"),
            ({"ttl": timedelta.max}, ValueError, "ttl"),
            ({"refresh_interval": 10**400}, ValueError, "refresh_interval"),
            ({"max_lifetime": timedelta.max}, ValueError, "max_lifetime"),
            # Keys every storage can hold, the same on every backend.
            ({"key": "nul\x00key"}, ValueError, "key"),
            ({"key": "lone-\ud800-surrogate"}, ValueError, "key"),
            # A coroutine function would never be awaited: the message names the twin.
            ({"fn": _async_work}, TypeError, "arun_exclusive"),
            ({"fn": functools.partial(_async_work, 1)}, TypeError, "arun_exclusive"),
            ({"on_locked": _async_work}, TypeError, "arun_exclusive"),
        ],
    )
    def test_bad_input_is_rejected_before_anything_is_written(
        self,
        backend: BaseBackend,
        key: str,
        kwargs: dict[str, Any],
        error: type[Exception],
        names: str,
    ) -> None:
        ran: list[bool] = []
        call: dict[str, Any] = {"key": key, "fn": lambda: ran.append(True), **kwargs}
        with pytest.raises(error, match=names):
            TaskLockService(backend).run_exclusive(call.pop("key"), call.pop("fn"), **call)
        assert ran == []
        assert backend.peek(key) is None

    def test_longest_key_is_accepted(self, service: TaskLockService, key: str) -> None:
        longest = (key + "k" * 245)[:245]
        assert service.run_exclusive(longest, lambda: True).result is True
