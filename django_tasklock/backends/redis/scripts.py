"""The Lua scripts of the Redis backend: every decision is made inside one of them.

Each runs atomically, by the Redis server's clock (``TIME``), so no worker's
clock is ever consulted. The stored value is ``"<token>@<acquired_ms>"``.
"""

from __future__ import annotations

from django_tasklock.backends.base import storage_key
from django_tasklock.backends.redis.slots import tag_for

PRELUDE = """
-- Lets Redis < 5 replicate writes made after the non-deterministic TIME.
if redis.replicate_commands then redis.replicate_commands() end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- token, acquired_ms of a value written here; nil for anything else.
local function parse(value)
  if type(value) ~= 'string' then return nil end
  local token, ms = string.match(value, '^(.*)@(%d+)$')
  if not token then return nil end
  return token, tonumber(ms)
end
local function is_free(key, now, stale_ms)
  local pttl = redis.call('PTTL', key)
  if pttl < 0 then return pttl == -1 end  -- -2: gone; -1: no TTL
  local _, at = parse(redis.pcall('GET', key))
  return at ~= nil and now - at > stale_ms
end
"""

# Each script but "refresh_many" takes KEYS[1], the stored key ("fence" also
# KEYS[2], the key's counter; "release" KEYS[2], its tombstone).
#: Fence counters live outside the lock namespace (``task-lock:``), so that
#: SCAN-based listing and sweeping never see them; they have no TTL.
FENCE_PREFIX = "tasklock-fence:"
#: Both carry a hash tag naming the lease's slot (see ``slots``).
#: A release that ends a lease leaves ``tasklock-released:{<tag>}<key>@<token>`` for
#: this long, so that the same release sent again (its reply lost) can tell
#: its own deletion from a lease that expired or was force-released.
RELEASED_PREFIX = "tasklock-released:"
RELEASED_MS = 60_000


def fence_key(key: str) -> str:
    """``tasklock-fence:{<tag>}<key>``: the counter, in the lease ``task-lock:<key>``'s slot."""
    return f"{FENCE_PREFIX}{tag_for(storage_key(key))}{key}"


def tombstone_key(key: str, token: str) -> str:
    """``tasklock-released:{<tag>}<key>@<token>``, in the slot of the lease."""
    return f"{RELEASED_PREFIX}{tag_for(storage_key(key))}{key}@{token}"


