"""Contract cases: a key marked "run once more" while it is held.

A backend with the capability ``rerun`` keeps, next to a key's lease, at most
one mark carrying the latest skipped call's payload (``mark_rerun``). Only a
live lease can be marked; the mark outlives the lease (its holder's release,
loss or death leaves it to the key's next holder), and the holder takes it
bound to its token (``take_rerun``), once, even when a take is sent twice or
arrives late.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from django_tasklock.api.service import new_token
from django_tasklock.backends.base import BaseBackend
from django_tasklock.testing.support import LIFE, LONG, ContractBackend, wait_until

_TAKES: dict[str, int] = {}


def take(backend: BaseBackend, key: str, token: str) -> str | None:
    """``backend.take_rerun`` as the lock calls it: the token's next take (1, 2, 3...)."""
    _TAKES[token] = _TAKES.get(token, 0) + 1
    return backend.take_rerun(key, token, _TAKES[token])


class RerunCases:
    """``mark_rerun``, ``take_rerun`` and ``rerun_marks``."""

    @pytest.fixture
    def rerun_backend(self, contract_backend: ContractBackend) -> BaseBackend:
        backend = contract_backend.backend
        if not backend.capabilities.rerun:
            pytest.skip(f"{contract_backend.name}: no rerun marks (the capability 'rerun' is off)")
        return backend

    def test_a_free_key_is_not_marked(self, rerun_backend: BaseBackend, key: str) -> None:
        backend = rerun_backend
        assert not backend.mark_rerun(key, "lost")
        assert backend.rerun_marks(key) == {}
        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert take(backend, key, token) is None, "a mark written while nobody held the key"
        assert backend.release(key, token)

    def test_the_holder_takes_the_latest_mark_once(
        self, rerun_backend: BaseBackend, key: str
    ) -> None:
        backend, token = rerun_backend, new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert take(backend, key, token) is None
        for payload in ("first", "second", "third"):
            assert backend.mark_rerun(key, payload)
        marks = backend.rerun_marks(key)
        assert list(marks) == [key]
        assert marks[key].tzinfo is not None
        assert key in backend.rerun_marks()
        assert take(backend, key, token) == "third", "many marks must make one, the latest"
        assert backend.rerun_marks(key) == {}
        assert take(backend, key, token) is None, "a mark was taken twice"
        assert backend.mark_rerun(key, "")  # an empty payload is a mark too
        assert take(backend, key, token) == ""
        assert backend.release(key, token)

    def test_only_the_holder_takes_the_mark(self, rerun_backend: BaseBackend, key: str) -> None:
        backend, token = rerun_backend, new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.mark_rerun(key, "work")
        assert take(backend, key, new_token()) is None
        assert take(backend, key + "-other", token) is None
        assert backend.rerun_marks(key + "-other") == {}
        assert take(backend, key, token) == "work"
        assert backend.release(key, token)

    def test_a_release_leaves_the_mark_to_the_next_holder(
        self, rerun_backend: BaseBackend, key: str
    ) -> None:
        backend, token, successor = rerun_backend, new_token(), new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.mark_rerun(key, "owed")
        assert backend.release(key, token)
        assert take(backend, key, token) is None, "taken by a token that let go"
        assert list(backend.rerun_marks(key)) == [key]
        assert backend.acquire(key, successor, ttl=LONG, max_lifetime=LIFE)
        assert take(backend, key, successor) == "owed"
        assert backend.release(key, successor)

    def test_a_lease_run_out_leaves_the_mark_to_the_next_holder(
        self, rerun_backend: BaseBackend, key: str
    ) -> None:
        backend, token, successor = rerun_backend, new_token(), new_token()
        assert backend.acquire(key, token, ttl=timedelta(seconds=0.3), max_lifetime=LIFE)
        assert backend.mark_rerun(key, "owed")
        wait_until(lambda: backend.peek(key) is None, timeout=30)
        assert take(backend, key, token) is None, "taken by a token whose lease ran out"
        assert not backend.mark_rerun(key, "too late"), "a key nobody holds was marked"
        assert backend.acquire(key, successor, ttl=LONG, max_lifetime=LIFE)
        assert take(backend, key, successor) == "owed"
        assert backend.release(key, successor)

    def test_a_force_released_key_is_not_marked(
        self, rerun_backend: BaseBackend, key: str
    ) -> None:
        backend, token = rerun_backend, new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.force_release(key) is not None
        assert not backend.mark_rerun(key, "nobody")
        assert backend.rerun_marks(key) == {}

    def test_a_take_sent_again_answers_the_same(
        self, rerun_backend: BaseBackend, key: str
    ) -> None:
        backend, token = rerun_backend, new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.mark_rerun(key, "first")
        assert backend.take_rerun(key, token, 1) == "first"
        assert backend.take_rerun(key, token, 1) == "first", (
            "the take sent again (its reply lost) lost the payload the first took"
        )
        assert backend.mark_rerun(key, "second")
        # A copy of the first take arriving late: never takes the newer mark.
        assert backend.take_rerun(key, token, 1) == "first"
        assert list(backend.rerun_marks(key)) == [key]
        assert backend.take_rerun(key, token, 2) == "second"
        assert backend.release(key, token)

    def test_a_take_arriving_after_a_later_one_takes_nothing(
        self, rerun_backend: BaseBackend, key: str
    ) -> None:
        """Take 1 answered (sent again), take 2 found nothing, a new mark: take 1's first
        copy, arriving now, must leave that mark to take 3."""
        backend, token = rerun_backend, new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.mark_rerun(key, "first")
        assert backend.take_rerun(key, token, 1) == "first"
        assert backend.take_rerun(key, token, 2) is None
        assert backend.mark_rerun(key, "second")
        assert backend.take_rerun(key, token, 1) is None, "a late copy took a newer mark"
        assert backend.take_rerun(key, token, 3) == "second"
        assert backend.release(key, token)

    def test_a_take_that_found_nothing_arriving_late_takes_nothing(
        self, rerun_backend: BaseBackend, key: str
    ) -> None:
        """Take 1 found no mark (its answer given, sent again); a mark comes; take 1's first
        copy arrives: it answers as before, and the mark waits for take 2."""
        backend, token = rerun_backend, new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.take_rerun(key, token, 1) is None
        assert backend.mark_rerun(key, "owed")
        assert backend.take_rerun(key, token, 1) is None, "a late copy took a newer mark"
        assert list(backend.rerun_marks(key)) == [key]
        assert backend.take_rerun(key, token, 2) == "owed"
        assert backend.release(key, token)

    def test_a_mark_sent_twice_marks_once(self, rerun_backend: BaseBackend, key: str) -> None:
        backend, token = rerun_backend, new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.mark_rerun(key, "once")
        assert backend.mark_rerun(key, "once")
        assert take(backend, key, token) == "once"
        assert take(backend, key, token) is None
        assert backend.release(key, token)

    def test_marks_are_kept_apart_per_key(self, rerun_backend: BaseBackend, key: str) -> None:
        backend, token, other = rerun_backend, new_token(), new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.acquire(key + "-b", other, ttl=LONG, max_lifetime=LIFE)
        assert backend.mark_rerun(key + "-b", "b")
        assert backend.rerun_marks(key) == {}
        assert take(backend, key, token) is None
        assert take(backend, key + "-b", other) == "b"
        assert backend.release(key, token)
        assert backend.release(key + "-b", other)

    def test_payloads_are_kept_as_given(self, rerun_backend: BaseBackend, key: str) -> None:
        backend, token = rerun_backend, new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        payload = '{"args": ["résumé", "\\u0000"], "kwargs": {"n": 1}}' + "x" * 20_000
        assert backend.mark_rerun(key, payload)
        assert take(backend, key, token) == payload
        assert backend.release(key, token)

    def test_a_mark_racing_the_release_is_taken_or_refused(
        self, rerun_backend: BaseBackend, key: str
    ) -> None:
        """A mark written while the lease holds is found after the release; one refused
        found the key free: never a mark accepted and found by nobody."""
        backend = rerun_backend
        for round_ in range(20):
            token = new_token()
            assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
            marked: list[bool] = []

            def mark(found: list[bool] = marked) -> None:
                try:
                    found.append(backend.mark_rerun(key, "r"))
                finally:
                    backend.close()  # this thread's connections

            marker = threading.Thread(target=mark)
            marker.start()
            released = backend.release(key, token)
            marker.join(60)
            assert released, round_
            assert marked, round_
            found = backend.rerun_marks(key)
            assert bool(found) == marked[0], (round_, marked, found)
            if found:  # left for the next holder: take it, for the next round
                successor = new_token()  # the released token's own would be refused
                assert backend.acquire(key, successor, ttl=LONG, max_lifetime=LIFE)
                assert take(backend, key, successor) == "r"
                assert backend.release(key, successor)
