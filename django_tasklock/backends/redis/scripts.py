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

from django_tasklock.backends.base import PERMIT_SEPARATOR, storage_key
from django_tasklock.backends.redis.slots import tag_for

PRELUDE = """
local RELEASED_MARK = ':released'
local LIMIT = 'tasklock:limit'
-- A permit's release leaves the tombstone "<token>" .. SEP .. "<n>": its number too.
local SEP = string.char(31)
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
-- The permits of a limited key live in a hash at the key: field LIMIT says N
-- (and that the hash is ours: any other is held until it expires, like any
-- value not written here); field "<n>" (from 0) is permit n,
-- "<token>@<acquired_ms>@<ends_ms>", with RELEASED_MARK once its release cut
-- it to end at acquisition + min_hold. A permit is live while its end is
-- ahead; the hash lives until its latest permit's end (PEXPIRE), and is
-- deleted with its last live permit.
local function parse_permit(value)
  if type(value) ~= 'string' then return nil end
  local token, at, ends = string.match(value, '^(.*)@(%d+)@(%d+)$')
  if token then return token, tonumber(at), tonumber(ends), false end
  token, at, ends = string.match(value, '^(.*)@(%d+)@(%d+)' .. RELEASED_MARK .. '$')
  if not token then return nil end
  return token, tonumber(at), tonumber(ends), true
end
local function permit_value(token, at, ends, released)
  local value = token .. '@' .. string.format('%.0f', at) .. '@' .. string.format('%.0f', ends)
  if released then value = value .. RELEASED_MARK end
  return value
end
-- Whether the value GET read at key (an error: not a string) is a hash of permits.
local function is_permits(value, key)
  return type(value) == 'table' and redis.pcall('HEXISTS', key, LIMIT) == 1
end
-- The live permits of the hash at key: {field -> {token, acquired, ends,
-- released}}, how many, and the limit.
local function permits_of(key, now)
  local flat = redis.call('HGETALL', key)
  local live, count, limit = {}, 0, nil
  for i = 1, #flat, 2 do
    if flat[i] == LIMIT then
      limit = tonumber(flat[i + 1])
    else
      local token, at, ends, released = parse_permit(flat[i + 1])
      if token and ends > now then
        live[flat[i]] = {token, at, ends, released}
        count = count + 1
      end
    end
  end
  return live, count, limit
end
-- Permit field of the hash at key, {token, acquired, ends, released}, if live and token's.
local function permit_at(key, field, token, now)
  if not field then return nil end
  local held, at, ends, released = parse_permit(redis.call('HGET', key, field))
  if held ~= token or ends <= now then return nil end
  return {held, at, ends, released}
end
-- The hash at key keeps its live permits only: the others' fields deleted, its
-- expiry at the latest end; deleted with the last one.
local function tidy(key, now)
  local flat = redis.call('HGETALL', key)
  local last, dead = 0, {}
  for i = 1, #flat, 2 do
    if flat[i] ~= LIMIT then
      local token, _, ends = parse_permit(flat[i + 1])
      if token and ends > now then
        if ends > last then last = ends end
      else
        dead[#dead + 1] = flat[i]
      end
    end
  end
  if last == 0 then
    redis.call('DEL', key)
    return
  end
  if #dead > 0 then redis.call('HDEL', key, unpack(dead)) end
  redis.call('PEXPIRE', key, last - now)
end
-- Ends permit field of the hash at key (its holder checked by the caller) and
-- wakes the key's waiters.
local function end_permit(key, field, now)
  redis.call('HDEL', key, field)
  tidy(key, now)
  signal(key)
end
-- "refresh" of token's permit field in the hash at key: 1 if extended (or past
-- its cap, left to end), 0 if it is not token's and live, or its release cut it.
local function refresh_permit(key, field, token, ttl_ms, cap_ms, now)
  local permit = permit_at(key, field, token, now)
  if not permit or permit[4] then return 0 end
  local left = math.min(ttl_ms, permit[2] + cap_ms - now)
  if left > 0 then
    redis.call('HSET', key, field, permit_value(token, permit[2], now + left, false))
    if redis.call('PTTL', key) < left then redis.call('PEXPIRE', key, left) end
  end
  return 1
end
-- "release" of token's permit field in the hash at key, answered as "release"
-- is; tombstone nil: "release_alone"'s.
local function release_permit(key, field, tombstone, token, hold_ms, keep_ms)
  local now = now_ms()
  local permit = permit_at(key, field, token, now)
  local mark = field and (token .. SEP .. field) or token  -- no field: a mutex's release
  if not permit then
    if tombstone and redis.call('GET', tombstone) == mark then return 2 end
    return 3
  end
  local left = permit[2] + hold_ms - now
  if hold_ms > 0 and left > 0 then
    redis.call('HSET', key, field, permit_value(token, permit[2], permit[2] + hold_ms, true))
    tidy(key, now)
    if tombstone then redis.call('SET', tombstone, mark, 'PX', left + keep_ms) end
    return 1
  end
  end_permit(key, field, now)
  if tombstone then redis.call('SET', tombstone, mark, 'PX', keep_ms) end
  return 1
end
"""

