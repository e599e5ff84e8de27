-- numbers.lua: stored numbers parsed, not coerced (stored_num, checked, why one is corrupt:
-- not_a_number), and an amount as a person reads it (amount_text).
-- needs: (none)

-- Stored numbers are parsed, not coerced: the project writes every limit, counter, hold,
-- deadline and time as a canonical decimal integer (digits only, no sign, no leading
-- zero, below 2^53: how Redis writes a Lua integer, how redis-py writes a Python int; no
-- script and no Python code stores a negative number). Anything else ('abc', '', '-5',
-- '1.5', '1e8', '0x7fffffff', ' 5', '+5', '5.0', '007', '0x1p30', which Lua's tonumber
-- would read as numbers) is corrupt state. The level holding it is stopped with reason
-- state_corrupt (fail closed): it never lifts a ceiling and never makes a script raise.
-- The Python twin is coordinator/store/state_check.py (canonical_int).
local MAX_EXACT = 9007199254740992  -- 2^53: integers above it are not exact in Lua

-- The number stored in a field (an HMGET value) or decoded from a record (cjson gives
-- numbers): nil when absent, false when corrupt. Digits-only strings above 2^53 are
-- corrupt too (tonumber reads them inexactly, or as inf).
local find = string.find
local function stored_num(v)
  if not v then return nil end
  local t = type(v)
  if t == 'string' then
    if v == '0' then return 0 end
    if find(v, '^[1-9]%d*$') then
      local n = tonumber(v)
      if n < MAX_EXACT then return n end
    end
    return false
  end
  if t == 'number' and v >= 0 and v < MAX_EXACT and math.floor(v) == v then return v end
  return false
end

-- Why a stored value (of field) is corrupt: the detail of a state_corrupt stop.
local function not_a_number(field, value)
  local shown = string.sub(tostring(value), 1, 40)
  return 'field ' .. field .. ' holds ' .. cjson.encode(shown) .. ', not a number'
end

-- values[i] (field name) as a number, default when absent; nil and the reason when corrupt.
local function checked(values, i, field, default)
  local n = stored_num(values[i])
  if n == false then return nil, not_a_number(field, values[i]) end
  if n == nil then return default end
  return n
end

-- An amount of dimension d as a person reads it: usd (micro-USD) in dollars ($0.021203,
-- $0.60), every other dimension as the integer it is. Used in stop and refusal details,
-- which SafetyEvents and budgetctl show.
local function amount_text(d, n)
  if d ~= 'usd' then return tostring(n) end
  local s = string.format('%.6f', n / 1000000)
  return '$' .. (string.gsub(s, '(%.%d%d%d-)0+$', '%1'))
end
