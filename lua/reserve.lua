-- reserve.lua: hold a call's estimate at every level of its path, or refuse it.
--
-- KEYS[1]     res  bc:{R}:res      hash  reservation id -> its record (lib/reservations.lua, new_reservation)
-- KEYS[2]     leases  bc:{R}:leases   zset  reservation id by lease expiry (Redis ms)
-- KEYS[3..]   levels{ctx, events}  per level of the path, root first, caller last, two keys:
--             bc:{R}:ctx:<id> (hash) and bc:{R}:events:<id> (list of SafetyEvents)
-- KEYS[last]  done  bc:{R}:done     hash  keyed reservation id -> how it finished
-- ARGV[1]     reservation_id  reservation id (the node id)
-- ARGV[2]     lease_ms  lease length in ms
-- ARGV[3]     path  path ids, comma-separated, root first (same order as the levels in KEYS)
-- ARGV[4]     abort_channel  abort channel (pub/sub, not a key)
-- ARGV[5]     keyed  '1' when the id is a call key (the same call replayed, e.g. a redelivered
--             task, gets the same id): its outcome ('ok', 'error', 'skip' or 'halted',
--             lib/calls_counted.lua remembered) is kept in KEYS[last]
-- ARGV[6]     final  '1' when the call may spend the levels' final reserves (field fr)
-- ARGV[7]     below  the ladder's threshold in parts per million of a ceiling (0: none)
-- ARGV[8]     n_rungs  n, the number of rungs below (0: the call names no ladder)
-- ARGV[9..]   rungs{model, amount}  the model ladder, the requested model first: each
--             rung's model and its worst case in micro-USD (lib/ladder.lua choose_rung)
-- ARGV[9+2n..] amounts{dim, amount}  pairs: dimension, amount (integers; steps 1 is always
--             among them; with rungs, usd is the requested rung's)
--
-- Every level is checked (status, deadline in Redis time, each dimension's limit against
-- used + held + amount, each token total's limit against the sum of its two directions,
-- and unless the call is final, the level's final reserve fr: used + held + usd must stay
-- at most limit - fr) before anything is written, so a refusal changes nothing but the stop of a level that is
-- past a limit for good (deadline passed, or used already at the ceiling), or whose limit,
-- counter or deadline field is not a valid number (state_corrupt: fail closed). The retry
-- budget needs no check here: the release that spends the last retry stops the level.
--
-- A call reaching only into a final reserve is refused with reason final_reserve and
-- stops nothing. With rungs, the usd amount held is the chosen rung's: the first that
-- fits at every level, or, when some level has less than `below` of its ceiling left
-- before the call (limit - used - held), the cheapest that fits; none fitting refuses
-- the call as the cheapest rung would be. A rung other than the first counts the call
-- degraded at every level (nd) and records one 'degraded' event per context and pair.
--
-- Returns {1, now_ms, rung, expired_id, expired_json, ...} when held (rung: the index of
--         the chosen rung, 0 without rungs; with up to 8 reservations of this tree whose
--         lease has expired, for the caller to settle at their estimate);
--         {0, level, reason, detail, stopped, now_ms} when refused, where stopped is 1 when
--         the level is stopped for good (before or by this call) and 0 when only this call
--         does not fit; then followed by the expired reservations too (expired_id,
--         expired_json, ...): their holds may be what leaves no room, and no call of the
--         tree can be held to find them otherwise.
--         {0, 1, 'quota_grant', '<i> <why>', 0, now_ms} when the root's quota grant i
--         cannot cover the call (lib/quota.lua quota_state; the caller tops it up, docs/quotas.md).
--         A reservation id already held returns {1, now_ms, rung} and holds nothing more;
--         a call key already finished returns {2, now_ms, outcome} and holds nothing.
--
-- uses: numbers, common, reservations, stops, levels, quota, ladder

local now = now_ms()
local id = reservation_id
local record = redis.call('HGET', res, id)
if record then return {ReserveCode.HELD, now, cjson.decode(record).g or 0} end
if keyed == '1' then  -- only call keys are remembered when they finish
  local outcome = redis.call('HGET', done, id)
  if outcome then return {ReserveCode.REPLAYED, now, outcome} end
end

local ids = split(path)
local root = ids[1]
local channel = abort_channel
local dims, wanted, at = {}, {}, {}
for _, a in ipairs(amounts) do
  dims[#dims + 1] = a.dim
  wanted[#wanted + 1] = tonumber(a.amount)
  at[a.dim] = #dims
end
local totals = token_totals(dims)
for _, t in ipairs(totals) do
  for k = 2, 3 do
    if at[t[k]] == nil then
      dims[#dims + 1], wanted[#wanted + 1] = t[k], 0
      at[t[k]] = #dims
    end
  end
end

-- the root's number of quota buckets (q, lib/quota.lua quota_state) is read at the root
-- only: the other levels are read with a shape without it
local root_shape = level_shape({'status', 'deadline', 'fr', 'nd', 'q'}, dims, totals)
local inner_shape = #levels > 1 and level_shape({'status', 'deadline', 'fr', 'nd'}, dims,
                                                totals) or nil
local nq = 0
local fin = final == '1'
local ladder = #rungs > 0
local low_ppm = tonumber(below)
local room, low = nil, false  -- with rungs: the least USD room over the levels; whether
local usd = {}                -- some level is below the threshold; per level {limit,
                              -- used, held, reserve} of USD and where its hold is set

-- The refusal of a call at level lv whose dimension d (limit, used, held) cannot take
-- amount: for good (a stop) when used already reached the limit.
local function refuse(lv, key, events_key, d, limit, used, held, amount)
  if used >= limit then
    local detail = d .. ' ' .. amount_text(d, used) .. ' reached limit ' .. amount_text(d, limit)
    stop_level(key, events_key, ids[lv], root, channel, reason_for(d), detail, now)
    return {ReserveCode.REFUSED, lv, reason_for(d), detail, 1, now}
  end
  local detail = d .. ' needs ' .. amount_text(d, amount) .. ', ' ..
                 amount_text(d, limit - used - held) .. ' of ' .. amount_text(d, limit) ..
                 ' left (' .. amount_text(d, held) .. ' held by calls in flight)'
  return append_expired({ReserveCode.REFUSED, lv, reason_for(d), detail, 0, now}, res, leases,
                        now)
end

-- The refusal of an ordinary call at level lv that would reach into its final reserve fr.
local function reserved(lv, limit, used, held, amount, fr)
  local detail = 'usd needs ' .. amount_text('usd', amount) .. ', ' ..
                 amount_text('usd', limit - fr - used - held) .. ' of ' ..
                 amount_text('usd', limit) .. ' left before the final reserve of ' ..
                 amount_text('usd', fr)
  return {ReserveCode.REFUSED, lv, StopReason.FINAL_RESERVE, detail, 0, now}
end

-- The refusal at level lv whose stored state is corrupt: the level stops (fail closed).
local function corrupt(lv, key, events_key, detail)
  stop_level(key, events_key, ids[lv], root, channel, StopReason.STATE_CORRUPT, detail, now)
  return {ReserveCode.REFUSED, lv, StopReason.STATE_CORRUPT, detail, 1, now}
end

local holds = {}     -- per level: the HSET arguments that add the amounts to its holds
for lv = 1, #levels do
  local key, events_key = levels[lv].ctx, levels[lv].events
  local shape = lv == 1 and root_shape or inner_shape
  local level = read_level(key, shape)
  if not level.status then
    return {ReserveCode.REFUSED, lv, StopReason.MISSING, 'context ' .. ids[lv] .. ' not found',
            1, now}
  end
  if level.status ~= Status.RUNNING then
    local reason = redis.call('HGET', key, 'reason') or level.status
    return {ReserveCode.REFUSED, lv, reason, 'stopped: ' .. reason, 1, now}
  end
  -- every number of the level is checked before any is used (fail closed on corruption)
  if level.corrupt then return corrupt(lv, key, events_key, level.corrupt) end
  local deadline = level.deadline
  if deadline > 0 and now >= deadline then
    local detail = 'deadline passed ' .. (now - deadline) .. ' ms ago'
    stop_level(key, events_key, ids[lv], root, channel, StopReason.TIMEOUT, detail, now)
    return {ReserveCode.REFUSED, lv, StopReason.TIMEOUT, detail, 1, now}
  end
  local set = {}
  local fr = fin and 0 or level.fr
  for j, d in ipairs(dims) do
    local slot = shape.slot[d]
    local limit, u, h, amount = level[slot.limit], level[slot.used], level[slot.held], wanted[j]
    if d == 'usd' and ladder then  -- the amount is the rung's, chosen below
      if limit then
        if u >= limit then return refuse(lv, key, events_key, d, limit, u, h, amount) end
        local left = limit - u - h
        if room == nil or left - fr < room then room = left - fr end
        if left * 1000000 < low_ppm * limit then low = true end
      end
      usd[lv] = {limit, u, h, fr, #set + 2}
      set[#set + 1] = slot.held_field
      set[#set + 1] = h
    else
      if limit and (u >= limit or u + h + amount > limit) then
        return refuse(lv, key, events_key, d, limit, u, h, amount)
      end
      if d == 'usd' and fr > 0 and limit and u + h + amount > limit - fr then
        return reserved(lv, limit, u, h, amount, fr)
      end
      if amount > 0 then
        set[#set + 1] = slot.held_field
        set[#set + 1] = h + amount
      end
    end
  end
  set.nd = level.nd
  for i, t in ipairs(totals) do
    local limit = level[shape.total_slot[i]]
    if limit then
      local a, b = shape.slot[t[2]], shape.slot[t[3]]
      local u, h = level[a.used] + level[b.used], level[a.held] + level[b.held]
      local amount = wanted[at[t[2]]] + wanted[at[t[3]]]
      if u >= limit or u + h + amount > limit then
        return refuse(lv, key, events_key, t[1] .. 'ttot', limit, u, h, amount)
      end
    end
  end
  holds[lv] = set
  if lv == 1 then nq = level.q end
end
local rung = 0
if ladder then
  rung = choose_rung(rungs, room, low)
  if rung == nil then  -- refused as the cheapest rung is, at the first level it misses
    local amount = cheapest_amount(rungs)
    for lv = 1, #levels do
      local limit, u, h, fr = unpack(usd[lv])
      if limit and u + h + amount > limit then
        return refuse(lv, levels[lv].ctx, levels[lv].events, 'usd', limit, u, h, amount)
      end
      if limit and u + h + amount > limit - fr then
        return reserved(lv, limit, u, h, amount, fr)
      end
    end
  end
  local amount = tonumber(rungs[rung].amount)
  wanted[at['usd']] = amount
  for lv = 1, #levels do
    local set = holds[lv]
    set[usd[lv][5]] = set[usd[lv][5]] + amount
    if rung > 1 then
      set[#set + 1] = 'nd'
      set[#set + 1] = set.nd + 1
    end
  end
  if rung > 1 then
    note_degraded(levels[#levels].ctx, levels[#levels].events, ids[#ids], id,
                  rungs[1].model, rungs[rung].model, now)
  end
end

local qgids = nil
if nq > 0 then
  local st, why = quota_state(levels[1].ctx, nq, now)
  local amt = quota_amounts(function(d) return at[d] and wanted[at[d]] or 0 end)
  if st then
    for _, d in ipairs(QUOTA_DIMS) do
      -- as at a level: a grant used up refuses even a call estimated at nothing
      if st.left[d] and (st.left[d] <= 0 or amt[d] > st.left[d]) then
        why = st.short[d] .. ' ' .. d
      end
    end
  end
  if why then return {ReserveCode.REFUSED, 1, StopReason.QUOTA_GRANT, why, 0, now} end
  quota_holds(st, amt, holds[1])
  qgids = st.gids
end

-- Every level accepted: hold the amounts everywhere (one HSET per level).
local held = held_pairs(dims, wanted)
for lv = 1, #levels do
  if #holds[lv] > 0 then redis.call('HSET', levels[lv].ctx, unpack(holds[lv])) end
end
local rec = new_reservation(ids, held, keyed == '1')
rec.q = qgids
if rung > 0 then rec.g = rung end
redis.call('HSET', res, id, cjson.encode(rec))
redis.call('ZADD', leases, now + tonumber(lease_ms), id)

return append_expired({ReserveCode.HELD, now, rung}, res, leases, now)
