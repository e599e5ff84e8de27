-- data.lua: helpers of the context-data scripts (data_*.lua).
-- needs: (none)
--
-- It touches only keys the including script received in KEYS, as that script's contract
-- states: a context's levels (the groups data, dmeta, dview of its slot prologue), its
-- own level first, then its parent, up to the root:
--   bc:{R}:data:<id>   hash  key -> JSON value (the context's own data)
--   bc:{R}:dmeta:<id>  hash  iso (inherit | isolated | sandboxed; none = inherit), par,
--                            step, bytes (size of the data: keys + JSON), merges, expose...
--   bc:{R}:dview:<id>  hash  an isolated context's frozen view of its ancestors' data
-- Returns nothing itself; the helpers return Lua values to their script.
--
-- JSON is read by a small reader that keeps numbers, strings and object keys as the exact
-- text Python wrote: a merged value loses no float digits and no large integer (cjson
-- would round both), and an empty list stays a list (cjson cannot tell [] from {}).

-- HSET (or HDEL) of a flat list in slices: unpack() of more than a few thousand values
-- fails ("too many results to unpack").
local function data_call_chunked(cmd, key, flat, step)
  for i = 1, #flat, step do
    redis.call(cmd, key, unpack(flat, i, math.min(i + step - 1, #flat)))
  end
end

-- The value of `key` as the context sees it, and the level it came from (0 = its own),
-- or nil. Inherit goes on to the parent; isolated reads its frozen view and stops;
-- sandboxed stops.
local function data_lookup(levels, key)
  for i, keys in ipairs(levels) do
    local level = i - 1
    local v = redis.call('HGET', keys.data, key)
    if v then return v, level end
    local iso = redis.call('HGET', keys.dmeta, 'iso')
    if iso == 'sandboxed' then return nil end
    if iso == 'isolated' then
      v = redis.call('HGET', keys.dview, key)
      if v then return v, level + 1 end
      return nil
    end
  end
  return nil
end

-- The hashes a context reads, nearest first: its own data, its ancestors' as far as the
-- isolation levels allow, and the frozen view that ends an isolated walk.
local function data_sources(levels)
  local out = {}
  for _, keys in ipairs(levels) do
    out[#out + 1] = keys.data
    local iso = redis.call('HGET', keys.dmeta, 'iso')
    if iso == 'sandboxed' then return out end
    if iso == 'isolated' then
      out[#out + 1] = keys.dview
      return out
    end
  end
  return out
end

-- Everything the context sees as a flat {key, JSON, ...} list, the nearest value of each
-- key winning.
local function data_visible(levels)
  local seen, flat_out = {}, {}
  for _, hash in ipairs(data_sources(levels)) do
    local flat = redis.call('HGETALL', hash)
    for i = 1, #flat, 2 do
      if not seen[flat[i]] then
        seen[flat[i]] = true
        flat_out[#flat_out + 1] = flat[i]
        flat_out[#flat_out + 1] = flat[i + 1]
      end
    end
  end
  return flat_out
end

-- A parsed JSON value: {t = 'o', keys = {raw key, ...}, vals = {raw key -> value}},
-- {t = 'a', items = {...}}, or {t = 's', raw = text} for every scalar.
local json_value

local function json_ws(s, i)
  local _, e = string.find(s, '^[ \t\r\n]*', i)
  return e + 1
end

local function json_string(s, i)
  local j = i + 1
  while true do
    local q = string.find(s, '["\\]', j)
    if not q then error('context data: unterminated JSON string') end
    if string.sub(s, q, q) == '\\' then
      j = q + 2
    else
      return string.sub(s, i, q), q + 1
    end
  end
end

json_value = function(s, i)
  i = json_ws(s, i)
  local c = string.sub(s, i, i)
  if c == '{' then
    local obj = {t = 'o', keys = {}, vals = {}}
    i = json_ws(s, i + 1)
    if string.sub(s, i, i) == '}' then return obj, i + 1 end
    while true do
      local k, v
      k, i = json_string(s, json_ws(s, i))
      i = json_ws(s, i) + 1 -- the ':'
      v, i = json_value(s, i)
      if obj.vals[k] == nil then obj.keys[#obj.keys + 1] = k end
      obj.vals[k] = v
      i = json_ws(s, i)
      local d = string.sub(s, i, i)
      i = i + 1
      if d == '}' then return obj, i end
    end
  elseif c == '[' then
    local arr = {t = 'a', items = {}}
    i = json_ws(s, i + 1)
    if string.sub(s, i, i) == ']' then return arr, i + 1 end
    while true do
      local v
      v, i = json_value(s, i)
      arr.items[#arr.items + 1] = v
      i = json_ws(s, i)
      local d = string.sub(s, i, i)
      i = i + 1
      if d == ']' then return arr, i end
    end
  elseif c == '"' then
    local raw
    raw, i = json_string(s, i)
    return {t = 's', raw = raw}, i
  end
  local _, e = string.find(s, '^[%w%.%+%-]+', i)
  if not e then error('context data: bad JSON at ' .. i) end
  return {t = 's', raw = string.sub(s, i, e)}, e + 1
end

local function json_encode(v)
  if v.t == 's' then return v.raw end
  local parts = {}
  if v.t == 'a' then
    for _, x in ipairs(v.items) do parts[#parts + 1] = json_encode(x) end
    return '[' .. table.concat(parts, ',') .. ']'
  end
  for _, k in ipairs(v.keys) do parts[#parts + 1] = k .. ':' .. json_encode(v.vals[k]) end
  return '{' .. table.concat(parts, ',') .. '}'
end

-- The deep merge of the specification: maps key by key, recursively (the parent's keys
-- first, in their order, then the child's new ones); lists concatenated (parent's items
-- first); anything else (scalars, a map against a list) takes the child's value.
local function json_merge(p, c)
  if p.t == 'o' and c.t == 'o' then
    local out = {t = 'o', keys = {}, vals = {}}
    for _, k in ipairs(p.keys) do
      out.keys[#out.keys + 1] = k
      out.vals[k] = p.vals[k]
    end
    for _, k in ipairs(c.keys) do
      if out.vals[k] == nil then
        out.keys[#out.keys + 1] = k
        out.vals[k] = c.vals[k]
      else
        out.vals[k] = json_merge(out.vals[k], c.vals[k])
      end
    end
    return out
  end
  if p.t == 'a' and c.t == 'a' then
    local out = {t = 'a', items = {}}
    for _, x in ipairs(p.items) do out.items[#out.items + 1] = x end
    for _, x in ipairs(c.items) do out.items[#out.items + 1] = x end
    return out
  end
  return c
end

local function data_merge_text(parent_json, child_json)
  return json_encode(json_merge(json_value(parent_json, 1), json_value(child_json, 1)))
end

-- Whether writes are refused: the context is closed (closed_ms is set by close.lua, also
-- on a stopped context). Returns 'missing', 'closed' or nil.
local function data_refusal(ctx_key)
  local v = redis.call('HMGET', ctx_key, 'status', 'closed_ms')
  if not v[1] then return StopReason.MISSING end
  if v[1] == Status.CLOSED or v[2] then return StopReason.CLOSED end
  return nil
end
