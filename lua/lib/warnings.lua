-- warnings.lua: the warn_at thresholds a level's spend or steps reached (warn_crossed) and
-- their budget_warning, recorded and broadcast once per level, dimension and threshold
-- (warn_level).
-- needs: numbers, common
--
-- Context hash fields: wa  the thresholds in parts per million, ascending, comma-separated
-- (written by open.lua from ExecutionConfig.warn_at); w:usd, w:steps  how many of them
-- that dimension's counter reached already (absent: none). finish reads them in the HMGET
-- it makes anyway and writes the count in the HSET it makes anyway: a level without wa
-- pays nothing more.

-- The dimensions a threshold is checked for (their counter against their limit).
local WARN_DIMS = {usd = true, steps = true}

-- The head of finish's level_shape (lib/levels.lua): wa and the w:<dim> of each checked
-- dimension this finish adds to (dused[d] > 0), and those dimensions; none of them (an
-- empty head) when it adds to neither.
local function warn_head(dims, dused)
  local head, checked_dims = {'wa'}, {}
  for _, d in ipairs(dims) do
    if WARN_DIMS[d] and dused[d] > 0 then
      head[#head + 1] = 'w:' .. d
      checked_dims[#checked_dims + 1] = d
    end
  end
  if #checked_dims == 0 then return {}, checked_dims end
  return head, checked_dims
end

-- The thresholds (ppm) that used reached against limit and were not warned of yet:
-- {count, ppm, ppm...} with count the new number reached (written to w:<dim>), or nil.
-- wa is the hash's wa (a string; nil when absent), warned its w:<dim> (a number; false
-- when corrupt: nothing is warned then). A threshold is reached at used >= ppm / 10^6 *
-- limit, compared as used * 10^6 >= ppm * limit: exact while both products stay below
-- 2^53 (a USD ceiling up to $9,000), within a part in 10^15 above.
local function warn_crossed(wa, warned, used, limit)
  if not wa or warned == false or not used or not limit or limit <= 0 then return nil end
  local out, count = {0}, 0
  for part in string.gmatch(wa, '[^,]+') do
    local ppm = stored_num(part)
    if not ppm then return nil end  -- not written by open.lua: never read as a number
    if used * 1000000 < ppm * limit then break end
    count = count + 1
    if count > warned then out[#out + 1] = ppm end
  end
  if count <= warned then return nil end
  out[1] = count
  return out
end

-- The warnings a level read by finish (read_level with warn_head's head) owes after
-- this finish (used: its counters after it): {dim, crossed} for each dimension of
-- checked_dims that reached a threshold not warned of yet, its new w:<dim> count added to
-- set (the level's HSET); nil when none (always for a level without wa).
local function warn_plan(level, shape, checked_dims, used, set)
  if not level.wa then return nil end
  local owed = nil
  for _, d in ipairs(checked_dims) do
    local crossed = warn_crossed(level.wa, level['w:' .. d], used[d],
                                 level[shape.slot[d].limit])
    if crossed then
      set[#set + 1] = 'w:' .. d
      set[#set + 1] = crossed[1]
      owed = owed or {}
      owed[#owed + 1] = {d, crossed}
    end
  end
  return owed
end

-- What remains of a level's USD and step ceilings after this finish (the ceiling minus
-- what is spent; nil without a ceiling): USD in dollars, steps as a count.
local function warn_remaining(v)
  local out = {}
  local lusd, uusd, lsteps, usteps = stored_num(v[1]), stored_num(v[2]) or 0,
                                     stored_num(v[3]), stored_num(v[4]) or 0
  if lusd then out.usd = math.max(0, lusd - uusd) / 1000000 end
  if lsteps then out.steps = math.max(0, lsteps - usteps) end
  return out
end

-- Records one budget_warning SafetyEvent at the level (key, its event list events_key,
-- context id) for each threshold (ppm) of crossed (warn_crossed's, dimension dim) and
-- publishes each on channel as {root, id, warning, dim, remaining}: the stop listener of
-- every process with a handle under the level hears it (ctx.on_warning).
local function warn_level(key, events_key, id, root, channel, dim, crossed, now)
  local v = redis.call('HMGET', key, 'l:usd', 'u:usd', 'l:steps', 'u:steps', 'request_id')
  local remaining = warn_remaining(v)
  local n = {usd = {stored_num(v[2]) or 0, stored_num(v[1])},
             steps = {stored_num(v[4]) or 0, stored_num(v[3])}}
  local used, limit = n[dim][1], n[dim][2]
  for i = 2, #crossed do
    local fraction = crossed[i] / 1000000
    local what, ceiling = 'spend', 'max_cost_usd'
    if dim == 'steps' then what, ceiling = 'steps', 'max_steps' end
    local detail = what .. ' reached ' .. string.format('%g', fraction * 100) .. '% of ' ..
                   ceiling .. ' (' .. amount_text(dim, used) .. ' of ' ..
                   amount_text(dim, limit) .. ')'
    local event = cjson.encode({event_type = EdgeEvent.BUDGET_WARNING, decision = 'ALLOW',
                                reason = detail, hook = HOOK, request_id = v[5], ts = now,
                                metadata = {chain_id = id, threshold = fraction,
                                            dimension = dim, remaining = remaining}})
    append_capped(events_key, EVENT_STREAM_CAP, event)
    redis.call('PUBLISH', channel, cjson.encode({root = root, id = id, warning = fraction,
                                                 dim = dim, remaining = remaining}))
  end
end
