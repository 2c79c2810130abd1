-- lease.lua: admit one request on a key's own RPM/TPM buckets and concurrency slots, give
-- back what is left of the calling instance's previous slice, and lease it a new slice and
-- a (bigger) block of slots when the key is far from its limits, in one call. Only for
-- requests limited by the key's own RPM/TPM/concurrency alone (lease-path.ts).
--
-- KEYS[1] key RPM bucket, KEYS[2] key TPM bucket (bucket.lua), KEYS[3] key lease set,
-- KEYS[4] its version 2 block weights (slots.lua: read, never written); all under the key's
-- hash tag
-- ARGV: 1 rpm capacity, 2 tpm capacity (0 = no such limit), 3 tokens (TPM reservation),
--       4 deadline in Redis time ms (0 = none; as admit.lua: past it nothing changes),
--       5 previous slice id ('' = none), 6 its rpm left, 7 its tpm left,
--       8 new slice id, 9 rpm wanted, 10 tpm wanted (0 = none asked of that bucket),
--       11 slice lifetime ms (Redis time; the instance stops using it sooner),
--       12 rpm to keep, 13 tpm to keep: a slice is granted only when the bucket still holds
--       this much after the request and the slice, so that near the limit every instance
--       goes back to one call per request and admissions stay exact.
--       14 concurrency limit C (0 = none), 15 this request's lease id, 16 lease ms,
--       17 the instance's block id ('' = none), 18 block weight wanted (0 = none asked),
--       19 most slots in use with the block granted (a share of C): the block is set to
--       that many slots only when, after the request, slots in use (this block's current
--       weight included) - current weight + wanted <= ARGV[19].
--       20 the news channel ('' = none; src/limits/redis/ledger-news.ts)
--
-- The request is checked as admit.lua checks it, by the same bucket.lua admit_wait (RPM
-- holds 1; TPM holds the estimate or is full; the same retry wait), in admit.lua's order
-- for the key's own limits: RPM, TPM, concurrency (the first failure names the code,
-- retryAfterMs is the longest wait among failures); nothing is consumed on a denial,
-- though the previous slice is still given back.
-- A slice is all-or-nothing across the buckets asked of.
-- Returns {1, 0, 0, now, granted (0/1), rpm remaining, rpm reset, tpm remaining, tpm reset,
-- block granted (0/1), block weight now (0 = no block: never had one, or it expired)}
-- (remaining excludes the new slice), {0, code, retryAfterMs, now, 0, rpm remaining, rpm reset,
-- tpm remaining, tpm reset, 0, 0, in the way} (code 2 rpm, 3 tpm, 4 concurrency; the buckets
-- as found), or {-1, 0, 0, now} past the deadline. A denial leaves the block as it is.
-- A denial on the buckets alone that would pass were the slices other instances hold back
-- in them publishes those buckets' keys on the news channel, so that those instances give
-- what is left of theirs back, and says so (in the way = 1): the caller asks again a moment
-- later. An idle instance's slice then lowers no other instance's ceiling for long, and N+1
-- requests at once still admit N when traffic moved between instances.

-- #include bucket.lua
-- #include slots.lua

local rpm, tpm, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local deadline = tonumber(ARGV[4]) or 0
local old_id, old_r, old_t = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local new_id, want_r, want_t = ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10])
local slice_ms, keep_r, keep_t = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local conc, slot_id, lease_ms = tonumber(ARGV[14]) or 0, ARGV[15], tonumber(ARGV[16])
local block_id, want_w, keep_w = ARGV[17] or '', tonumber(ARGV[18]) or 0, tonumber(ARGV[19]) or 0
local channel = ARGV[20] or ''
if deadline > 0 and now > deadline then return {-1, 0, 0, now} end

local caps = {rpm, tpm}
local lvl, ceil = {}, {}
for i = 1, 2 do
  if caps[i] > 0 then
    local left = (i == 1) and old_r or old_t
    local back = old_id ~= '' and drop_slice(KEYS[i], old_id)
    lvl[i], ceil[i] = bucket(KEYS[i], caps[i])
    if back and left > 0 then lvl[i] = math.min(ceil[i], lvl[i] + left) end
  end
end

local code, wait = 0, 0
-- w = 0: that check passed.
local function deny(c, w)
  if w <= 0 then return end
  if code == 0 then code = c end
  if w > wait then wait = w end
end
if rpm > 0 then deny(2, admit_wait(lvl[1], rpm)) end
if tpm > 0 then deny(3, admit_wait(lvl[2], tpm, tokens, ceil[2])) end
local in_use = 0
if conc > 0 then
  in_use = held_slots(KEYS[3], KEYS[4])
  if in_use >= conc then deny(4, conc_wait(KEYS[3])) end
end
-- Whether the buckets would admit the request with every other slice back (the caller's
-- own was given back above): a slice's owner may have used none of it. Concurrency, which
-- slices do not hold, must have passed.
local function slices_in_the_way()
  if channel == '' or (conc > 0 and in_use >= conc) then return false end
  local any = false
  for i = 1, 2 do
    if caps[i] > 0 then
      local others = caps[i] - ceil[i]
      if others > 0 then any = true end
      local w
      if i == 1 then w = admit_wait(lvl[1] + others, rpm) else w = admit_wait(lvl[2] + others, tpm, tokens, ceil[2] + others) end
      if w > 0 then return false end
    end
  end
  return any
end

if code ~= 0 then
  -- The previous slice's remainder is back in the bucket even though this request is not.
  local q = {0, 0, 0, 0}
  for i = 1, 2 do
    if caps[i] > 0 then
      if old_id ~= '' then store(KEYS[i], caps[i], lvl[i]) end
      q[2 * i - 1], q[2 * i] = quota(lvl[i], caps[i])
    end
  end
  local in_the_way = 0
  if slices_in_the_way() then
    in_the_way = 1
    -- pcall: a user whose ACL allows no channels still gets its answer
    for i = 1, 2 do
      if caps[i] > 0 and caps[i] > ceil[i] then redis.pcall('PUBLISH', channel, KEYS[i]) end
    end
  end
  return {0, code, wait, now, 0, q[1], q[2], q[3], q[4], 0, 0, in_the_way}
end

if rpm > 0 then lvl[1] = lvl[1] - 1 end
if tpm > 0 then lvl[2] = lvl[2] - tokens end

local wants = {want_r, want_t}
local keeps = {keep_r, keep_t}
local grant = (want_r > 0 or want_t > 0)
for i = 1, 2 do
  if caps[i] > 0 and wants[i] > 0 and lvl[i] - wants[i] < keeps[i] then grant = false end
end
local q = {0, 0, 0, 0}
for i = 1, 2 do
  if caps[i] > 0 then
    q[2 * i - 1], q[2 * i] = quota(lvl[i], caps[i])
    if grant and wants[i] > 0 then
      lvl[i] = lvl[i] - wants[i]
      add_slice(KEYS[i], new_id, wants[i], now + slice_ms)
    end
    store(KEYS[i], caps[i], lvl[i])
  end
end
if grant then grant = 1 else grant = 0 end

local block_grant, weight = 0, 0
if conc > 0 then
  take_slot(KEYS[3], slot_id, lease_ms)
  in_use = in_use + 1
  weight = block_weight(KEYS[3], block_id)
  if want_w > weight and in_use - weight + want_w <= keep_w then
    set_block(KEYS[3], block_id, want_w, lease_ms)
    block_grant, weight = 1, want_w
  end
end
return {1, 0, 0, now, grant, q[1], q[2], q[3], q[4], block_grant, weight}
