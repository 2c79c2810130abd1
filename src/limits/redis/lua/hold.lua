-- hold.lua: take the spend holds of one or more requests, in order; each request's hold is
-- taken on every holder it draws on, or on none. A hold may also lease the calling instance
-- a spend slice of each of its holders (see src/limits/redis/spend-slices.ts).
--
-- KEYS, two per holder j of each hold, hold after hold (all under one hash tag on a Cluster):
--   ledger hash {e = epoch, b0 = base at epoch start, s = settled since,
--               h = sum of holds in flight, spend slices included,
--               m = the budget's limit as the last hold gave it (settle.lua reads it),
--               a:<id> = the amount of that hold or slice}
--   hold set (ZSET: member = hold or slice id, score = expiry ms)
-- ARGV: 1 ledger TTL ms, 2 hold lifetime ms (a slice's too), 3 slice share: a slice is at
--       most 1/share of what is left on a holder, 4 number of holds, then per hold:
--       hold id, amount, deadline in Redis time ms (0 = none: a caller has given up on a hold
--       that runs later, so it must change nothing), number of holders n,
--       slice id ('' = no slice asked), least slice worth having,
--       then five per holder: kind ('budget' | 'wallet'), base (the replica's figure),
--       limit ('' = none; budgets only), epoch, slice wanted;
--       after the last hold, the news channel ('' = none; src/limits/redis/ledger-news.ts)
-- Money is integer nano-units throughout (see src/limits/ledger.ts); numbers go back to Redis as
-- '%.0f' strings so that large values are never written in exponent form.
--
-- A first or higher epoch restarts the holder's ledger from base (a higher one keeps the
-- holds and slices in flight); a lower epoch keeps the ledger and uses its b0 in place of
-- the stale base.
-- Live figure and fit: ledger-rules.lua (the rules of src/limits/ledger.ts).
-- A zero hold is checked like any other but not recorded.
-- A slice is granted after its hold, on every holder or on none: on each holder
-- min(wanted, floor(left / share)), where left is what the budget or balance still has
-- after the hold, and only when that is at least the least slice on every holder. It is
-- recorded like a hold of that amount (so it counts in full), under the slice id, with
-- `f:<id>` = 0: the holds in flight on it (settle.lua; ledger.lua reads those, not the
-- whole slice).
-- Slice ids start with '~' (hold ids never do). A hold refused on holder j that would fit
-- without the slices recorded there (other instances': the caller gave its own back first)
-- publishes j's ledger key on the news channel, so that those instances give theirs back,
-- and answers r = 2: the caller asks again a moment later (DESIGN section 6: live spend
-- counts the holds of requests in flight, not what an idle instance kept for later).
-- Returns {now, then per hold: r, j, g1 .. gn}: r = 1 when held on every holder, 0 with j
-- the first holder it does not fit (nothing held), 2 with j as just said (nothing held),
-- -1 past its deadline; g = the slice granted on each holder (all 0: none).

if redis.replicate_commands then pcall(redis.replicate_commands) end

-- #include ledger-rules.lua

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local ttl = tonumber(ARGV[1])
local hold_ms = tonumber(ARGV[2])
local share = tonumber(ARGV[3])
local count = tonumber(ARGV[4])

local function int(x) return string.format('%.0f', x) end

-- The news channel, after the last hold's arguments.
local function news_channel()
  local o = 4
  for _ = 1, count do o = o + 6 + 5 * tonumber(ARGV[o + 4]) end
  return ARGV[o + 1] or ''
end
local channel = news_channel()
-- Hold sets past this many members are not searched for slices (a refusal stays a refusal).
local SLICE_SCAN_MAX = 256

-- Drops the expired holds and slices of one holder; true when there were any.
local function purge(L, Z)
  local gone = redis.call('ZRANGEBYSCORE', Z, '-inf', now)
  if #gone == 0 then return false end
  local sum = 0
  for _, id in ipairs(gone) do
    local a = redis.call('HGET', L, 'a:' .. id)
    if a then
      sum = sum + tonumber(a)
      redis.call('HDEL', L, 'a:' .. id, 'r:' .. id, 'f:' .. id)
    end
  end
  redis.call('ZREMRANGEBYSCORE', Z, '-inf', now)
  if sum ~= 0 then redis.call('HINCRBY', L, 'h', int(-sum)) end
  return true
end

-- The figures of each ledger this call has read, kept up to date by its own writes: the
-- holds of one call are mostly one key's requests on the same ledgers, and time stands
-- still inside a script, so each ledger is read, purged and given its TTL once per call
-- rather than once per hold. Fields: e, b0, s, h, and z (the hold set has its TTL).
local seen = {}

-- A first epoch starts an empty ledger. A higher one starts base and settled again but keeps
-- the holds in flight (and slices), which still count until they settle, are given back or
-- expire: the new figures do not know of them yet (DESIGN section 6: plus the holds in flight).
local function restart(L, Z, epoch, base, keep_holds)
  local h, m = 0, nil
  if keep_holds then
    purge(L, Z)
    local v = redis.call('HMGET', L, 'h', 'm')
    h, m = tonumber(v[1]) or 0, tonumber(v[2])
    redis.call('HSET', L, 'e', int(epoch), 'b0', int(base), 's', '0')
  else
    redis.call('DEL', L, Z)
    redis.call('HSET', L, 'e', int(epoch), 'b0', int(base), 's', '0', 'h', '0')
  end
  redis.call('PEXPIRE', L, ttl)
  local f = {e = epoch, b0 = base, s = 0, h = h, z = false, m = m}
  seen[L] = f
  return f
end

-- A ledger's figures for a hold at `epoch`: a first or higher epoch restarts it from base.
local function figures(L, Z, epoch, base)
  local f = seen[L]
  if f then
    if epoch > f.e then return restart(L, Z, epoch, base, true) end
    return f
  end
  local v = redis.call('HMGET', L, 'e', 'b0', 's', 'h', 'm')
  if not v[1] then return restart(L, Z, epoch, base, false) end
  if epoch > tonumber(v[1]) then return restart(L, Z, epoch, base, true) end
  -- Only a purge changes the figures just read.
  if purge(L, Z) then v = redis.call('HMGET', L, 'e', 'b0', 's', 'h', 'm') end
  redis.call('PEXPIRE', L, ttl)
  f = {e = tonumber(v[1]), b0 = tonumber(v[2]), s = tonumber(v[3]) or 0, h = tonumber(v[4]) or 0, z = false, m = tonumber(v[5])}
  seen[L] = f
  return f
end

-- Keeps the budget's limit in the ledger, where settle.lua looks for it.
local function note_limit(L, f, limit)
  if limit and f.m ~= limit then
    redis.call('HSET', L, 'm', int(limit))
    f.m = limit
  end
end

-- Records `amount` under `id` on one holder: a hold or a slice, counted in h until it is
-- settled, given back or expires.
local function record(L, Z, f, id, amount)
  redis.call('ZADD', Z, now + hold_ms, id)
  redis.call('HSET', L, 'a:' .. id, int(amount))
  redis.call('HINCRBY', L, 'h', int(amount))
  f.h = f.h + amount
  if not f.z then
    redis.call('PEXPIRE', Z, ttl)
    f.z = true
  end
end

-- What a holder still has: a budget's limit less its live spend, a wallet's live balance.
local function left_of(h)
  local live = live_of(h.kind, h.base, h.f.b0, h.f.s, h.f.h)
  if h.kind == 'wallet' then return live end
  if not h.limit then return math.huge end
  return h.limit - live
end

-- The slice on each holder, or nil when one of them cannot have the least slice.
local function slice_sizes(holders, least)
  local sizes = {}
  for j, h in ipairs(holders) do
    local g = math.min(h.want, math.floor(left_of(h) / share))
    if g < least or g <= 0 then return nil end
    sizes[j] = g
  end
  return sizes
end

-- What the live slices recorded on one holder add up to (a slice given back, `r:<id>`,
-- holds only what is in flight on it: holds of requests).
local function slices_on(h)
  if h.f.k then return h.f.k end
  if redis.call('ZCARD', h.Z) > SLICE_SCAN_MAX then return 0 end
  local sum = 0
  for _, id in ipairs(redis.call('ZRANGE', h.Z, 0, -1)) do
    if string.sub(id, 1, 1) == '~' then
      local v = redis.call('HMGET', h.L, 'a:' .. id, 'r:' .. id)
      if not v[2] then sum = sum + (tonumber(v[1]) or 0) end
    end
  end
  -- kept with the ledger's figures for the call's other holds (slices it grants add to it)
  h.f.k = sum
  return sum
end

-- A refusal on holder h that slices alone cause: their instances are told, and 2 answered.
local function refusal(h, amount)
  if channel == '' then return 0 end
  local others = slices_on(h)
  if others <= 0 or not hold_fits(h.kind, live_of(h.kind, h.base, h.f.b0, h.f.s, h.f.h - others), amount, h.limit) then return 0 end
  -- pcall: a user whose ACL allows no channels still gets its answer
  redis.pcall('PUBLISH', channel, h.L)
  return 2
end

-- One request's hold: its holders' keys from KEYS[k + 1], its arguments from ARGV[o + 1].
-- Returns r, j and the slice granted on each holder.
local function hold(k, o)
  local hold_id, amount, deadline, n = ARGV[o + 1], tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3]) or 0, tonumber(ARGV[o + 4])
  local slice_id, least = ARGV[o + 5], tonumber(ARGV[o + 6])
  if deadline > 0 and now > deadline then return -1, 0, nil end
  local refused = 0
  local holders = {}
  for j = 1, n do
    local L, Z = KEYS[k + 2 * j - 1], KEYS[k + 2 * j]
    local p = o + 6 + 5 * (j - 1)
    local h = {L = L, Z = Z, kind = ARGV[p + 1], base = tonumber(ARGV[p + 2]), limit = tonumber(ARGV[p + 3]), want = tonumber(ARGV[p + 5])}
    local epoch = tonumber(ARGV[p + 4])
    h.f = figures(L, Z, epoch, h.base)
    if h.kind ~= 'wallet' and epoch >= h.f.e then note_limit(L, h.f, h.limit) end
    -- A lower epoch keeps the ledger and uses its b0 in place of the stale base.
    if epoch < h.f.e then h.base = h.f.b0 end
    holders[j] = h
    if refused == 0 and not hold_fits(h.kind, live_of(h.kind, h.base, h.f.b0, h.f.s, h.f.h), amount, h.limit) then refused = j end
  end
  if refused ~= 0 then return refusal(holders[refused], amount), refused, nil end
  -- A zero hold (an unpriced model) adds nothing to h: it is not recorded, so nothing has to
  -- refresh, expire or settle it (a settlement that still comes to a cost only adds to s).
  if amount > 0 then
    for _, h in ipairs(holders) do record(h.L, h.Z, h.f, hold_id, amount) end
  end
  local sizes = nil
  if slice_id ~= '' then sizes = slice_sizes(holders, least) end
  if sizes then
    for j, h in ipairs(holders) do
      record(h.L, h.Z, h.f, slice_id, sizes[j])
      -- nothing in flight on it yet (ledger.lua reads it so until its settlements say more)
      redis.call('HSET', h.L, 'f:' .. slice_id, '0')
      if h.f.k then h.f.k = h.f.k + sizes[j] end
    end
  end
  return 1, 0, sizes
end

local out = {now}
local k, o = 0, 4
for _ = 1, count do
  local n = tonumber(ARGV[o + 4])
  local r, j, sizes = hold(k, o)
  out[#out + 1] = r
  out[#out + 1] = j
  for i = 1, n do out[#out + 1] = sizes and sizes[i] or 0 end
  k = k + 2 * n
  o = o + 6 + 5 * n
end
return out
