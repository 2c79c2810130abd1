-- settle.lua: every settlement one instance has queued for one hash slot (a whole
-- standalone Redis), applied in one call. See settle-batch.ts.
--
-- ARGV[1]: the call's id ('' = none), ARGV[2]: how long Redis remembers it (ms). With an id,
--   KEYS[1] is the sending instance's record of the calls it applied (ZSET: call id -> when
--   it is forgotten, in Redis ms). A call found there was applied already (Redis ran it past
--   its deadline, or its answer was lost, and the instance sent it again): it applies nothing
--   and returns {0}. Applying a call records it.
-- KEYS (after the record): taken in order by the operations, as each one says below.
-- ARGV[3]: number of operations; then each operation, its kind first:
--   'b' (buckets and slots): lease id, slice id ('' = none), nb, ns, then nb pairs
--       (capacity, delta); KEYS: nb token buckets (bucket.lua), then ns lease sets (ZSET).
--       delta > 0 gives tokens back (never above the ceiling), < 0 charges more (the
--       bucket may go negative). With a slice id the slice ends first (its ceiling comes
--       back) and delta is what was left of it, given back only if the slice had not
--       expired. The lease is removed from each lease set (its slot freed).
--       Used for TPM settlement, undoing a Cluster admission half, slice returns.
--   'w' (block of slots, slots.lua): block id, new weight; KEYS: lease set. The block's
--       slots above the new weight are freed (0 ends it); one that expired stays gone, and
--       none grows. Used to give back a block's unused slots.
--   'h' (spend hold): hold id, actual cost (integer nano-units), ledger TTL ms, holders n,
--       then n holder kinds ('budget' | 'wallet'); KEYS: two per holder, as hold.lua (ledger
--       hash, hold set). The hold is removed
--       where still present (it may have expired, or a new epoch restarted the ledger); the
--       cost is added to `s` wherever the ledger exists, so a cost counts even when its
--       hold is gone. An expired ledger is not recreated: the next hold restarts it.
--   'm' (spend slice, hold.lua): slice id, cost (integer nano-units), take, end (1 ends it;
--       2: given back, what is left is holds in flight, marked `r:<id>` so that hold.lua
--       counts it as holds, not as a slice; 0 neither), ledger
--       TTL ms, holder kind ('budget' | 'wallet'), in flight (nano-units of the holds in
--       flight on the live slice now, recorded as `f:<id>`: ledger.lua counts that much of
--       the slice, not its unused rest); KEYS: the holder's ledger hash and hold
--       set. The cost is added to `s` as for 'h'; `take` comes off the slice's amount (never
--       below 0), and `end` removes what is left of it. A slice that is gone (expired, or a
--       new epoch restarted the ledger) is not recreated. Holds an instance took from its
--       slice are settled this way, in sums. A live slice (end 0) is void when it is gone or
--       its ledger is over-committed: settled usage past the holds it replaced has taken what
--       the slices were held for (budget: b0 + s + h > m, the limit hold.lua records;
--       wallet: b0 - s - h < 0). The reply names it, and the instance stops using it.
-- After the operations: the news channel ('' = none). A cost past its hold ('h'), or past
-- what its slice absorbed ('m'), that leaves its ledger over-committed (the rule above) is
-- news to every instance holding a slice of it: the ledger hash's key is published there,
-- once per call (src/limits/redis/ledger-news.ts).
-- A malformed call (an operation whose counts ask for more KEYS than the call has left) stops
-- with an error at that operation; those before it stay applied.
-- Returns {number of operations applied, then the 1-based index of each void slice's operation}.

-- #include bucket.lua
-- #include slots.lua

local call_id, keep_ms = ARGV[1], tonumber(ARGV[2])
local k = 1
local a = 4
local record
if call_id ~= '' then
  record = KEYS[1]
  k = 2
  redis.call('ZREMRANGEBYSCORE', record, '-inf', now)
  if redis.call('ZSCORE', record, call_id) then return {0} end
end
local function arg()
  local v = ARGV[a]
  a = a + 1
  return v
end
local function key()
  local v = KEYS[k]
  k = k + 1
  return v
end

-- Each operation takes all of its KEYS and ARGV before it writes anything, so one that fails
-- (a corrupt record) does not take the others with it: they apply as if each had been sent
-- alone.
local function settle_buckets(lease_id, slice_id, buckets, sets)
  for _, b in ipairs(buckets) do
    local delta = b.delta
    if slice_id ~= '' and not drop_slice(b.key, slice_id) and delta > 0 then delta = 0 end
    if delta ~= 0 then
      local lvl, ceiling = bucket(b.key, b.cap)
      store(b.key, b.cap, math.min(ceiling, lvl + delta))
    end
  end
  for _, z in ipairs(sets) do redis.call('ZREM', z, lease_id) end
end

-- Whether each ledger this call has looked at exists: time stands still in a script and no
-- settlement creates or deletes a ledger, so each is looked up, and its TTL renewed, once
-- per call rather than once per settled hold.
local ledger_there = {}

local function ledger_exists(L, ttl)
  local there = ledger_there[L]
  if there == nil then
    there = redis.call('HEXISTS', L, 'e') == 1
    ledger_there[L] = there
    if there then redis.call('PEXPIRE', L, ttl) end
  end
  return there
end

-- Whether a ledger's slices are no longer backed (see the header); false when it is gone.
local function over_committed(L, kind)
  local v = redis.call('HMGET', L, 'b0', 's', 'h', 'm')
  if not v[1] then return false end
  local b0, s, h = tonumber(v[1]), tonumber(v[2]) or 0, tonumber(v[3]) or 0
  if kind == 'wallet' then return b0 - s - h < 0 end
  local limit = tonumber(v[4])
  return limit ~= nil and b0 + s + h > limit
end

-- Ledgers this call's costs over-committed, each once, in order: the news (see the header).
local news, in_news = {}, {}
local function note_over(L, kind)
  if not in_news[L] and over_committed(L, kind) then
    in_news[L] = true
    news[#news + 1] = L
  end
end

local function settle_hold(hold_id, actual, ttl, ledgers)
  for _, l in ipairs(ledgers) do
    local L, Z, kind = l[1], l[2], l[3]
    redis.call('ZREM', Z, hold_id)
    local held = redis.call('HGET', L, 'a:' .. hold_id)
    if held then
      redis.call('HDEL', L, 'a:' .. hold_id)
      -- A zero hold (unpriced model) changes nothing; '-0' is no integer to Redis.
      if tonumber(held) ~= 0 then redis.call('HINCRBY', L, 'h', string.format('%.0f', -tonumber(held))) end
    end
    if ledger_exists(L, ttl) then
      redis.call('HINCRBY', L, 's', actual)
      if tonumber(actual) > (tonumber(held) or 0) then note_over(L, kind) end
    end
  end
end

-- Returns whether the slice is void (only asked of a live one).
local function settle_slice(slice_id, cost, take, mode, ttl, kind, inflight, L, Z)
  local done = mode == '1'
  local field = 'a:' .. slice_id
  local amount = tonumber(redis.call('HGET', L, field) or '')
  if amount then
    local back = math.min(take, amount)
    if done then back = amount end
    if back > 0 then redis.call('HINCRBY', L, 'h', string.format('%.0f', -back)) end
    if done then
      redis.call('HDEL', L, field, 'r:' .. slice_id, 'f:' .. slice_id)
      redis.call('ZREM', Z, slice_id)
    elseif back > 0 then
      redis.call('HSET', L, field, string.format('%.0f', amount - back))
    end
    if mode == '2' then
      redis.call('HSET', L, 'r:' .. slice_id, '1')
      redis.call('HDEL', L, 'f:' .. slice_id)
    elseif not done and inflight then
      redis.call('HSET', L, 'f:' .. slice_id, string.format('%.0f', inflight))
    end
  end
  if cost ~= 0 and ledger_exists(L, ttl) then
    redis.call('HINCRBY', L, 's', string.format('%.0f', cost))
    if cost > take then note_over(L, kind) end
  end
  if done then return false end
  return not amount or over_committed(L, kind)
end

-- Stops a malformed call before it reads past its KEYS (a count taken from the wrong
-- argument could otherwise keep the script, and Redis, busy for a long time).
local function keys_left(n)
  if not n or n < 0 or k + n - 1 > #KEYS then error('settle.lua: an operation asks for more keys than the call carries') end
  return n
end

local ops = tonumber(ARGV[3])
local applied = 0
local void = {}
for i = 1, ops do
  local ok
  local kind = arg()
  if kind == 'w' then
    local id, w = arg(), tonumber(arg())
    keys_left(1)
    ok = pcall(shrink_block, key(), id, w)
  elseif kind == 'm' then
    local slice_id, cost, take, mode, ttl, holder, inflight = arg(), tonumber(arg()), tonumber(arg()), arg(), tonumber(arg()), arg(), tonumber(arg())
    keys_left(2)
    local gone
    ok, gone = pcall(settle_slice, slice_id, cost, take, mode, ttl, holder, inflight, key(), key())
    if ok and gone then void[#void + 1] = i end
  elseif kind == 'b' then
    local lease_id, slice_id, nb, ns = arg(), arg(), tonumber(arg()), tonumber(arg())
    keys_left((nb or -1) + (ns or -1))
    local buckets, sets = {}, {}
    for j = 1, nb do buckets[j] = {key = key(), cap = tonumber(arg()), delta = tonumber(arg())} end
    for j = 1, ns do sets[j] = key() end
    ok = pcall(settle_buckets, lease_id, slice_id, buckets, sets)
  else
    local hold_id, actual, ttl, n = arg(), arg(), tonumber(arg()), tonumber(arg())
    keys_left(2 * (n or -1))
    local ledgers = {}
    for j = 1, n do ledgers[j] = {key(), key(), arg()} end
    ok = pcall(settle_hold, hold_id, actual, ttl, ledgers)
  end
  if ok then applied = applied + 1 end
end
local channel = ARGV[a]
if channel and channel ~= '' then
  -- pcall: a user whose ACL allows no channels (Redis 7's default for new users) still settles
  for _, L in ipairs(news) do redis.pcall('PUBLISH', channel, L) end
end
local out = {applied}
for _, i in ipairs(void) do out[#out + 1] = i end
if record then
  redis.call('ZADD', record, now + keep_ms, call_id)
  redis.call('PEXPIRE', record, keep_ms)
end
return out
