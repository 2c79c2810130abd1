-- claim.lua: claim a name once for one holder's epoch (Limiter.claimOnce: budget alerts,
-- DESIGN section 13), for every instance sharing this Redis.
--
-- KEYS[1]  the holder's claims hash `{<prefix>:t:<tag>}:c:<holder>` (under its ledger's hash
--          tag): e = the epoch its claims belong to, n:<name> = the token that claimed name,
--          u:<name> = while the claimer has not done what it claimed (an alert not delivered
--          yet), Redis time in ms until which the claim is its own; past it, another
--          claimer takes the claim over (the first one stopped or died)
-- ARGV[1]  epoch (a whole number)
-- ARGV[2]  name
-- ARGV[3]  the claimer's token
-- ARGV[4]  how long the hash is kept after this claim, ms
-- ARGV[5]  pending ms (optional): > 0 claims until the claimer says it is done, renewed by
--          each `renew`; 0 or absent claims for good
-- ARGV[6]  turn (optional): '' claims; by the token that holds the claim: 'renew' keeps it
--          pending ARGV[5] ms more, 'done' makes it for good, 'release' lets the next
--          claimer take it over at once
-- A newer epoch forgets the older one's claims (a new epoch arms the alerts again); an older
-- epoch than the one recorded is refused, since its figures are stale. The same token
-- asking again is granted again: a retry after an answer lost to a timeout.
-- Returns the token that holds the claim (this one, or the first claimer's), false when the
-- epoch is older than the one recorded; with ARGV[5] > 0, {that token, 1 while the claim is
-- pending} instead of the token.

if redis.replicate_commands then pcall(redis.replicate_commands) end

local K = KEYS[1]
local epoch = tonumber(ARGV[1])
local name = ARGV[2]
local token = ARGV[3]
local pending_ms = tonumber(ARGV[5] or '0') or 0
local turn = ARGV[6] or ''
local field, until_field = 'n:' .. name, 'u:' .. name
local recorded = tonumber(redis.call('HGET', K, 'e') or '-1')
if epoch < recorded then return false end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local function answer(holder)
  if pending_ms <= 0 then return holder end
  local pending = 0
  if redis.call('HEXISTS', K, until_field) == 1 then pending = 1 end
  return { holder, pending }
end

if turn ~= '' then
  -- a turn changes only a claim this token holds in the recorded epoch
  local holder = false
  if epoch == recorded then holder = redis.call('HGET', K, field) end
  if holder ~= token then return answer(holder or '') end
  if turn == 'renew' then redis.call('HSET', K, until_field, tostring(now + pending_ms))
  elseif turn == 'done' then redis.call('HDEL', K, until_field)
  elseif turn == 'release' then redis.call('HSET', K, until_field, '0') end
  return answer(holder)
end
if epoch > recorded then
  redis.call('DEL', K)
  redis.call('HSET', K, 'e', ARGV[1])
end
local holder = redis.call('HGET', K, field)
if holder == token then
  -- asked again (an answer lost to a timeout): still pending unless its claimer said done
  if pending_ms > 0 and redis.call('HEXISTS', K, until_field) == 1 then
    redis.call('HSET', K, until_field, tostring(now + pending_ms))
  end
elseif holder then
  local until_ms = tonumber(redis.call('HGET', K, until_field) or '')
  if not until_ms or until_ms > now then return answer(holder) end
  -- left pending past its time (its claimer stopped or died): taken over
  redis.call('HSET', K, field, token)
  if pending_ms <= 0 then redis.call('HDEL', K, until_field) end
else
  redis.call('HSET', K, field, token)
end
if pending_ms > 0 and holder ~= token then redis.call('HSET', K, until_field, tostring(now + pending_ms)) end
redis.call('PEXPIRE', K, tonumber(ARGV[4]))
return answer(token)
