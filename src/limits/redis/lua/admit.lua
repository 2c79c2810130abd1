-- admit.lua: check every limit, then commit all of them or none.
--
-- KEYS, by group; a group is present only when its flag is 1, route group first:
--   route group (ARGV[3] = 1): route RPM bucket, route lease set
--   key group   (ARGV[6] = 1): key RPM bucket, key TPM bucket, key lease set, key lease
--                set's version 2 block weights (slots.lua: read, never written), and when
--                the key has a per-model limit (ARGV[12] or ARGV[13] > 0) the model's RPM
--                and TPM buckets (same hash tag)
-- Standalone Redis gets both groups in one call. In Cluster each group lives under its own
-- hash tag, so the client sends one call per group in parallel (see request-path.ts).
--
-- ARGV: 1 lease id, 2 lease ms, 3 route flag, 4 route concurrency, 5 route rpm,
--       6 key flag, 7 key rpm, 8 key tpm, 9 key concurrency, 10 tokens (TPM reservation),
--       11 deadline in Redis time ms (0 = none): the caller has given up on an admission
--       that runs later (Redis was paused or the link stalled), so it must change nothing,
--       12 model rpm, 13 model tpm (a limit <= 0 means unlimited)
--
-- Buckets: see bucket.lua (slices leased from a key's buckets lower their ceiling). Every
-- RPM and TPM check (route, key, model) is bucket.lua's admit_wait, the rule and retry wait
-- lease.lua applies too. Lease sets: see slots.lua (one member per slot, a block of k slots
-- leased to an instance is k members; its stored encoding across versions).
--
-- Returns {1, 0, 0, now, rpm remaining, rpm reset ms, tpm remaining, tpm reset ms} when
-- admitted (the key's own buckets after this admission, bucket.lua's quota: reset = until
-- full again), else {0, code, retryAfterMs, now, rpm remaining, rpm reset ms, tpm remaining,
-- tpm reset ms, check} with no limit consumed (the key's buckets as found; expired leases are
-- purged either way), or {-1, 0, 0, now} past the deadline.
-- code: 1 route_capacity_exceeded, 2 rpm_exceeded, 3 tpm_exceeded, 4 concurrency_exceeded;
-- check (which one refused, where checks share a code): 1 route concurrency, 2 route RPM,
-- 3 key RPM, 4 key TPM, 5 key concurrency, 6 model RPM, 7 model TPM: the order they run in.
-- The first failing check names the code and the check; retryAfterMs is the longest wait
-- among failures.

-- #include bucket.lua
-- #include slots.lua

local lease_id = ARGV[1]
local lease_ms = tonumber(ARGV[2])
local has_route = ARGV[3] == '1'
local route_conc = tonumber(ARGV[4])
local route_rpm = tonumber(ARGV[5])
local has_key = ARGV[6] == '1'
local key_rpm = tonumber(ARGV[7])
local key_tpm = tonumber(ARGV[8])
local key_conc = tonumber(ARGV[9])
local tokens = tonumber(ARGV[10])
local deadline = tonumber(ARGV[11]) or 0
local model_rpm = tonumber(ARGV[12]) or 0
local model_tpm = tonumber(ARGV[13]) or 0
if deadline > 0 and now > deadline then return {-1, 0, 0, now} end


local i = 1
local r_rpm_key, r_conc_key, k_rpm_key, k_tpm_key, k_conc_key, k_conc_w, m_rpm_key, m_tpm_key
if has_route then
  r_rpm_key, r_conc_key = KEYS[i], KEYS[i + 1]
  i = i + 2
end
if has_key then
  k_rpm_key, k_tpm_key, k_conc_key, k_conc_w = KEYS[i], KEYS[i + 1], KEYS[i + 2], KEYS[i + 3]
  m_rpm_key, m_tpm_key = KEYS[i + 4], KEYS[i + 5]
end

local code = 0
local check = 0
local wait = 0
local function deny(c, ch, w)
  if code == 0 then code, check = c, ch end
  if w > wait then wait = w end
end

-- A bucket check (bucket.lua's admit_wait; `tpm_tokens` only for TPM) that denies with code
-- c as check ch. Returns the bucket's level, which the commit below writes back less what it takes.
local function checked(c, ch, key, cap, tpm_tokens)
  local lvl, ceiling = bucket(key, cap)
  local w = admit_wait(lvl, cap, tpm_tokens, ceiling)
  if w > 0 then deny(c, ch, w) end
  return lvl
end

-- The key's own quota figures at the given levels (0s for a limit it does not have).
local function key_quota(rpm_level, tpm_level)
  local q = {0, 0, 0, 0}
  if has_key and key_rpm > 0 then q[1], q[2] = quota(rpm_level, key_rpm) end
  if has_key and key_tpm > 0 then q[3], q[4] = quota(tpm_level, key_tpm) end
  return q
end

local r_rpm_level, k_rpm_level, k_tpm_level, m_rpm_level, m_tpm_level
if has_route then
  if route_conc > 0 and held_slots(r_conc_key, nil) >= route_conc then deny(1, 1, conc_wait(r_conc_key)) end
  if route_rpm > 0 then r_rpm_level = checked(1, 2, r_rpm_key, route_rpm) end
end
if has_key then
  if key_rpm > 0 then k_rpm_level = checked(2, 3, k_rpm_key, key_rpm) end
  if key_tpm > 0 then k_tpm_level = checked(3, 4, k_tpm_key, key_tpm, tokens) end
  if key_conc > 0 and held_slots(k_conc_key, k_conc_w) >= key_conc then deny(4, 5, conc_wait(k_conc_key)) end
  if model_rpm > 0 then m_rpm_level = checked(2, 6, m_rpm_key, model_rpm) end
  if model_tpm > 0 then m_tpm_level = checked(3, 7, m_tpm_key, model_tpm, tokens) end
end
if code ~= 0 then
  local q = key_quota(k_rpm_level, k_tpm_level)
  return {0, code, wait, now, q[1], q[2], q[3], q[4], check}
end

if has_route then
  if route_rpm > 0 then store(r_rpm_key, route_rpm, r_rpm_level - 1) end
  if route_conc > 0 then take_slot(r_conc_key, lease_id, lease_ms) end
end
if has_key then
  if key_rpm > 0 then store(k_rpm_key, key_rpm, k_rpm_level - 1) end
  if key_tpm > 0 and tokens > 0 then store(k_tpm_key, key_tpm, k_tpm_level - tokens) end
  if key_conc > 0 then take_slot(k_conc_key, lease_id, lease_ms) end
  if model_rpm > 0 then store(m_rpm_key, model_rpm, m_rpm_level - 1) end
  if model_tpm > 0 and tokens > 0 then store(m_tpm_key, model_tpm, m_tpm_level - tokens) end
end

local tpm_after = k_tpm_level
if tpm_after and tokens > 0 then tpm_after = tpm_after - tokens end
local q = key_quota(k_rpm_level and k_rpm_level - 1, tpm_after)
return {1, 0, 0, now, q[1], q[2], q[3], q[4]}
