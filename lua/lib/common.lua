-- common.lua: Redis time (now_ms), comma-separated ids (split), a run of pairs as a flat
-- list (flat_pairs) and the capped lists of node records and events (append_capped).
-- needs: (none)

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function split(csv)
  local out = {}
  for part in string.gmatch(csv, '[^,]+') do out[#out + 1] = part end
  return out
end

-- A run of pairs (a list of groups, as the slot prologue binds them) as the flat list
-- {g[first], g[second], ...} that reservation records and finish use.
local function flat_pairs(groups, first, second)
  local out = {}
  for _, g in ipairs(groups) do
    out[#out + 1] = g[first]
    out[#out + 1] = g[second]
  end
  return out
end

-- Appends value to a capped list (a context's node records or its events; a list, not a
-- stream: Redis preallocates about 4 KB for a stream's first entry): once the list passes
-- cap by a tenth it is trimmed to its cap newest entries, so a trim is rare (as XADD's
-- MAXLEN ~). cap may be a string (an ARGV).
local function append_capped(key, cap, value)
  cap = tonumber(cap)
  if redis.call('RPUSH', key, value) > cap + math.floor(cap / 10) then
    redis.call('LTRIM', key, -cap, -1)
  end
end
