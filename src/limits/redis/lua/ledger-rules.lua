-- ledger-rules.lua: the spend-hold rules of src/limits/ledger.ts (liveNano, holdFits), stated once for
-- the scripts (hold.lua, ledger.lua include it; scripts.ts pastes it in). No KEYS or ARGV.
-- Money is integer nano-units.

-- budget: live spend = max(base, b0 + s) + h; wallet: live balance = min(base, b0 - s) - h
local function live_of(kind, base, b0, s, h)
  if kind == 'wallet' then return math.min(base, b0 - s) - h end
  return math.max(base, b0 + s) + h
end

-- A budget at or over its limit refuses even a zero hold; a wallet needs a positive balance.
local function hold_fits(kind, live, amount, limit)
  if kind == 'wallet' then return live > 0 and amount <= live end
  if not limit then return true end
  return live < limit and live + amount <= limit
end
