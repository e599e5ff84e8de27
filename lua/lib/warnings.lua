-- warnings.lua: the warn_at thresholds a finish took a level's spend or steps across
-- (warn_plan) and their budget_warning, recorded and broadcast once per level, dimension
-- and threshold (warn_level).
-- needs: numbers, common
--
-- Context hash fields: wa  the thresholds in parts per million, ascending, comma-separated
-- (written by open.lua from ExecutionConfig.warn_at); w:usd, w:steps  how many of them
-- were warned of for that dimension's counter (absent: none). finish reads wa in the
-- HMGET it makes anyway (one field more: a level without wa pays nothing else); a level
-- with wa reads its w:<dim> only when this finish took the counter across a threshold,
-- and writes it in the HSET it makes anyway.

-- The dimensions a threshold is checked for (their counter against their limit).
local WARN_DIMS = {usd = true, steps = true}

-- The head of finish's level_shape (lib/levels.lua): {'wa'} when this finish adds to a
-- checked dimension (dused[d] > 0), with those dimensions; else an empty head.
local function warn_head(dims, dused)
  local checked_dims = {}
  for _, d in ipairs(dims) do
    if WARN_DIMS[d] and dused[d] > 0 then checked_dims[#checked_dims + 1] = d end
  end
  if #checked_dims == 0 then return {}, checked_dims end
  return {'wa'}, checked_dims
end

-- How many thresholds of wa (a string of ppm) used reaches against limit: used >= ppm /
-- 10^6 * limit, compared as used * 10^6 >= ppm * limit (exact while both products stay
-- below 2^53: a USD ceiling up to $9,000; within a part in 10^15 above), and the
-- thresholds as numbers; nil when wa holds anything the scripts do not write.
local function warn_reached(wa, used, limit)
  local count, ppms = 0, {}
  for part in string.gmatch(wa, '[^,]+') do
    local ppm = stored_num(part)
    if not ppm then return nil end  -- not written by open.lua: never read as a number
    ppms[#ppms + 1] = ppm
    if used * 1000000 >= ppm * limit then count = count + 1 end
  end
  return count, ppms
end

-- The warnings a level read by finish (read_level with warn_head's head, at key) owes
-- after this finish (used: its counters after it, dused: what it added): for each
-- dimension of checked_dims whose counter this finish took across a threshold, {dim,
-- ppms} with the thresholds reached and not yet warned of (w:<dim>, read then), the new
-- count added to set (the level's HSET); nil when none (always for a level without wa).
local function warn_plan(key, level, shape, checked_dims, used, dused, set)
  local wa = level.wa
  if not wa then return nil end
  local owed = nil
  for _, d in ipairs(checked_dims) do
    local limit, after = level[shape.slot[d].limit], used[d]
    if limit and limit > 0 and after then
      local count, ppms = warn_reached(wa, after, limit)
      if count and count > warn_reached(wa, after - dused[d], limit) then
        local warned = stored_num(redis.call('HGET', key, 'w:' .. d))  -- false: corrupt
        if warned == nil then warned = 0 end
        if warned and count > warned then
          set[#set + 1] = 'w:' .. d
          set[#set + 1] = count
          owed = owed or {}
          owed[#owed + 1] = {d, {unpack(ppms, warned + 1, count)}}
        end
      end
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
-- context id) for each threshold (ppm) of crossed (warn_plan's, dimension dim) and
-- publishes each on channel as {root, id, warning, dim, remaining}: the stop listener of
-- every process with a handle under the level hears it (ctx.on_warning).
local function warn_level(key, events_key, id, root, channel, dim, crossed, now)
  local v = redis.call('HMGET', key, 'l:usd', 'u:usd', 'l:steps', 'u:steps', 'request_id')
  local remaining = warn_remaining(v)
  local n = {usd = {stored_num(v[2]) or 0, stored_num(v[1])},
             steps = {stored_num(v[4]) or 0, stored_num(v[3])}}
  local used, limit = n[dim][1], n[dim][2]
  for i = 1, #crossed do
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
