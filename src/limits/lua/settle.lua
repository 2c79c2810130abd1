-- settle.lua: every settlement one instance has queued for one hash slot (a whole
-- standalone Redis), applied in one call. See settle-batch.ts.
--
-- KEYS: taken in order by the operations, as each one says below.
-- ARGV[1]: number of operations; then each operation, its kind first:
--   'b' (buckets and slots): lease id, slice id ('' = none), nb, ns, then nb pairs
--       (capacity, delta); KEYS: nb token buckets (bucket.lua), then ns lease sets (ZSET).
--       delta > 0 gives tokens back (never above the ceiling), < 0 charges more (the
--       bucket may go negative). With a slice id the slice ends first (its ceiling comes
--       back) and delta is what was left of it, given back only if the slice had not
--       expired. The lease is removed from each lease set (its slot freed).
--       Used for TPM settlement, undoing a Cluster admission half, slice returns.
--   'h' (spend hold): hold id, actual cost (integer nano-units), ledger TTL ms, holders n;
--       KEYS: two per holder, as hold.lua (ledger hash, hold set). The hold is removed
--       where still present (it may have expired, or a new epoch restarted the ledger); the
--       cost is added to `s` wherever the ledger exists, so a cost counts even when its
--       hold is gone. An expired ledger is not recreated: the next hold restarts it.
-- Returns the number of operations applied.

-- #include bucket.lua

local k = 1
local a = 2
local function arg()
  local v = ARGV[a]
  a = a + 1
  return v
end
local function key()
  local v = KEYS[k]
  k = k + 1
  return v
end

local ops = tonumber(ARGV[1])
for _ = 1, ops do
  local kind = arg()
  if kind == 'b' then
    local lease_id, slice_id, nb, ns = arg(), arg(), tonumber(arg()), tonumber(arg())
    for _ = 1, nb do
      local bkey, cap, delta = key(), tonumber(arg()), tonumber(arg())
      if slice_id ~= '' and not drop_slice(bkey, slice_id) and delta > 0 then delta = 0 end
      if delta ~= 0 then
        local lvl, ceiling = bucket(bkey, cap)
        store(bkey, cap, math.min(ceiling, lvl + delta))
      end
    end
    for _ = 1, ns do redis.call('ZREM', key(), lease_id) end
  else
    local hold_id, actual, ttl, n = arg(), arg(), tonumber(arg()), tonumber(arg())
    for _ = 1, n do
      local L, Z = key(), key()
      redis.call('ZREM', Z, hold_id)
      local held = redis.call('HGET', L, 'a:' .. hold_id)
      if held then
        redis.call('HDEL', L, 'a:' .. hold_id)
        redis.call('HINCRBY', L, 'h', string.format('%.0f', -tonumber(held)))
      end
      if redis.call('HEXISTS', L, 'e') == 1 then
        redis.call('HINCRBY', L, 's', actual)
        redis.call('PEXPIRE', L, ttl)
      end
    end
  end
end
return ops
