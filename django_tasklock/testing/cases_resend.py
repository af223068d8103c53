"""Contract cases: a call sent twice has the outcome of sending it once.

docs/guarantees.md, "What you can rely on", item 11. A reply lost after the storage
acted makes a call go out again (the backend's own retry, or the client
library's). The second sending must not turn a won acquisition into a lease
nobody runs, nor end another's lease.
``django_tasklock.testing.proxy.FaultProxy`` loses replies for real; these
cases send the same call twice, which is what the storage sees then.
"""

from __future__ import annotations

from datetime import timedelta

from django_tasklock.api.service import new_token
from django_tasklock.backends.base import BaseBackend, Released, lease_id
from django_tasklock.testing.support import LIFE, LONG


class ResendCases:
    """Acquire, refresh, release and force release, each sent twice."""

    def test_acquire_sent_again_by_its_own_token_is_acquired(
        self, backend: BaseBackend, key: str
    ) -> None:
        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE), (
            "an acquisition sent again found its own lease and called it held"
        )
        assert not backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
        held = backend.peek(key)
        assert held is not None
        assert held.lease == lease_id(token)
        assert backend.release(key, token)
        assert backend.peek(key) is None

    def test_acquire_arriving_after_its_min_hold_release_is_not_acquired(
        self, backend: BaseBackend, key: str
    ) -> None:
        """Late: its lease was cut to end at ``min_hold`` by its release; it is not the token's."""
        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.release(key, token, min_hold=timedelta(seconds=20))
        assert not backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE), (
            "a late acquisition was told it holds a lease its release ended"
        )
        assert not backend.refresh(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.peek(key) is not None  # still held until min_hold, by nobody's work

    def test_refresh_sent_again_answers_the_same(self, backend: BaseBackend, key: str) -> None:
        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.refresh(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.refresh(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.release(key, token)

    def test_release_says_what_it_found(self, backend: BaseBackend, key: str) -> None:
        token, successor = new_token(), new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.release_outcome(key, token) is Released.RELEASED
        # Sent again: nothing of ours, nobody else's. A backend that knows it
        # was sent once may call that a loss; it is never "released".
        assert backend.release_outcome(key, token) in {Released.GONE, Released.LOST}
        assert backend.acquire(key, successor, ttl=LONG, max_lifetime=LIFE)
        # Sent again once the key is someone else's: a backend that knows this
        # release ended the lease (Redis: its tombstone) says so; one that cannot
        # tell calls it a loss. Never "released", nor the successor's lease ended.
        assert backend.release_outcome(key, token) in {Released.GONE, Released.LOST}
        assert backend.release(key, successor), "a release sent again ended the successor's lease"

    def test_release_finding_the_key_someone_elses_after_a_force_release_is_a_loss(
        self, backend: BaseBackend, key: str
    ) -> None:
        token, successor = new_token(), new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.force_release(key) is not None  # ended by an operator, not by token
        assert backend.acquire(key, successor, ttl=LONG, max_lifetime=LIFE)
        assert backend.release_outcome(key, token) is Released.LOST, "someone else's is a loss"
        assert backend.release(key, successor), "the release ended the successor's lease"
