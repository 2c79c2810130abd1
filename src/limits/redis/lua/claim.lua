-- claim.lua: claim a name once for one holder's epoch (Limiter.claimOnce: budget alerts,
-- DESIGN section 13), for every instance sharing this Redis.
--
-- KEYS[1]  the holder's claims hash `{<prefix>:t:<tag>}:c:<holder>` (under its ledger's hash
--          tag): e = the epoch its claims belong to, n:<name> = the token that claimed name
-- ARGV[1]  epoch (a whole number)
-- ARGV[2]  name
-- ARGV[3]  the claimer's token
-- ARGV[4]  how long the hash is kept after this claim, ms
-- A newer epoch forgets the older one's claims (a new epoch arms the alerts again); an older
-- epoch than the one recorded is refused, since its figures are stale. The same token
-- asking again is granted again: a retry after an answer lost to a timeout.
-- Returns the token that holds the claim (this one, or the first claimer's), false when the
-- epoch is older than the one recorded.

local K = KEYS[1]
local epoch = tonumber(ARGV[1])
local field = 'n:' .. ARGV[2]
local recorded = tonumber(redis.call('HGET', K, 'e') or '-1')
if epoch < recorded then return false end
if epoch > recorded then
  redis.call('DEL', K)
  redis.call('HSET', K, 'e', ARGV[1])
end
local holder = redis.call('HGET', K, field)
if holder and holder ~= ARGV[3] then return holder end
if not holder then redis.call('HSET', K, field, ARGV[3]) end
redis.call('PEXPIRE', K, tonumber(ARGV[4]))
return ARGV[3]