SCRIPTS = {
    # ARGV: token, lease_ms, stale_ms. 1 if acquired, also when the lease is
    # already this token's (this script run again after its reply was lost):
    # then its TTL is set again to what is left, a write, so that a WAIT sent
    # after this run on its connection also covers the first run's write.
    "acquire": """
local now = now_ms()
local value = ARGV[1] .. '@' .. string.format('%.0f', now)
if redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then return 1 end
if is_free(KEYS[1], now, tonumber(ARGV[3])) then
  redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
  return 1
end
if parse(redis.pcall('GET', KEYS[1])) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], math.max(1, redis.call('PTTL', KEYS[1])))
  return 1
end
return 0
""",
    # ARGV: token, ttl_ms, max_lifetime_ms. 0 if the lease is lost.
    "refresh": """
local token, at = parse(redis.pcall('GET', KEYS[1]))
if token ~= ARGV[1] then return 0 end
local left = math.min(tonumber(ARGV[2]), at + tonumber(ARGV[3]) - now_ms())
if left > 0 then redis.call('PEXPIRE', KEYS[1], left) end
return 1
""",
    # KEYS: many stored keys; ARGV: token, ttl_ms, max_lifetime_ms for each.
    # One reply per key, as "refresh" would give.
    "refresh_many": """
local now = now_ms()
local out = {}
for i, key in ipairs(KEYS) do
  local arg = (i - 1) * 3
  local token, at = parse(redis.pcall('GET', key))
  if token ~= ARGV[arg + 1] then
    out[i] = 0
  else
    local left = math.min(tonumber(ARGV[arg + 2]), at + tonumber(ARGV[arg + 3]) - now)
    if left > 0 then redis.call('PEXPIRE', key, left) end
    out[i] = 1
  end
end
return out
""",
    # KEYS[2]: this release's tombstone. ARGV: token, min_hold_ms (0: none),
    # tombstone_ms. 1 if ended (deleted, or cut to end at acquisition +
    # min_hold while that is still ahead), leaving the tombstone; 0 if the key
    # is someone else's; 2 if it is gone and the tombstone is there (this
    # script run again after its reply was lost); 3 if it is gone otherwise
    # (expired, force-released, evicted: a loss).
    "release": """
local value = redis.pcall('GET', KEYS[1])  -- false: no such key (a read fewer than EXISTS)
if value == false then
  if redis.call('GET', KEYS[2]) == ARGV[1] then return 2 end
  return 3
end
local token, at = parse(value)
if token ~= ARGV[1] then return 0 end
local hold = tonumber(ARGV[2])
local keep = tonumber(ARGV[3])
if hold > 0 then
  local left = at + hold - now_ms()
  if left > 0 then
    redis.call('PEXPIRE', KEYS[1], left)
    redis.call('SET', KEYS[2], ARGV[1], 'PX', left + keep)
    return 1
  end
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], ARGV[1], 'PX', keep)
return 1
""",
    # "release" without its tombstone (KEYS[1] only), for a slot being migrated:
    # there a script whose keys are not all on the node is refused (TRYAGAIN),
    # and a release's tombstone never exists before it. 1 if ended, 0 if the
    # key is someone else's, 3 if it is gone.
    "release_alone": """
local value = redis.pcall('GET', KEYS[1])
if value == false then return 3 end
local token, at = parse(value)
if token ~= ARGV[1] then return 0 end
local hold = tonumber(ARGV[2])
if hold > 0 then
  local left = at + hold - now_ms()
  if left > 0 then
    redis.call('PEXPIRE', KEYS[1], left)
    return 1
  end
end
redis.call('DEL', KEYS[1])
return 1
""",
    # ARGV: a token as "inspect" gives it (a foreign value: the whole value).
    # 1 if that lease was deleted; a successor's is never touched.
    "evict": """
local value = redis.pcall('GET', KEYS[1])
local token = parse(value)
if token ~= ARGV[1] and value ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
""",
    # KEYS[2]: the fence counter. ARGV: token, stale_ms. The key's next fencing
    # token while ARGV[1] holds the live lease, else nil: one more than the
    # last, and never less than the server's clock in microseconds, so that a
    # counter lost (a restart without persistence, FLUSHDB, an eviction, a
    # failover that dropped writes) starts again above every fence handed out
    # before. Microseconds since 1970 stay exact in a Lua number (a double)
    # until the year 2255, and far within a 64-bit integer.
    "fence": """
local t = redis.call('TIME')
local token = parse(redis.pcall('GET', KEYS[1]))
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if token ~= ARGV[1] or is_free(KEYS[1], now, tonumber(ARGV[2])) then return nil end
local fence = redis.call('INCR', KEYS[2])
local clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
if fence < clock_us then
  fence = clock_us
  redis.call('SET', KEYS[2], string.format('%.0f', fence))
end
return fence
""",
    # ARGV: stale_ms. nil if free, else {token, acquired_ms, pttl, now_ms}; a value
    # not written here gives itself as the token and the time of reading.
    "inspect": """
local now = now_ms()
if redis.call('EXISTS', KEYS[1]) == 0 or is_free(KEYS[1], now, tonumber(ARGV[1])) then
  return nil
end
local value = redis.pcall('GET', KEYS[1])
local token, at = parse(value)
if not token then token = type(value) == 'string' and value or '' end
return {token, at or now, redis.call('PTTL', KEYS[1]), now}
""",
    # ARGV: stale_ms, '1' to delete. 1 if the key is free (and now deleted).
    "clear": """
if not is_free(KEYS[1], now_ms(), tonumber(ARGV[1])) then return 0 end
if ARGV[2] == '1' then redis.call('DEL', KEYS[1]) end
return 1
""",
}
