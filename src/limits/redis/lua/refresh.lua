-- refresh.lua: push forward the expiry of the live leases one instance holds in one set.
--
-- KEYS[1]     lease set (slots.lua: member = lease id, score = expiry ms; a block of k
--             slots is the members `<block id>#1` .. `#k`)
-- ARGV[1]     lease ms
-- ARGV[2..]   lease ids still in flight on the calling instance: requests' and blocks'
-- Only leases still present are touched: one that already expired and was purged stays
-- gone, since its slot may have been handed to someone else. A block's members all get
-- the new expiry.
-- Returns the ids that were no longer recorded (empty when every one was refreshed), so
-- the caller stops using exactly those and keeps the rest.

if redis.replicate_commands then pcall(redis.replicate_commands) end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- #include slots.lua

local set = KEYS[1]
local lease_ms = tonumber(ARGV[1])
local until_ms = now + lease_ms

local args = {}
local missing = {}
local any = false
for i = 2, #ARGV do
  if redis.call('ZSCORE', set, ARGV[i]) then
    args[#args + 1] = until_ms
    args[#args + 1] = ARGV[i]
  elseif refresh_block(set, ARGV[i], until_ms) then
    any = true
  else
    missing[#missing + 1] = ARGV[i]
  end
end
if #args > 0 then redis.call('ZADD', set, 'XX', unpack(args)) end
if #args > 0 or any then keep_for(set, lease_ms) end
return missing
