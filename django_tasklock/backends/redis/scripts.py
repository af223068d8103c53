"""The Lua scripts of the Redis backend: every decision is made inside one of them.

Each runs atomically, by the Redis server's clock (``TIME``), so no worker's
clock is ever consulted. The stored value is ``"<token>@<acquired_ms>"``; a
lease its release cut to end at acquisition + ``min_hold`` is
``"<token>@<acquired_ms>:released"``: still held until then, but never
extended nor taken again by its token.

A request may arrive late: redis-py gives a command up after its socket
timeout and sends it again on a new connection, and the first copy can reach
Redis after the second was answered, even after the release. So an
acquisition finding its token's tombstone (its lease released) writes
nothing, a refresh never extends a lease marked released, and a release
finding its own tombstone answers that it ended the lease, whoever holds the
key now.
"""

from __future__ import annotations

from django_tasklock.backends.base import storage_key
from django_tasklock.backends.redis.slots import tag_for

PRELUDE = """
local RELEASED_MARK = ':released'
-- Lets Redis < 5 replicate writes made after the non-deterministic TIME.
if redis.replicate_commands then redis.replicate_commands() end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- token, acquired_ms, released of a value written here; nil for anything else.
-- released: the lease's release cut it to end at acquisition + min_hold.
local function parse(value)
  if type(value) ~= 'string' then return nil end
  local token, ms = string.match(value, '^(.*)@(%d+)$')
  if token then return token, tonumber(ms), false end
  token, ms = string.match(value, '^(.*)@(%d+)' .. RELEASED_MARK .. '$')
  if not token then return nil end
  return token, tonumber(ms), true
end
-- Wakes the waiters of a key just freed, in every process that listens for it
-- (a shard channel named as the key: its hash slot). Before Redis 7.0 there is
-- no SPUBLISH: pcall lets the script go on, and waiters poll.
local function signal(key)
  redis.pcall('SPUBLISH', key, '')
end
local function is_free(key, now, stale_ms)
  local pttl = redis.call('PTTL', key)
  if pttl < 0 then return pttl == -1 end  -- -2: gone; -1: no TTL
  local _, at = parse(redis.pcall('GET', key))
  return at ~= nil and now - at > stale_ms
end
"""

# Each script but "refresh_many" takes KEYS[1], the stored key ("fence" also
# KEYS[2], the key's counter; "release" and "acquire" KEYS[2], the token's tombstone).
#: Fence counters live outside the lock namespace (``task-lock:``), so that
#: SCAN-based listing and sweeping never see them; they have no TTL.
FENCE_PREFIX = "tasklock-fence:"
#: Both carry a hash tag naming the lease's slot (see ``slots``).
#: A release that ends a lease leaves ``tasklock-released:{<tag>}<key>@<token>`` for
#: the client's retry window (at least 60 s, see ``retries``), so that the same
#: release sent again (its reply lost) can tell its own deletion from a lease that
#: expired or was force-released, and a late acquisition by the token writes nothing.
RELEASED_PREFIX = "tasklock-released:"


def fence_key(key: str) -> str:
    """``tasklock-fence:{<tag>}<key>``: the counter, in the lease ``task-lock:<key>``'s slot."""
    return f"{FENCE_PREFIX}{tag_for(storage_key(key))}{key}"


def tombstone_key(key: str, token: str) -> str:
    """``tasklock-released:{<tag>}<key>@<token>``, in the slot of the lease."""
    return f"{RELEASED_PREFIX}{tag_for(storage_key(key))}{key}@{token}"


