-- settle.lua: adjust token buckets and give back a lease's slots, in one hash tag.
-- Used to settle a finished request (TPM refund or extra charge, free the slots) and to
-- undo a Cluster admission half when the other half was denied (RPM and TPM given back).
--
-- KEYS[1..n]    token buckets to adjust (hash {t, ts}; absent = full)
-- KEYS[n+1..]   lease sets (ZSET) to remove the lease from
-- ARGV[1]       lease id
-- ARGV[2]       n, the number of buckets
-- ARGV[2+2j-1]  capacity of bucket j (j = 1..n)
-- ARGV[2+2j]    delta for bucket j: positive gives tokens back (never above capacity),
--               negative charges more (the bucket may go negative)
-- Returns the number of lease-set entries removed.

if redis.replicate_commands then pcall(redis.replicate_commands) end

local WINDOW = 60000
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local lease_id = ARGV[1]
local n = tonumber(ARGV[2])

for j = 1, n do
  local key = KEYS[j]
  local cap = tonumber(ARGV[1 + 2 * j])
  local delta = tonumber(ARGV[2 + 2 * j])
  local v = redis.call('HMGET', key, 't', 'ts')
  local lvl = cap
  if v[1] then
    local elapsed = now - tonumber(v[2])
    if elapsed < 0 then elapsed = 0 end
    lvl = math.min(cap, tonumber(v[1]) + elapsed * cap / WINDOW)
  end
  lvl = math.min(cap, lvl + delta)
  if lvl >= cap then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 't', tostring(lvl), 'ts', tostring(now))
    redis.call('PEXPIRE', key, math.max(1, math.ceil((cap - lvl) * WINDOW / cap)))
  end
end

local removed = 0
for k = n + 1, #KEYS do
  removed = removed + redis.call('ZREM', KEYS[k], lease_id)
end
return removed
