-- repair.lua: re-validate a context after an operator fixed or reset its fields, and lift
-- the state_corrupt stop when it is valid again (budgetctl repair, docs/topology.md).
--
-- KEYS[1]     ctx  bc:{R}:ctx:<id>     hash    the context
-- KEYS[2]     events  bc:{R}:events:<id>  list    its SafetyEvents
-- KEYS[3]     res  bc:{R}:res          hash    the tree's open reservations and slices
-- ARGV[1]     ctx_id  context id
-- ARGV[2]     actor  who repairs (free text, kept in the state_repaired event)
--
-- Every number of the hash (limits, counters, holds, deadline, times, depth) must be a
-- canonical integer (lib/numbers.lua, stored_num); so must every amount held by an open record.
-- The holds (h:<dim>) are then set to what the open reservations and slices whose path
-- runs through the context hold (an operator may reset them to 0: nothing held is lost).
-- A context stopped with state_corrupt runs again (or is closed, if it was closed) and a
-- state_repaired SafetyEvent is appended; a context stopped for another reason stays so.
-- Returns {1, field, was, now, ...} when the stop was lifted, {2, status, field, was,
--         now, ...} when there was none to lift (holds set all the same), with the holds
--         that changed; {0, field, value} when a number is still corrupt (nothing is
--         written); {-1} when the context does not exist.
--
-- uses: numbers, common

local flat = redis.call('HGETALL', ctx)
if #flat == 0 then return {-1} end
local h = {}
local NUMERIC = {deadline = true, created_ms = true, stopped_ms = true, closed_ms = true,
                 depth = true}
for i = 1, #flat, 2 do
  local field, value = flat[i], flat[i + 1]
  h[field] = value
  local prefix = string.sub(field, 1, 2)
  if (NUMERIC[field] or prefix == 'l:' or prefix == 'u:' or prefix == 'h:')
      and stored_num(value) == false then
    return {0, field, string.sub(value, 1, 40)}
  end
end

local held = {}
local records = redis.call('HGETALL', res)
for i = 1, #records, 2 do
  local rec = cjson.decode(records[i + 1])
  local through = false
  for _, cid in ipairs(rec.p) do through = through or cid == ctx_id end
  if through then
    for j = 1, #rec.d, 2 do
      local n = stored_num(rec.d[j + 1])
      if not n then
        return {0, 'reservation ' .. records[i], string.sub(tostring(rec.d[j + 1]), 1, 40)}
      end
      held[rec.d[j]] = (held[rec.d[j]] or 0) + n
    end
  end
end
local changed, set = {}, {}
local function hold(field, now)
  local was = stored_num(h[field]) or 0
  if was ~= now then
    for _, x in ipairs({field, was, now}) do changed[#changed + 1] = x end
    set[#set + 1] = field
    set[#set + 1] = now
  end
end
for field, _ in pairs(h) do
  if string.sub(field, 1, 2) == 'h:' then hold(field, held[string.sub(field, 3)] or 0) end
end
for dim, amount in pairs(held) do
  if h['h:' .. dim] == nil then hold('h:' .. dim, amount) end
end
if #set > 0 then redis.call('HSET', ctx, unpack(set)) end

if h.status ~= Status.STOPPED or h.reason ~= StopReason.STATE_CORRUPT then
  local out = {2, h.status}
  for _, x in ipairs(changed) do out[#out + 1] = x end
  return out
end
local now = now_ms()
if h.closed_ms then
  redis.call('HSET', ctx, 'status', Status.CLOSED, 'reason', StopReason.CLOSED)
else
  redis.call('HSET', ctx, 'status', Status.RUNNING)
  redis.call('HDEL', ctx, 'reason')
end
redis.call('HDEL', ctx, 'detail', 'stopped_ms', 'ev:state_corrupt')
local event = cjson.encode({event_type = 'state_repaired', decision = 'ALLOW', hook = HOOK,
                            reason = 'repaired by ' .. actor .. ' (was: ' ..
                                     (h.detail or '') .. ')',
                            request_id = h.request_id, ts = now,
                            metadata = {chain_id = ctx_id}})
append_capped(events, EVENT_STREAM_CAP, event)
local out = {1}
for _, x in ipairs(changed) do out[#out + 1] = x end
return out
