-- hold.lua: take one request's spend hold on every holder it draws on, or on none.
--
-- KEYS, two per holder j (all under the request's one hash tag):
--   KEYS[2j-1]  ledger hash {e = epoch, b0 = base at epoch start, s = settled since,
--               h = sum of holds in flight, a:<hold id> = that hold's amount}
--   KEYS[2j]    hold set (ZSET: member = hold id, score = expiry ms)
-- ARGV: 1 hold id, 2 amount, 3 hold lifetime ms, 4 ledger TTL ms,
--       5 deadline in Redis time ms (0 = none): the caller has given up on a hold that runs
--       later, so it must change nothing,
--       then four per holder j: kind ('budget' | 'wallet'), base (the replica's figure),
--       limit ('' = none; budgets only), epoch
-- Money is integer nano-units throughout (see ledger.ts); numbers go back to Redis as
-- '%.0f' strings so that large values are never written in exponent form.
--
-- A first or higher epoch restarts the holder's ledger from base (old holds forgotten); a
-- lower epoch keeps the ledger and uses its b0 in place of the stale base. Live figure and
-- fit: ledger-rules.lua (the rules of ledger.ts).
-- A zero hold is checked like any other but not recorded.
-- Returns {1, 0, now} when held on every holder, {0, j, now} for the first holder it does not
-- fit (nothing held), or {-1, 0, now} past the deadline.

if redis.replicate_commands then pcall(redis.replicate_commands) end

-- #include ledger-rules.lua

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local hold_id = ARGV[1]
local amount = tonumber(ARGV[2])
local hold_ms = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local deadline = tonumber(ARGV[5]) or 0
local n = #KEYS / 2
if deadline > 0 and now > deadline then return {-1, 0, now} end

local function int(x) return string.format('%.0f', x) end

local function purge(L, Z)
  local gone = redis.call('ZRANGEBYSCORE', Z, '-inf', now)
  if #gone == 0 then return end
  local sum = 0
  for _, id in ipairs(gone) do
    local a = redis.call('HGET', L, 'a:' .. id)
    if a then
      sum = sum + tonumber(a)
      redis.call('HDEL', L, 'a:' .. id)
    end
  end
  redis.call('ZREMRANGEBYSCORE', Z, '-inf', now)
  if sum ~= 0 then redis.call('HINCRBY', L, 'h', int(-sum)) end
end

local refused = 0
for j = 1, n do
  local L, Z = KEYS[2 * j - 1], KEYS[2 * j]
  local o = 5 + 4 * (j - 1)
  local kind, base, limit, epoch = ARGV[o + 1], tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4])
  local v = redis.call('HMGET', L, 'e', 'b0', 's', 'h')
  local e, b0, s, h
  if not v[1] or epoch > tonumber(v[1]) then
    redis.call('DEL', L, Z)
    redis.call('HSET', L, 'e', int(epoch), 'b0', int(base), 's', '0', 'h', '0')
    e, b0, s, h = epoch, base, 0, 0
  else
    purge(L, Z)
    v = redis.call('HMGET', L, 'e', 'b0', 's', 'h')
    e, b0, s, h = tonumber(v[1]), tonumber(v[2]), tonumber(v[3]) or 0, tonumber(v[4]) or 0
    if epoch < e then base = b0 end
  end
  redis.call('PEXPIRE', L, ttl)
  if refused == 0 then
    if not hold_fits(kind, live_of(kind, base, b0, s, h), amount, limit) then refused = j end
  end
end
if refused ~= 0 then return {0, refused, now} end
-- A zero hold (an unpriced model) adds nothing to h: it is not recorded, so nothing has to
-- refresh, expire or settle it (a settlement that still comes to a cost only adds to s).
if amount == 0 then return {1, 0, now} end

for j = 1, n do
  local L, Z = KEYS[2 * j - 1], KEYS[2 * j]
  redis.call('ZADD', Z, now + hold_ms, hold_id)
  redis.call('HSET', L, 'a:' .. hold_id, int(amount))
  redis.call('HINCRBY', L, 'h', int(amount))
  redis.call('PEXPIRE', Z, ttl)
end
return {1, 0, now}
