-- peek.lua: a key's own RPM/TPM quota figures now, without changing anything.
--
-- KEYS[1]  key RPM bucket, KEYS[2] key TPM bucket (hashes {t, ts}; absent = full)
-- ARGV[1]  key rpm, ARGV[2] key tpm (<= 0: no such limit, figures 0)
-- Returns {rpm remaining, rpm reset ms, tpm remaining, tpm reset ms}, as admit.lua reports
-- them: remaining = whole tokens in the bucket (never below 0), reset = until full again.

local WINDOW = 60000
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local function figures(key, cap)
  if cap <= 0 then return 0, 0 end
  local v = redis.call('HMGET', key, 't', 'ts')
  local lvl = cap
  if v[1] then
    local elapsed = now - tonumber(v[2])
    if elapsed < 0 then elapsed = 0 end
    lvl = math.min(cap, tonumber(v[1]) + elapsed * cap / WINDOW)
  end
  local reset = 0
  if lvl < cap then reset = math.ceil((cap - lvl) * WINDOW / cap) end
  return math.max(0, math.floor(lvl)), reset
end

local rr, rs = figures(KEYS[1], tonumber(ARGV[1]))
local tr, ts = figures(KEYS[2], tonumber(ARGV[2]))
return {rr, rs, tr, ts}