# Each script but "refresh_many" and "marked" takes KEYS[1], the stored key
# ("fence" also KEYS[2], the key's counter; "release", "acquire" and "permit"
# KEYS[2], the token's tombstone; "mark" and "take" KEYS[2], the key's mark).
# A permit's keys are its limited key's.
#: Fence counters live outside the lock namespace (``task-lock:``), so that
#: SCAN-based listing and sweeping never see them; they have no TTL.
FENCE_PREFIX = "tasklock-fence:"
#: Both carry a hash tag naming the lease's slot (see ``slots``).
#: A release that ends a lease leaves ``tasklock-released:{<tag>}<key>@<token>`` for
#: the client's retry window (at least 60 s, see ``retries``), so that the same
#: release sent again (its reply lost) can tell its own deletion from a lease that
#: expired or was force-released, and a late acquisition by the token writes nothing.
RELEASED_PREFIX = "tasklock-released:"
#: A key's "run once more" mark (``mark_rerun``): a hash at
#: ``tasklock-rerun:{<tag>}<key>``, in the lease's slot and outside the lock
#: namespace, so that the namespace's SCANs (``list``, ``clear_stale``, the
#: reaper) never see it, and it outlives the lease. Fields: ``payload`` (absent:
#: not marked), ``marked`` (server ms of the last mark), ``taken_by``,
#: ``taken_number`` and ``taken`` (the last take by a live holder: its token,
#: number and answer, for the same take sent again, and against an earlier one
#: arriving late). It lives ``RERUN_LIFETIME`` from the last mark (PEXPIRE),
#: and at least the client's retry window after a take.
RERUN_PREFIX = "tasklock-rerun:"


def held_at(name: str) -> str:
    """The key naming a lease's storage: ``task-lock:<key>``; a permit's is its limited key's.

    A permit's name is ``<key>\x1f<n>`` (``permit_key``): permit ``n`` is
    field ``n`` of the hash at ``task-lock:<key>``, so that every permit of a
    key is in one key, and one Cluster slot.
    """
    if PERMIT_SEPARATOR in name:
        name = name.partition(PERMIT_SEPARATOR)[0]
    return storage_key(name)


def fence_key(key: str) -> str:
    """``tasklock-fence:{<tag>}<key>``: the counter, in the lease ``task-lock:<key>``'s slot.

    A permit's is its limited key's: one counter for all the key's permits.
    """
    if PERMIT_SEPARATOR in key:
        key = key.partition(PERMIT_SEPARATOR)[0]
    return f"{FENCE_PREFIX}{tag_for(storage_key(key))}{key}"


def tombstone_key(key: str, token: str) -> str:
    """``tasklock-released:{<tag>}<key>@<token>``, in the slot of the lease.

    A permit's is its limited key's (a token holds one permit of a key).
    """
    if PERMIT_SEPARATOR in key:
        key = key.partition(PERMIT_SEPARATOR)[0]
    return f"{RELEASED_PREFIX}{tag_for(storage_key(key))}{key}@{token}"


