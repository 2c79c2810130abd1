-- bucket.lua: token buckets with leased slices, included by admit.lua, lease.lua, settle.lua
-- and peek.lua (scripts.ts pastes it where a script says `-- #include bucket.lua`). It names
-- no KEYS or ARGV of its own: the including script passes bucket keys in.
--
-- A bucket is a hash {t = tokens at ts, ts = ms}; an absent bucket is full (see store). Capacity N
-- refills at N per 60000 ms. Slices an instance leased from it (lease.lua) are recorded in
-- the same hash so that the bucket and the slices never hold more than N together:
--   l = sum of live slices, x = soonest slice expiry, X = latest slice expiry,
--   s:<slice id> = '<amount>:<expiry ms>'
-- The bucket's ceiling is N - l: while a slice is out, refill stops that much short of
-- full. A slice that expires (its instance died or stalled) is dropped from the ceiling;
-- its tokens are not given back, since the instance may have spent them. Time is Redis TIME.
--
-- It also holds the rules the scripts share on a bucket's level: the RPM/TPM admission
-- check and its retry wait (admit_wait: admit.lua, lease.lua) and the quota figures
-- (quota: admit.lua, lease.lua, peek.lua), all on one refill arithmetic (refill_ms).

if redis.replicate_commands then pcall(redis.replicate_commands) end

local WINDOW = 60000
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- Drops expired slices; returns the live sum and the soonest expiry left.
local function purge_slices(key)
  local all = redis.call('HGETALL', key)
  local sum, soonest = 0, nil
  for i = 1, #all, 2 do
    local f = all[i]
    if string.sub(f, 1, 2) == 's:' then
      local amount, expiry = string.match(all[i + 1], '^([^:]+):(.+)$')
      amount, expiry = tonumber(amount), tonumber(expiry)
      if expiry <= now then
        redis.call('HDEL', key, f)
      else
        sum = sum + amount
        if not soonest or expiry < soonest then soonest = expiry end
      end
    end
  end
  if sum > 0 then
    redis.call('HSET', key, 'l', tostring(sum), 'x', tostring(soonest))
  else
    redis.call('HDEL', key, 'l', 'x', 'X')
  end
  return sum
end

-- Level and ceiling of the bucket now.
local function bucket(key, cap)
  local v = redis.call('HMGET', key, 't', 'ts', 'l', 'x')
  if not v[1] then return cap, cap end
  local leased = tonumber(v[3]) or 0
  if leased > 0 and (tonumber(v[4]) or 0) <= now then leased = purge_slices(key) end
  local ceiling = cap - leased
  local elapsed = now - tonumber(v[2])
  if elapsed < 0 then elapsed = 0 end
  local lvl = math.min(ceiling, tonumber(v[1]) + elapsed * cap / WINDOW)
  -- In debt, the bucket is kept until it is full at the capacity in force now: a lowered
  -- limit (a reload, a console change) takes longer to pay it back than the TTL set before.
  if lvl < 0 then
    local keep = math.ceil((cap - lvl) * WINDOW / cap)
    if redis.call('PTTL', key) < keep then redis.call('PEXPIRE', key, keep) end
  end
  return lvl, ceiling
end

-- Milliseconds until a bucket at `lvl` has refilled to `need`: the one refill arithmetic,
-- behind the retry wait (to what a request needs), the reset figure and the TTL (to full).
local function refill_ms(lvl, need, cap)
  return math.ceil((need - lvl) * WINDOW / cap)
end

-- Writes the level back. The bucket is kept at least one WINDOW, and until it would be full
-- again, and not before its last slice expires: a bucket at 0 or more tokens untouched for
-- a WINDOW is full at any capacity, so forgetting it (absent = full) refills nothing, even
-- after the capacity was raised (DESIGN section 12: a changed limit applies to the state
-- it finds).
local function store(key, cap, lvl)
  local last = tonumber(redis.call('HGET', key, 'X') or '0') or 0
  redis.call('HSET', key, 't', tostring(lvl), 'ts', tostring(now))
  local ttl = WINDOW
  if lvl < cap and refill_ms(lvl, cap, cap) > ttl then ttl = refill_ms(lvl, cap, cap) end
  if last - now > ttl then ttl = last - now end
  redis.call('PEXPIRE', key, ttl)
end

-- Records a slice of `amount` taken from the bucket (the caller lowers the level itself).
local function add_slice(key, id, amount, expiry)
  local v = redis.call('HMGET', key, 'l', 'x', 'X')
  local leased, soonest, last = tonumber(v[1]) or 0, tonumber(v[2]), tonumber(v[3]) or 0
  if not soonest or expiry < soonest then soonest = expiry end
  if expiry > last then last = expiry end
  redis.call('HSET', key, 's:' .. id, tostring(amount) .. ':' .. tostring(expiry),
    'l', tostring(leased + amount), 'x', tostring(soonest), 'X', tostring(last))
end

-- Ends a live slice: the ceiling rises again. Returns whether it was still recorded (an
-- expired slice is gone, and what was left of it must not be given back).
local function drop_slice(key, id)
  local rec = redis.call('HGET', key, 's:' .. id)
  if not rec then return false end
  local amount, expiry = string.match(rec, '^([^:]+):(.+)$')
  amount = tonumber(amount)
  redis.call('HDEL', key, 's:' .. id)
  local leased = (tonumber(redis.call('HGET', key, 'l') or '0') or 0) - amount
  if leased > 0 then
    redis.call('HSET', key, 'l', tostring(leased))
  else
    redis.call('HDEL', key, 'l', 'x')
  end
  -- expired but not yet purged (purging is lazy): gone all the same, nothing to give back
  return tonumber(expiry) > now
end

local function reset_ms(lvl, cap)
  if lvl >= cap then return 0 end
  return refill_ms(lvl, cap, cap)
end

-- A bucket's quota figures at `lvl`, as admissions and peek.lua report them: whole tokens
-- left (never below 0; integers only, since Redis truncates Lua numbers in replies) and ms
-- until full again (0 = full).
local function quota(lvl, cap)
  return math.max(0, math.floor(lvl)), reset_ms(lvl, cap)
end

-- The admission rule for one request on one bucket, made by admit.lua and lease.lua alike
-- (bucket.ts's tpmAdmits, tpmNeed and refillWaitMs are the same rule in process). RPM (no
-- `tokens`): the bucket must hold one token. TPM: it must hold the request's estimate
-- `tokens`, or be full: the need is capped at the capacity, so that a request estimated
-- above the whole capacity passes alone (taking the bucket into debt) rather than never.
-- While slices are out, full is the bucket's `ceiling` (bucket()): refill stops there, and
-- what the slices hold is not the bucket's to wait for. A request that reserves nothing
-- always passes. Returns 0 when the request passes, else the retry wait: ms until the
-- bucket holds what it needs, at least 1. It only reads the level: a caller consumes
-- nothing until every one of its checks has passed.
local function admit_wait(lvl, cap, tokens, ceiling)
  local need = 1
  if tokens then
    if tokens <= 0 then return 0 end
    local full = cap
    if ceiling and ceiling > 0 and ceiling < cap then full = ceiling end
    need = math.min(tokens, full)
  end
  if lvl >= need then return 0 end
  return math.max(1, refill_ms(lvl, need, cap))
end
