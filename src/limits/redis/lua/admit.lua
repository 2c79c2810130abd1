-- admit.lua: check every limit, then commit all of them or none.
--
-- KEYS, by group; a group is present only when its flag is 1, route group first:
--   route group (ARGV[3] = 1): route RPM bucket, route lease set
--   key group   (ARGV[6] = 1): key RPM bucket, key TPM bucket, key lease set, key lease
--                set's block weights (slots.lua), and when the key has a per-model limit
--                (ARGV[12] or ARGV[13] > 0) the model's RPM and TPM buckets (same hash tag)
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
-- lease.lua applies too. Lease sets: see slots.lua (a block of slots leased to an instance
-- counts its whole weight).
--
-- Returns {1, 0, 0, now, rpm remaining, rpm reset ms, tpm remaining, tpm reset ms} when
-- admitted (the key's own buckets after this admission, bucket.lua's quota: reset = until
-- full again), else {0, code, retryAfterMs, now} with no limit consumed (expired leases are
-- purged either way), or {-1, 0, 0, now} past the deadline.
-- code: 1 route_capacity_exceeded, 2 rpm_exceeded, 3 tpm_exceeded, 4 concurrency_exceeded;
-- checks run route, key RPM, key TPM, concurrency, model RPM (2), model TPM (3); the first
-- failing check names the code, retryAfterMs is the longest wait among failures.

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

local function level(key, cap) return (bucket(key, cap)) end

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
local wait = 0
local function deny(c, w)
  if code == 0 then code = c end
  if w > wait then wait = w end
end

-- A bucket check (bucket.lua's admit_wait; `tpm_tokens` only for TPM) that denies with code
-- c. Returns the bucket's level, which the commit below writes back less what it takes.
local function checked(c, key, cap, tpm_tokens)
  local lvl = level(key, cap)
  local w = admit_wait(lvl, cap, tpm_tokens)
  if w > 0 then deny(c, w) end
  return lvl
end

local r_rpm_level, k_rpm_level, k_tpm_level, m_rpm_level, m_tpm_level
if has_route then
  if route_conc > 0 and held_slots(r_conc_key, nil) >= route_conc then deny(1, conc_wait(r_conc_key)) end
  if route_rpm > 0 then r_rpm_level = checked(1, r_rpm_key, route_rpm) end
end
if has_key then
  if key_rpm > 0 then k_rpm_level = checked(2, k_rpm_key, key_rpm) end
  if key_tpm > 0 then k_tpm_level = checked(3, k_tpm_key, key_tpm, tokens) end
  if key_conc > 0 and held_slots(k_conc_key, k_conc_w) >= key_conc then deny(4, conc_wait(k_conc_key)) end
  if model_rpm > 0 then m_rpm_level = checked(2, m_rpm_key, model_rpm) end
  if model_tpm > 0 then m_tpm_level = checked(3, m_tpm_key, model_tpm, tokens) end
end
if code ~= 0 then return {0, code, wait, now} end

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

local q = {0, 0, 0, 0}
if has_key and key_rpm > 0 then q[1], q[2] = quota(k_rpm_level - 1, key_rpm) end
if has_key and key_tpm > 0 then
  local lvl = k_tpm_level
  if tokens > 0 then lvl = lvl - tokens end
  q[3], q[4] = quota(lvl, key_tpm)
end
return {1, 0, 0, now, q[1], q[2], q[3], q[4]}