def rerun_key(key: str) -> str:
    """``tasklock-rerun:{<tag>}<key>``: ``key``'s mark, in the lease ``task-lock:<key>``'s slot.

    Only a mutex's lease is marked: a permit's name gives a key no lease is
    stored at (permits live in their limited key's hash), never marked.
    """
    return f"{RERUN_PREFIX}{tag_for(storage_key(key))}{key}"


def key_of_mark(name: str) -> str:
    """The caller's key of a mark's name (:func:`rerun_key`): the prefix and the tag cut.

    The tag holds no ``}`` (letters, digits, ``-``, ``_``): its first ``}`` ends it.
    """
    return name[len(RERUN_PREFIX) :].partition("}")[2]


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
    # Held by permits (a hash, "permit"): {"limit", N}, when one is live.
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
local held = redis.pcall('GET', KEYS[1])
if is_permits(held, KEYS[1]) then
  local _, count, limit = permits_of(KEYS[1], now)
  if count > 0 then return {'limit', limit or 0} end
  redis.call('SET', KEYS[1], value, 'PX', ARGV[2])  -- permits none live: the key is free
  return 1
end
local token, _, released = parse(held)
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
    # ARGV[4], for a permit: its number.
    "refresh": """
local value = redis.pcall('GET', KEYS[1])
if is_permits(value, KEYS[1]) then
  local ttl, cap = tonumber(ARGV[2]), tonumber(ARGV[3])
  return refresh_permit(KEYS[1], ARGV[4], ARGV[1], ttl, cap, now_ms())
end
if ARGV[4] then return 0 end
local token, at, released = parse(value)
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
    # "refresh_many" for permits: KEYS, limited keys; ARGV: token, ttl_ms,
    # max_lifetime_ms, the permit's number, for each. Answered as "refresh_many".
    "refresh_permits": """
local now = now_ms()
local out = {}
for i, key in ipairs(KEYS) do
  local arg = (i - 1) * 4
  local ttl, cap = tonumber(ARGV[arg + 2]), tonumber(ARGV[arg + 3])
  out[i] = '0'
  if is_permits(redis.pcall('GET', key), key) then
    out[i] = tostring(refresh_permit(key, ARGV[arg + 4], ARGV[arg + 1], ttl, cap, now))
  end
end
return table.concat(out)
""",
    # KEYS[2]: this release's tombstone. ARGV: token, min_hold_ms (0: none),
    # tombstone_ms, and for a permit its number. 1 if ended (deleted, or cut
    # to end at acquisition + min_hold while that is still ahead, marked released), leaving the
    # tombstone; 2 if the lease is not there and the tombstone is (this script
    # run again after its reply was lost), whoever holds the key now; else 0
    # if the key is someone else's, 3 if it is gone (expired, force-released,
    # evicted: a loss).
    "release": """
local value = redis.pcall('GET', KEYS[1])  -- false: no such key (a read fewer than EXISTS)
if is_permits(value, KEYS[1]) then
  local hold, keep = tonumber(ARGV[2]), tonumber(ARGV[3])
  return release_permit(KEYS[1], ARGV[4], KEYS[2], ARGV[1], hold, keep)
end
if ARGV[4] then  -- a permit's release at a key that has none
  if redis.call('GET', KEYS[2]) == ARGV[1] .. SEP .. ARGV[4] then return 2 end
  return 3
end
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
if is_permits(value, KEYS[1]) then
  return release_permit(KEYS[1], ARGV[3], nil, ARGV[1], tonumber(ARGV[2]), 0)
