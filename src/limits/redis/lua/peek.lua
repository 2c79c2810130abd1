-- peek.lua: a key's own RPM/TPM quota figures now, without changing anything.
--
-- KEYS[1]  key RPM bucket, KEYS[2] key TPM bucket (see bucket.lua; absent = full)
-- ARGV[1]  key rpm, ARGV[2] key tpm (<= 0: no such limit, figures 0)
-- Returns {rpm remaining, rpm reset ms, tpm remaining, tpm reset ms}, as admit.lua reports
-- them (bucket.lua's quota): remaining = whole tokens in the bucket (never below 0), reset =
-- until full again.
-- Expired slices may be dropped from a bucket's record (what any reader does); the level
-- itself is not written.

-- #include bucket.lua

local function figures(key, cap)
  if cap <= 0 then return 0, 0 end
  return quota((bucket(key, cap)), cap)
end

local rr, rs = figures(KEYS[1], tonumber(ARGV[1]))
local tr, ts = figures(KEYS[2], tonumber(ARGV[2]))
return {rr, rs, tr, ts}
