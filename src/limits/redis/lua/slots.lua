-- slots.lua: a key's (or an upstream's) concurrency slots, included by admit.lua and
-- lease.lua after bucket.lua (it uses bucket.lua's `now`). It names no KEYS or ARGV of its
-- own: the including script passes the keys in.
--
-- A lease set is a ZSET: member = lease id, score = expiry ms (Redis time). A request holds
-- one member. A block of k slots an instance leased (lease.lua) is one member too, with its
-- weight k in the set's weights hash (field = block id, value = k); the keeper refreshes a
-- block's expiry like any lease, so a crashed instance's block expires by itself. Slots in
-- use = members + sum of (k - 1) over blocks whose member is still in the set; a weight
-- whose member has expired is dropped by the next reader.

local CONC_RETRY = 1000

-- Slots in use now; drops expired leases and the weights of expired blocks.
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

-- The weight Redis records for a block now (0 = none, or expired).
local function block_weight(set, weights, id)
  if id == '' or not redis.call('ZSCORE', set, id) then return 0 end
  return tonumber(redis.call('HGET', weights, id) or '1')
end

-- Records (or resizes) a block of `w` slots with a fresh expiry.
local function set_block(set, weights, id, w, ms)
  take_slot(set, id, ms)
  redis.call('HSET', weights, id, tostring(w))
  keep_for(weights, ms)
end