end
if ARGV[3] then return 3 end
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
    # ARGV: a token as "inspect" gives it (a foreign value: the whole value),
    # and for a permit its number. 1 if that lease was deleted; a successor's
    # is never touched, nor a limited key's permits by the key alone.
    "evict": """
local value = redis.pcall('GET', KEYS[1])
if is_permits(value, KEYS[1]) then
  local now = now_ms()
  local permit = permits_of(KEYS[1], now)[ARGV[2] or '']
  if not permit or permit[1] ~= ARGV[1] then return 0 end
  end_permit(KEYS[1], ARGV[2], now)
  return 1
end
if ARGV[2] then return 0 end
local token = parse(value)
if token ~= ARGV[1] and value ~= ARGV[1] then return 0 end
local deleted = redis.call('DEL', KEYS[1])
signal(KEYS[1])
return deleted
""",
    # KEYS[2]: the fence counter. ARGV: token, stale_ms, and for a permit its
    # number. The key's next fencing token while ARGV[1] holds the live lease
    # (or that permit: one counter for all of a key's permits), else nil: one more than the
    # last, and never less than the server's clock in microseconds, so that a
    # counter lost (a restart without persistence, FLUSHDB, an eviction, a
    # failover that dropped writes) starts again above every fence handed out
    # before. Microseconds since 1970 stay exact in a Lua number (a double)
    # until the year 2255, and far within a 64-bit integer.
    "fence": """
local t = redis.call('TIME')
local value = redis.pcall('GET', KEYS[1])
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if is_permits(value, KEYS[1]) then
  if not permit_at(KEYS[1], ARGV[3], ARGV[1], now) then return nil end
elseif ARGV[3] or parse(value) ~= ARGV[1] or is_free(KEYS[1], now, tonumber(ARGV[2])) then
  return nil
end
local fence = redis.call('INCR', KEYS[2])
local clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
if fence < clock_us then
  fence = clock_us
  redis.call('SET', KEYS[2], string.format('%.0f', fence))
end
return fence
""",
    # ARGV: stale_ms, and for a permit its number. nil if free, else {token,
    # acquired_ms, pttl, now_ms} (a permit's: its ms left, and its key's limit
    # after them); a value not written here gives itself as the token and the
    # time of reading. A limited key asked for by itself: nil.
    "inspect": """
local now = now_ms()
local value = redis.pcall('GET', KEYS[1])
if is_permits(value, KEYS[1]) then
  local live, _, limit = permits_of(KEYS[1], now)
  local permit = live[ARGV[2] or '']
  if not permit then return nil end
  return {permit[1], permit[2], permit[3] - now, now, limit}
end
if ARGV[2] then return nil end
if value == false or is_free(KEYS[1], now, tonumber(ARGV[1])) then
  return nil
end
local token, at = parse(value)
if not token then token = type(value) == 'string' and value or '' end
return {token, at or now, redis.call('PTTL', KEYS[1]), now}
""",
    # KEYS: many stored keys; ARGV: machine ("/<machine>."), stale_ms. For each
    # key, the token of a live lease that names that machine and was not cut for
    # min_hold, else false (nil in the reply): for the reaper. At a limited key,
    # such permits' {number, token, number, token...}.
    "of_machine": """
local now = now_ms()
local stale = tonumber(ARGV[2])
local out = {}
for i, key in ipairs(KEYS) do
  local value = redis.pcall('GET', key)
  if is_permits(value, key) then
    local mine = {}
    for field, permit in pairs(permits_of(key, now)) do
      if not permit[4] and string.find(permit[1], ARGV[1], 1, true) then
        mine[#mine + 1] = field
        mine[#mine + 1] = permit[1]
      end
    end
    out[i] = mine
  else
    local token, _, released = parse(value)
    if not token or released or not string.find(token, ARGV[1], 1, true)
        or is_free(key, now, stale) then
      out[i] = false
    else
      out[i] = token
    end
  end
end
return out
""",
    # ARGV: a token whose holder the caller found gone, and for a permit its
    # number. 1 if its lease was deleted: never a successor's, nor one cut for min_hold.
    "reap": """
local value = redis.pcall('GET', KEYS[1])
if is_permits(value, KEYS[1]) then
  local now = now_ms()
  local permit = permit_at(KEYS[1], ARGV[2], ARGV[1], now)
  if not permit or permit[4] then return 0 end
  end_permit(KEYS[1], ARGV[2], now)
  return 1
end
if ARGV[2] then return 0 end
local token, _, released = parse(value)
if token ~= ARGV[1] or released then return 0 end
local deleted = redis.call('DEL', KEYS[1])
signal(KEYS[1])
return deleted
""",
    # ARGV: stale_ms, '1' to delete. 1 if the key is free (and now deleted): at
    # a limited key, when no permit is live.
    "clear": """
local now = now_ms()
if is_permits(redis.pcall('GET', KEYS[1]), KEYS[1]) then
  local _, count = permits_of(KEYS[1], now)
  if count > 0 then return 0 end
elseif not is_free(KEYS[1], now, tonumber(ARGV[1])) then
  return 0
end
if ARGV[2] == '1' then
  redis.call('DEL', KEYS[1])
  signal(KEYS[1])
end
return 1
""",
    # One of the permits of a limited key, kept in a hash at the key (see
    # PRELUDE). KEYS[2] (none while the slot is half migrated): the token's
    # tombstone. ARGV: token, lease_ms, limit, stale_ms, machine, gone, as
    # "acquire" takes them. n + 1 when permit n is the token's: the first free
    # one (or expired), or the one it has already (this script run again after
    # its reply was lost; its TTL set again, a write for WAIT). nil, writing
    # nothing, when all are held, or the token's permit was released (late).
    # {"limit", N} when the key is held live by permits of another limit, or by
    # a mutex (N = 1). When all are held: {"mine", token...}, the tokens of
    # permits of the caller's machine, whose holders the caller can look for;
    # ``gone`` names one found gone, whose permit is then taken over (never
    # one cut for min_hold), while that token still holds it.
    "permit": """
if KEYS[2] then  -- the token's permit released (its tombstone names it): arrived late
  local seen = redis.call('GET', KEYS[2])
  if seen and string.find(seen, ARGV[1] .. SEP, 1, true) == 1 then return nil end
end
local now = now_ms()
local token, asked = ARGV[1], tonumber(ARGV[3])
local value = redis.pcall('GET', KEYS[1])
if value ~= false and not is_permits(value, KEYS[1]) then
  if not is_free(KEYS[1], now, tonumber(ARGV[4])) then
    if parse(value) then return {'limit', 1} end
    return nil  -- a value not written here: held until it expires
  end
  redis.call('DEL', KEYS[1])
end
local live, count, limit = permits_of(KEYS[1], now)
for field, permit in pairs(live) do
  if permit[1] == token then
    if permit[4] then return nil end
    redis.call('PEXPIRE', KEYS[1], math.max(1, redis.call('PTTL', KEYS[1])))
    return tonumber(field) + 1
  end
end
if count > 0 and limit ~= asked then return {'limit', limit or 0} end
local chosen = nil
if count < asked then
  for n = 0, asked - 1 do
    if not live[tostring(n)] then
      chosen = tostring(n)
      break
    end
  end
elseif ARGV[6] ~= '' then
  for field, permit in pairs(live) do
    if permit[1] == ARGV[6] and not permit[4] then chosen = field end
  end
end
if not chosen then
  local mine = {'mine'}
  if ARGV[5] ~= '' then
    for _, permit in pairs(live) do
      if not permit[4] and string.find(permit[1], ARGV[5], 1, true) then
        mine[#mine + 1] = permit[1]
      end
    end
  end
  if #mine > 1 then return mine end
  return nil
end
local lease = permit_value(token, now, now + tonumber(ARGV[2]), false)
redis.call('HSET', KEYS[1], LIMIT, ARGV[3])  -- one field a call: Redis before 4.0 too
redis.call('HSET', KEYS[1], chosen, lease)
tidy(KEYS[1], now)
return tonumber(chosen) + 1
""",
    # KEYS[2]: the key's mark (``rerun_key``). ARGV: payload, lifetime_ms,
    # stale_ms. 1, the payload written (the latest mark's: many make one) and
    # the mark set to live lifetime_ms more, while a live mutex's lease holds
    # the key (one its release cut for min_hold too); else 0, writing nothing
    # (the key free, or held by permits, or by a value not written here). One
    # script: no release or takeover falls between the look and the write.
    # Sent twice, it marks once; a copy arriving late finds the key free
    # (nothing written) or the next holder's lease, which then runs once more.
    "mark": """
local value = redis.pcall('GET', KEYS[1])
local now = now_ms()
if not parse(value) or is_free(KEYS[1], now, tonumber(ARGV[3])) then return 0 end
redis.call('HSET', KEYS[2], 'payload', ARGV[1])  -- one field a call: Redis before 4.0 too
redis.call('HSET', KEYS[2], 'marked', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
""",
    # KEYS[2]: the key's mark. ARGV: token, taking (this take's number among
    # the takes of the token's lease: 1, 2, 3...), stale_ms, keep_ms (the
    # client's retry window). The mark keeps the last take of a live holder
    # (taken_by: its token, taken_number, taken: its answer, absent for none).
    # A take of that token whose number is not above it takes nothing: the
    # same take sent again answers alike, an earlier one arriving late nil;
    # so a late copy never takes a mark written after it was answered. Else,
    # while ``token`` holds the key's live lease (not cut by a min_hold
    # release, not a permit), the take is recorded, the mark's payload ("" is
    # one: a string, unlike nil) moved to its answer, and the hash kept at
    # least keep_ms, for the take sent again; else nil, nothing written, the
    # mark left to the key's next holder.
    "take": """
if redis.call('HGET', KEYS[2], 'taken_by') == ARGV[1] then
  local number = tonumber(redis.call('HGET', KEYS[2], 'taken_number'))
  if number and tonumber(ARGV[2]) <= number then
    if tonumber(ARGV[2]) == number then return redis.call('HGET', KEYS[2], 'taken') end
    return nil
  end
end
local token, _, released = parse(redis.pcall('GET', KEYS[1]))
if token ~= ARGV[1] or released or is_free(KEYS[1], now_ms(), tonumber(ARGV[3])) then
  return nil
end
local payload = redis.call('HGET', KEYS[2], 'payload')
if payload then
  redis.call('HSET', KEYS[2], 'taken', payload)
else
  redis.call('HDEL', KEYS[2], 'taken')
end
redis.call('HSET', KEYS[2], 'taken_by', ARGV[1])  -- one field a call: Redis before 4.0 too
redis.call('HSET', KEYS[2], 'taken_number', ARGV[2])
redis.call('HDEL', KEYS[2], 'payload', 'marked')
local keep = tonumber(ARGV[4])
if redis.call('PTTL', KEYS[2]) < keep then redis.call('PEXPIRE', KEYS[2], keep) end
return payload
""",
    # KEYS[1]: a key's mark (no lease key: only read). ARGV: lifetime_ms. When
    # it was last marked (server ms) while it carries a payload no older than
    # lifetime_ms, else nil (also at a key that is no hash). For ``rerun_marks``.
    "marked": """
local at = redis.pcall('HGET', KEYS[1], 'marked')
if type(at) ~= 'string' or redis.call('HEXISTS', KEYS[1], 'payload') == 0 then return nil end
if now_ms() - tonumber(at) > tonumber(ARGV[1]) then return nil end
return tonumber(at)
""",
    # The live permits of a limited key: {now_ms, limit, number, token,
    # acquired_ms, ms_left, number, token...}; {} at any other key. For ``list``.
    "permits": """
local now = now_ms()
if not is_permits(redis.pcall('GET', KEYS[1]), KEYS[1]) then return {} end
local live, _, limit = permits_of(KEYS[1], now)
local out = {now, limit}
for field, permit in pairs(live) do
  out[#out + 1] = field
  out[#out + 1] = permit[1]
  out[#out + 1] = permit[2]
  out[#out + 1] = permit[3] - now
end
return out
""",
}