SCRIPTS = {
    # KEYS[2] (none while the slot is half migrated: see ``backend``): the
    # token's tombstone. ARGV: token, lease_ms, stale_ms, machine, gone.
    # 1 if acquired, also
    # when the lease is already this token's (this script run again after its
    # reply was lost): then its TTL is set again to what is left, a write, so
    # that a WAIT sent after this run on its connection also covers the first
    # run's write. 0, writing nothing, if the token's lease was released (its
    # tombstone, or the mark of a min_hold cut): this run arrived late, after
    # its own re-send was answered, and nobody waits for its reply.
    # Held by another token: 0, or that token when it names the caller's
    # machine ("/<machine>." in it; "" for none), whose holder the caller can
    # then look for. ``gone`` ("" for none): a token whose holder the caller
    # found gone; its lease is taken over (never one cut for min_hold), and
    # only while that token still holds the key.
    "acquire": """
if KEYS[2] and redis.call('GET', KEYS[2]) == ARGV[1] then return 0 end
local now = now_ms()
local value = ARGV[1] .. '@' .. string.format('%.0f', now)
if redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then return 1 end
if is_free(KEYS[1], now, tonumber(ARGV[3])) then
  redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
  return 1
end
local token, _, released = parse(redis.pcall('GET', KEYS[1]))
if token == ARGV[1] and not released then
  redis.call('PEXPIRE', KEYS[1], math.max(1, redis.call('PTTL', KEYS[1])))
  return 1
end
if not token or released or token == '' then return 0 end
if ARGV[5] and ARGV[5] == token then
  redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
  return 1
end
if ARGV[4] and ARGV[4] ~= '' and string.find(token, ARGV[4], 1, true) then return token end
return 0
""",
    # ARGV: token, ttl_ms, max_lifetime_ms. 0 if the lease is lost, or released
    # (cut to end at min_hold: never extended, by a refresh arriving late).
    "refresh": """
local token, at, released = parse(redis.pcall('GET', KEYS[1]))
if token ~= ARGV[1] or released then return 0 end
local left = math.min(tonumber(ARGV[2]), at + tonumber(ARGV[3]) - now_ms())
if left > 0 then redis.call('PEXPIRE', KEYS[1], left) end
return 1
""",
    # KEYS: many stored keys; ARGV: token, ttl_ms, max_lifetime_ms for each.
    # One answer per key, as "refresh" would give, as one character of one string
    # ("1" or "0"): 500 answers parsed as one reply, not as 500.
    "refresh_many": """
local now = now_ms()
local out = {}
for i, key in ipairs(KEYS) do
  local arg = (i - 1) * 3
  local token, at, released = parse(redis.pcall('GET', key))
  if token ~= ARGV[arg + 1] or released then
    out[i] = '0'
  else
    local left = math.min(tonumber(ARGV[arg + 2]), at + tonumber(ARGV[arg + 3]) - now)
    if left > 0 then redis.call('PEXPIRE', key, left) end
    out[i] = '1'
  end
end
return table.concat(out)
""",
    # KEYS[2]: this release's tombstone. ARGV: token, min_hold_ms (0: none),
    # tombstone_ms. 1 if ended (deleted, or cut to end at acquisition +
    # min_hold while that is still ahead, marked released), leaving the
    # tombstone; 2 if the lease is not there and the tombstone is (this script
    # run again after its reply was lost), whoever holds the key now; else 0
    # if the key is someone else's, 3 if it is gone (expired, force-released,
    # evicted: a loss).
    "release": """
local value = redis.pcall('GET', KEYS[1])  -- false: no such key (a read fewer than EXISTS)
local token, at, released = parse(value)
if token ~= ARGV[1] then
  if redis.call('GET', KEYS[2]) == ARGV[1] then return 2 end
  if value == false then return 3 end
  return 0
end
local hold = tonumber(ARGV[2])
local keep = tonumber(ARGV[3])
if hold > 0 then
  local left = at + hold - now_ms()
  if left > 0 then
    if not released then value = value .. RELEASED_MARK end
    redis.call('SET', KEYS[1], value, 'PX', left)
    redis.call('SET', KEYS[2], ARGV[1], 'PX', left + keep)
    return 1
  end
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], ARGV[1], 'PX', keep)
signal(KEYS[1])
return 1
""",
    # "release" without its tombstone (KEYS[1] only), for a slot being migrated:
    # there a script whose keys are not all on the node is refused (TRYAGAIN),
    # and a release's tombstone never exists before it. 1 if ended, 0 if the
    # key is someone else's, 3 if it is gone.
    "release_alone": """
local value = redis.pcall('GET', KEYS[1])
if value == false then return 3 end
local token, at, released = parse(value)
if token ~= ARGV[1] then return 0 end
local hold = tonumber(ARGV[2])
if hold > 0 then
  local left = at + hold - now_ms()
  if left > 0 then
    if not released then value = value .. RELEASED_MARK end
    redis.call('SET', KEYS[1], value, 'PX', left)
    return 1
  end
end
redis.call('DEL', KEYS[1])
signal(KEYS[1])
return 1
""",
    # ARGV: a token as "inspect" gives it (a foreign value: the whole value).
    # 1 if that lease was deleted; a successor's is never touched.
    "evict": """
local value = redis.pcall('GET', KEYS[1])
local token = parse(value)
if token ~= ARGV[1] and value ~= ARGV[1] then return 0 end
local deleted = redis.call('DEL', KEYS[1])
signal(KEYS[1])
return deleted
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
    # ARGV: machine ("/<machine>."), stale_ms. The token of a live lease that
    # names that machine and was not cut for min_hold, else nil: for the reaper.
    "of_machine": """
local token, _, released = parse(redis.pcall('GET', KEYS[1]))
if not token or released or not string.find(token, ARGV[1], 1, true) then return nil end
if is_free(KEYS[1], now_ms(), tonumber(ARGV[2])) then return nil end
return token
""",
    # ARGV: a token whose holder the caller found gone. 1 if its lease was
    # deleted: never a successor's, nor one cut for min_hold.
    "reap": """
local token, _, released = parse(redis.pcall('GET', KEYS[1]))
if token ~= ARGV[1] or released then return 0 end
local deleted = redis.call('DEL', KEYS[1])
signal(KEYS[1])
return deleted
""",
    # ARGV: stale_ms, '1' to delete. 1 if the key is free (and now deleted).
    "clear": """
if not is_free(KEYS[1], now_ms(), tonumber(ARGV[1])) then return 0 end
if ARGV[2] == '1' then
  redis.call('DEL', KEYS[1])
  signal(KEYS[1])
end
return 1
""",
}
