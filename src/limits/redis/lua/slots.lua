-- slots.lua: a key's (or an upstream's) concurrency slots, included by admit.lua, lease.lua,
-- settle.lua (after bucket.lua, whose `now` it uses) and refresh.lua (after its own `now`).
-- It names no KEYS or ARGV of its own: the including script passes the keys in.
--
-- Stored encoding, version 3. A lease set is a ZSET: member = lease id, score = expiry ms
-- (Redis time), and every member is one slot in use. A request holds one member. A block of
-- k slots an instance leased (lease.lua) is k members, `<block id>#1` .. `<block id>#k`
-- (lease ids never hold '#'), all with one expiry: it grows and shrinks at the top, and is
-- refreshed and expires as a whole, so a crashed instance's block goes by itself and its
-- members stay #1..#k. Slots in use = ZCARD.
--
-- Why k members: every build that admits on a lease set counts its members with ZCARD,
-- back to version 1, the build before blocks (its admit.lua purges expired members, counts
-- them, adds one lease id; its settle.lua removes that id). Those scripts touch only their
-- own members and expired ones, so they count a block as k, and a fleet running old and
-- new builds on one Redis never admits more than the limit while it is rolled over. Not
-- chosen: a set under a versioned name (an old build reads only its own set, so every block
-- would have to be k members there as well, written twice); a marker that makes an old
-- script fail (under `onError: open` the old instance then admits without any limit).
--
-- Version 2 (0.1.0) stored a block as one member with its weight k in the hash `<set>w`
-- (field = block id); its instances count version 3 blocks right (k members, no field).
-- While they may share a set, held_slots counts their blocks as k too and drops the weight
-- of one whose member has gone. Nothing writes that hash any more.

local CONC_RETRY = 1000
-- Members per ZADD/ZREM of a block: Lua's unpack is bounded by the C stack.
local BLOCK_CHUNK = 1000

-- Slots in use now; drops expired leases and the version 2 weights of blocks gone.
local function held_slots(set, weights)
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
  local n = redis.call('ZCARD', set)
  if weights and redis.call('EXISTS', weights) == 1 then
    local all = redis.call('HGETALL', weights)
    for j = 1, #all, 2 do
      if redis.call('ZSCORE', set, all[j]) then
        n = n + tonumber(all[j + 1]) - 1
      else
        redis.call('HDEL', weights, all[j])
      end
    end
  end
  return n
end

-- Until the soonest lease of the set expires (at most CONC_RETRY).
local function conc_wait(set)
  local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  if not first[2] then return CONC_RETRY end
  return math.max(1, math.min(CONC_RETRY, math.ceil(tonumber(first[2]) - now)))
end

-- Only ever lengthens a key's TTL: an instance configured with a shorter lease must not cut
-- another instance's leases short.
local function keep_for(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

local function take_slot(set, id, ms)
  redis.call('ZADD', set, now + ms, id)
  keep_for(set, ms)
end

local function block_member(id, j) return id .. '#' .. j end

-- `cmd` (a command and its leading arguments) on members first..last of a block, each
-- preceded by `score` when one is given (ZADD).
local function on_block(cmd, id, first, last, score)
  local j = first
  while j <= last do
    local args = {unpack(cmd)}
    for m = j, math.min(last, j + BLOCK_CHUNK - 1) do
      if score then args[#args + 1] = score end
      args[#args + 1] = block_member(id, m)
    end
    redis.call(unpack(args))
    j = j + BLOCK_CHUNK
  end
end

-- The weight Redis records for a block now (0 = none, or expired): the top of #1..#k,
-- found by doubling, then halving.
local function block_weight(set, id)
  if id == '' or not redis.call('ZSCORE', set, block_member(id, 1)) then return 0 end
  local lo, hi = 1, 2
  while redis.call('ZSCORE', set, block_member(id, hi)) do lo, hi = hi, hi * 2 end
  while hi - lo > 1 do
    local mid = math.floor((lo + hi) / 2)
    if redis.call('ZSCORE', set, block_member(id, mid)) then lo = mid else hi = mid end
  end
  return lo
end

-- Records (or grows) a block to `w` slots, at least its weight now, with a fresh expiry.
local function set_block(set, id, w, ms)
  on_block({'ZADD', set}, id, 1, w, now + ms)
  keep_for(set, ms)
end

-- Gives back a block's slots above `w` (0 ends it). A block that expired stays gone, and
-- none is grown here: only lease.lua grows one, under the limit.
local function shrink_block(set, id, w)
  local k = block_weight(set, id)
  if w < k then on_block({'ZREM', set}, id, math.max(w, 0) + 1, k) end
end

-- Pushes a block's expiry to `until_ms`; false when Redis no longer records it.
local function refresh_block(set, id, until_ms)
  local k = block_weight(set, id)
  if k == 0 then return false end
  on_block({'ZADD', set, 'XX'}, id, 1, k, until_ms)
  return true
end
