"""A storage whose clock a test steps forward: a stand-in for an NTP step on the server.

A storage clock that jumps ``s`` seconds ahead is, to every lease stored there,
the same as every stored time moved ``s`` seconds back under a clock that did
not jump: each comparison the storage makes is between a stored time and its
"now". :meth:`SteppedClock.step` does the latter, in one statement (one script
per key on Redis), and from then on :meth:`SteppedClock.storage_time` reads
the clock ``s`` seconds ahead, as the real one would. PostgreSQL under
libfaketime steps for real in ``tests/faults/test_storage_clock.py``; Redis
does not run under libfaketime, and SQLite's clock is the host's, shared by the
test itself.
"""

from __future__ import annotations

import threading
from datetime import timedelta

from django.db.models import F

from django_tasklock.backends.base import KEY_PREFIX, BaseBackend
from django_tasklock.testing.delegate import DelegatingBackend

# One lease's stored times moved back ARGV[1] ms: the acquisition in its value,
# and its TTL (a lease whose TTL runs out so is deleted, as expiry would). A
# limited key's hash of permits: each permit's acquisition and end, and the
# hash's TTL (its latest permit's end).
_SHIFT = """
local shift = tonumber(ARGV[1])
if redis.call('TYPE', KEYS[1])['ok'] == 'hash' then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 and ttl <= shift then return redis.call('DEL', KEYS[1]) end
  local flat = redis.call('HGETALL', KEYS[1])
  for i = 1, #flat, 2 do
    local token, at, ends, rest = string.match(flat[i + 1], '^(.*)@(%d+)@(%d+)(.*)$')
    if token then
      redis.call('HSET', KEYS[1], flat[i], token .. '@' ..
        string.format('%.0f', tonumber(at) - shift) .. '@' ..
        string.format('%.0f', tonumber(ends) - shift) .. rest)
    end
  end
  if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl - shift) end
  return 1
end
local value = redis.call('GET', KEYS[1])
if not value then return 0 end
local token, at, rest = string.match(value, '^(.*)@(%d+)(.*)$')
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 and ttl <= shift then return redis.call('DEL', KEYS[1]) end
if token then
  value = token .. '@' .. string.format('%.0f', tonumber(at) - shift) .. rest
end
if ttl > 0 then
  redis.call('SET', KEYS[1], value, 'PX', ttl - shift)
else
  redis.call('SET', KEYS[1], value, 'KEEPTTL')
end
return 1
"""


class SteppedClock(DelegatingBackend):
    """``inner``, whose storage's clock :meth:`step` moves forward.

    Only the leases whose key starts with ``prefix`` are moved (the test's own:
    the shared Redis holds other tests' keys meanwhile).
    """

    def __init__(self, inner: BaseBackend, prefix: str) -> None:
        super().__init__(inner)
        self.prefix = KEY_PREFIX + prefix
        self.offset = 0.0
        self._lock = threading.Lock()

    def storage_time(self) -> float | None:
        now = self.inner.storage_time()
        return None if now is None else now + self.offset

    def step(self, seconds: float) -> None:
        """The storage's clock jumps ``seconds`` ahead, for every lease stored there."""
        with self._lock:
            self._shift(seconds)
            self.offset += seconds

    def _shift(self, seconds: float) -> None:
        from django_tasklock.backends.database import DatabaseBackend
        from django_tasklock.backends.redis import RedisBackend

        inner = self.inner
        if isinstance(inner, DatabaseBackend):
            from django_tasklock.models import CacheEntry

            back = timedelta(seconds=seconds)
            rows = CacheEntry.objects.using(inner.using).filter(key__startswith=self.prefix)
            rows.update(expires_at=F("expires_at") - back, created_at=F("created_at") - back)
        elif isinstance(inner, RedisBackend):
            client = inner._conn()
            shift = client.register_script(_SHIFT)
            for stored in client.scan_iter(match=f"{self.prefix}*"):
                shift(keys=[stored], args=[int(seconds * 1000)])
        else:  # pragma: no cover - the tests step these two only
            raise TypeError(f"no clock to step in {type(inner).__name__}")
