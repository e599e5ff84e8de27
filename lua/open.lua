-- open.lua: create a context, root or child, with tightest-bound inheritance.
--
-- KEYS[1]     ctx  bc:{R}:ctx:<id>      hash  the new context
-- KEYS[2]     kids  bc:{R}:kids:<parent> set   the parent's children (for a root:
--             bc:{R}:kids:<id>)
-- KEYS[3..]   ancestors{ctx}  bc:{R}:ctx:<a>       hash  the ancestors, root first, parent last
--             (none for a root)
-- ARGV[1]     ctx_id  context id
-- ARGV[2]     parent_id  parent id ('' for a root)
-- ARGV[3]     path  path ids, comma-separated, root first, ending with this id
-- ARGV[4]     request_id  request id
-- ARGV[5]     meta  metadata (JSON)
-- ARGV[6]     requested  requested limits (JSON, for the record)
-- ARGV[7]     timeout_ms  timeout ms from now (0 = none)
-- ARGV[8]     deadline_ms  absolute deadline, Unix ms (0 = none)
-- ARGV[9]     n_fields  n, the number of field/value pairs below
-- ARGV[10..]   fields{field, value}  n field/value pairs the new hash gets with it (a root's quota
--             buckets, quotas/keeper.py: there before any reserve can see the root)
-- ARGV[10+2n..] limits{dim, mode, value}  triples: dimension, mode, value, where mode is
--               'set'       an explicit limit; consumable dimensions are clamped to what
--                           remains above (limit - used - held, the least over ancestors)
--               'remaining' what remains above (no limit if no ancestor limits it)
--               'parent'    the parent's limit for that dimension (steps, retries)
--
-- The hash records the path as 'mid', the ids between the root and this context ('' at
-- depth 0 and 1; the key names the root and the context), so that its values stay under
-- Redis' 64-byte listpack limit for shallow trees (an ancestor opened by an earlier
-- version records the whole path as 'path'). Every ancestor must exist with the
-- recorded path (a token cannot graft a context onto another tree). The effective
-- deadline is the earliest of the timeout, the absolute deadline and every ancestor's.
-- A child opened under a stopped ancestor, or past its deadline, is created and halts
-- on first use; the stop is reported at once. An ancestor with a corrupt limit, counter
-- or deadline is reported as stopped (state_corrupt) and leaves the child nothing to
-- inherit (its next reserve stops that ancestor).
-- Returns {1, deadline_ms, created_ms, clamped_csv, usd, steps, retries, stop_reason,
--          stopped_by} (the effective limits of the three base dimensions, -1 when
--          unlimited; stop_reason '' when nothing above is stopped),
--         {0, 'exists', closed} (closed: 1 when that context is closed, else 0),
--         {0, 'missing', ancestor id} or {0, 'bad_path', ancestor id}.
--
-- uses: numbers, common

if redis.call('EXISTS', ctx) == 1 then
  local held = redis.call('HMGET', ctx, 'status', 'closed_ms')
  local closed = (held[1] == Status.CLOSED or held[2]) and 1 or 0
  return {OpenCode.REFUSED, OpenRefusal.EXISTS, closed}
end
local now = now_ms()
local ids = split(path)

local deadline = 0
local function tighten(d)
  d = tonumber(d or '0')
  if d > 0 and (deadline == 0 or d < deadline) then deadline = d end
