-- refresh.lua: push forward the expiry of the live leases one instance holds in one set.
--
-- KEYS[1]     lease set (ZSET: member = lease id, score = expiry ms)
-- KEYS[2]     optional: the set's block weights (slots.lua), kept at least as long as the set
-- ARGV[1]     lease ms
-- ARGV[2..]   lease ids still in flight on the calling instance
-- Only leases still present are touched: one that already expired and was purged stays
-- gone, since its slot may have been handed to someone else.
-- Returns the ids that were no longer recorded (empty when every one was refreshed), so
-- the caller stops using exactly those and keeps the rest.

if redis.replicate_commands then pcall(redis.replicate_commands) end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local lease_ms = tonumber(ARGV[1])
local until_ms = now + lease_ms

local args = {}
local missing = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    args[#args + 1] = until_ms
    args[#args + 1] = ARGV[i]
  else
    missing[#missing + 1] = ARGV[i]
  end
end
if #args == 0 then return missing end
redis.call('ZADD', KEYS[1], 'XX', unpack(args))
if redis.call('PTTL', KEYS[1]) < lease_ms then redis.call('PEXPIRE', KEYS[1], lease_ms) end
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 and redis.call('PTTL', KEYS[2]) < lease_ms then
  redis.call('PEXPIRE', KEYS[2], lease_ms)
end
return missing
