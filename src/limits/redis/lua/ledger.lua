-- ledger.lua: live spend (budget) or live balance (wallet) per holder, holds included,
-- without changing anything (GET /v1/key).
--
-- KEYS, two per holder (as hold.lua): ledger hash, hold set
-- ARGV: three per holder j: kind ('budget' | 'wallet'), base (the replica's figure), epoch
-- A spend slice counts as the holds in flight on it as its instance last reported them
-- (`f:<id>`: 0 from hold.lua at the grant, then settle.lua's); one without the field (an
-- earlier version granted it) counts in full.
-- Returns three integers per holder: the live figure (nano-units), the epoch it belongs to,
-- and the figure when that epoch was first seen (nano-units; a wallet's balance at its
-- epoch). Same rules as hold.lua: no ledger means the replica's figure alone, a higher
-- epoch the replica's figure and the holds in flight; holds past their expiry do not count.

-- #include ledger-rules.lua

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local out = {}
for j = 1, #KEYS / 2 do
  local L, Z = KEYS[2 * j - 1], KEYS[2 * j]
  local o = 3 * (j - 1)
  local kind, base, epoch = ARGV[o + 1], tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3])
  local v = redis.call('HMGET', L, 'e', 'b0', 's', 'h')
  local live, at, start = base, epoch, base
  if v[1] then
    local b0, s, h = tonumber(v[2]), tonumber(v[3]) or 0, tonumber(v[4]) or 0
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', Z, '-inf', now)) do
      h = h - (tonumber(redis.call('HGET', L, 'a:' .. id)) or 0)
    end
    -- A live slice counts as the holds in flight on it its instance last reported (`f:`),
    -- not as its whole amount: what it has not used yet is neither spent nor held.
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', Z, '(' .. now, '+inf')) do
      if string.sub(id, 1, 1) == '~' then
        local rec = redis.call('HMGET', L, 'a:' .. id, 'f:' .. id, 'r:' .. id)
        local amount, inflight = tonumber(rec[1]), tonumber(rec[2])
        if amount and inflight and not rec[3] then h = h - amount + math.min(inflight, amount) end
      end
    end
    if epoch > tonumber(v[1]) then
      -- What the next hold makes of it: a restart from base that keeps the holds in flight.
      live = live_of(kind, base, base, 0, h)
    else
      if epoch < tonumber(v[1]) then base = b0 end
      live, at, start = live_of(kind, base, b0, s, h), tonumber(v[1]), b0
    end
  end
  out[3 * j - 2], out[3 * j - 1], out[3 * j] = live, at, start
end
return out
