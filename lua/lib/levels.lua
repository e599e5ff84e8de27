-- levels.lua: a level's context hash read and checked in one HMGET (read_level, its shape:
-- level_shape) and the token totals its limits name (token_totals).
--
-- Context hash fields used here:
--   status  running | stopped | closed      reason, detail, stopped_ms
--   deadline  absolute Redis-time ms (0 = none)
--   l:<dim> limit   u:<dim> used (settled, subtree included)   h:<dim> held by reservations
--   n:<outcome> calls counted by outcome, nr:<reason> and nr_last refusals (count_call)
-- Dimensions: usd (micro-USD), steps, retries, tin, tout (tokens by direction) and
-- <provider>.tin / <provider>.tout. A total is the sum of its two directions: ttot and
-- <provider>.ttot have a limit (l:) but no counters of their own.
-- needs: numbers

-- The token totals among dims: {prefix, input dim, output dim, limit field} for every
-- prefix ('' or '<provider>.') with a direction in dims. A total is checked against the
-- sum of both directions' counters, so callers read both.
local function token_totals(dims)
  local out, seen = {}, {}
  for i = 1, #dims do
    local d = dims[i]
    local prefix = nil
    if string.sub(d, -3) == 'tin' then prefix = string.sub(d, 1, -4)
    elseif string.sub(d, -4) == 'tout' then prefix = string.sub(d, 1, -5) end
    if prefix and not seen[prefix] then
      seen[prefix] = true
      out[#out + 1] = {prefix, prefix .. 'tin', prefix .. 'tout', 'l:' .. prefix .. 'ttot'}
    end
  end
  return out
end

-- How levels are read by read_level: the fields of one HMGET. head: named fields read
-- first ('status' and 'wa' as stored, any other a number, 0 when absent); then l:, u:, h:
-- of each dimension of dims; then the limit of each token total of totals (token_totals:
-- both its directions must be among dims). slot[d]: where dimension d's numbers are in a
-- level read with this shape ({limit, used, held}) and its u: and h: fields (used_field,
-- held_field, for the caller's HSET); total_slot[i]: where the limit of totals[i] is;
-- limit_at[i]: true when fields[i] is a limit (absent: no limit, where a counter is 0).
local function level_shape(head, dims, totals)
  local fields, slot, total_slot, limit_at = {}, {}, {}, {}
  for i, f in ipairs(head) do fields[i] = f end
  for _, d in ipairs(dims) do
    local n = #fields
    fields[n + 1], fields[n + 2], fields[n + 3] = 'l:' .. d, 'u:' .. d, 'h:' .. d
    slot[d] = {limit = n + 1, used = n + 2, held = n + 3, used_field = fields[n + 2],
               held_field = fields[n + 3]}
    limit_at[n + 1] = true
  end
  for i, t in ipairs(totals) do
    fields[#fields + 1] = t[4]
    total_slot[i] = #fields
    limit_at[#fields] = true
  end
  return {head = head, fields = fields, slot = slot, total_slot = total_slot,
          limit_at = limit_at}
end

-- read_level's number at level[i] (default when absent), noting why when it is corrupt.
local function level_num(level, fields, i, default)
  local v = level[i]
  local n = stored_num(v)
  if n == nil then return default end
  if n == false then
    local detail = not_a_number(fields[i], v)
    level.why = level.why or {}
    level.why[fields[i]] = detail
    if not level.corrupt then level.corrupt, level.corrupt_field = detail, fields[i] end
  end
  return n
end

-- A level's context hash (key) read with one HMGET of shape's fields (level_shape), every
-- number parsed (stored_num) where it was read: level[shape.slot[d].limit] (.used, .held)
-- and level[shape.total_slot[i]] are numbers, and the head's fields are named (status as
-- stored, level.deadline...). An absent limit is nil, an absent counter or head number 0;
-- a corrupt number is false, and level.why = {field -> detail} says why (not_a_number;
-- nil when none is). level.corrupt and level.corrupt_field: the detail and the field of
-- the first corrupt number in field order. The callers (reserve.lua, lease_take.lua,
-- finish) check status, deadline and each limit against its counters themselves.
-- The numbers replace the HMGET reply's strings in place: no table per level beyond it.
local function read_level(key, shape)
  local fields, limit_at = shape.fields, shape.limit_at
  local level = redis.call('HMGET', key, unpack(fields))
  local head = shape.head
  for i, f in ipairs(head) do
    if f == 'status' or f == 'wa' then
      level[f] = level[i]
    else
      level[f] = level_num(level, fields, i, 0)
    end
  end
  for i = #head + 1, #fields do
    if limit_at[i] then
      level[i] = level_num(level, fields, i, nil)
    else
      level[i] = level_num(level, fields, i, 0)
    end
  end
  return level
end
