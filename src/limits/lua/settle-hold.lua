-- settle-hold.lua: replace a spend hold with the actual cost, on every holder it was taken on.
--
-- KEYS, two per holder (as hold.lua): ledger hash, hold set
-- ARGV: 1 hold id, 2 actual cost (integer nano-units), 3 ledger TTL ms
-- The hold is removed where it is still present (it may have expired, or a new epoch may
-- have restarted the ledger); the cost is added to `s` wherever the ledger exists, so a
-- cost is counted even when its hold is gone. A ledger that expired is not recreated: the
-- next hold restarts it from the replica's figure. Returns the number of holds removed.

if redis.replicate_commands then pcall(redis.replicate_commands) end

local hold_id = ARGV[1]
local actual = ARGV[2]
local ttl = tonumber(ARGV[3])
local removed = 0
for j = 1, #KEYS / 2 do
  local L, Z = KEYS[2 * j - 1], KEYS[2 * j]
  removed = removed + redis.call('ZREM', Z, hold_id)
  local a = redis.call('HGET', L, 'a:' .. hold_id)
  if a then
    redis.call('HDEL', L, 'a:' .. hold_id)
    redis.call('HINCRBY', L, 'h', string.format('%.0f', -tonumber(a)))
  end
  if redis.call('HEXISTS', L, 'e') == 1 then
    redis.call('HINCRBY', L, 's', actual)
    redis.call('PEXPIRE', L, ttl)
  end
end
return removed