end
if tonumber(timeout_ms) > 0 then tighten(now + tonumber(timeout_ms)) end
tighten(deadline_ms)
-- One HMGET per ancestor: its status, place and deadline, and for every requested
-- dimension its limit and the used and held amounts it limits (a token total limits the
-- sum of its two directions).
local dims = {}
for _, l in ipairs(limits) do dims[#dims + 1] = l.dim end
local wanted = {'status', 'mid', 'path', 'reason', 'deadline'}
local counted = {}   -- dim -> the dimensions whose counters it limits
for _, d in ipairs(dims) do
  wanted[#wanted + 1] = 'l:' .. d
  if string.sub(d, -4) == 'ttot' then
    local prefix = string.sub(d, 1, -5)
    counted[d] = {prefix .. 'tin', prefix .. 'tout'}
  else
    counted[d] = {d}
  end
  for _, c in ipairs(counted[d]) do
    wanted[#wanted + 1] = 'u:' .. c
    wanted[#wanted + 1] = 'h:' .. c
  end
end
local above = {}     -- dim -> least (limit - used - held) over the ancestors, if any
local parent = {}    -- dim -> the parent's limit
local stop_reason, stopped_by = '', ''
for a = 1, #ancestors do
  local v = redis.call('HMGET', ancestors[a], unpack(wanted))
  local h = {}
  for i, f in ipairs(wanted) do h[f] = v[i] end
  if not h.status then return {OpenCode.REFUSED, OpenRefusal.MISSING, ids[a]} end
  local whole_path = not h.mid and h.path  -- opened by a version that kept 'path'
  if whole_path and h.path ~= table.concat(ids, ',', 1, a)
      or not whole_path and (h.mid or '') ~= table.concat(ids, ',', 2, a - 1) then
    return {OpenCode.REFUSED, OpenRefusal.BAD_PATH, ids[a]}
  end
  if h.status ~= Status.RUNNING and stop_reason == '' then
    stop_reason, stopped_by = h.reason or h.status, ids[a]
  end
  -- a corrupt number above: the new context reports that level stopped (state_corrupt)
  -- and inherits nothing from it (what remains there counts as 0)
  local corrupt = nil
  local function num(field, default)
    local n, bad = checked({h[field]}, 1, field, default)
    corrupt = corrupt or bad
    return n
  end
  tighten(num('deadline', 0))
  for _, d in ipairs(dims) do
    local lim = num('l:' .. d, nil)
    if corrupt == nil and lim then
      local left = lim
      for _, c in ipairs(counted[d]) do
        local used, held = num('u:' .. c, 0), num('h:' .. c, 0)
        if corrupt then break end
        left = left - used - held
      end
      if left < 0 then left = 0 end
      if above[d] == nil or left < above[d] then above[d] = left end
      if a == #ancestors then parent[d] = lim end
    end
    if corrupt then above[d], parent[d] = 0, 0 end
  end
  if corrupt and stop_reason == '' then
    stop_reason, stopped_by = StopReason.STATE_CORRUPT, ids[a]
  end
end
if stop_reason == '' and deadline > 0 and now >= deadline then stop_reason = StopReason.TIMEOUT end

local hash = {'id', ctx_id, 'parent', parent_id, 'root', ids[1],
              'mid', table.concat(ids, ',', 2, #ids - 1),
              'depth', #ids - 1, 'status', Status.RUNNING, 'created_ms', now,
              'deadline', deadline, 'meta', meta, 'config', requested,
              'request_id', request_id}
local clamped = {}
local effective = {usd = -1, steps = -1, retries = -1}
for _, f in ipairs(fields) do
  hash[#hash + 1] = f.field
  hash[#hash + 1] = f.value
end
for _, l in ipairs(limits) do
  local dim, mode, value = l.dim, l.mode, tonumber(l.value)
  local limit = nil
  if mode == 'parent' then
    limit = parent[dim] or value
  else
    -- steps and retries are counts, not consumables: an explicit one is kept as given
    local left = nil
    if dim ~= 'steps' and dim ~= 'retries' then left = above[dim] end
    if mode == 'remaining' then
      limit = left
    else
      limit = value
      if left ~= nil and left < value then
        limit = left
        clamped[#clamped + 1] = dim
      end
    end
  end
  if limit ~= nil then
    if effective[dim] then effective[dim] = limit end
    hash[#hash + 1] = 'l:' .. dim
    hash[#hash + 1] = limit
  end
end
local clamped_csv = table.concat(clamped, ',')
hash[#hash + 1] = 'clamped'
hash[#hash + 1] = clamped_csv
redis.call('HSET', ctx, unpack(hash))
if parent_id ~= '' then redis.call('SADD', kids, ctx_id) end
return {OpenCode.OPENED, deadline, now, clamped_csv, effective.usd, effective.steps,
        effective.retries, stop_reason, stopped_by}
