-- ladder.lua: the model ladder's choice of a rung (choose_rung) and its record
-- (note_degraded, count_degraded), for reserve.lua and lease_flush.lua (docs/degrade.md).
-- needs: common

-- The rung a call runs on: rungs are {model, amount} groups, the requested model first;
-- room is the least USD any level of the path can still hold for this call (nil: no
-- level limits USD); low is true when some level has less than `below` of its ceiling
-- left. Not low: the first rung that fits. Low: the cheapest rung that fits (of equal
-- ones the last: a ladder lists its models most capable first). Returns its index, or
-- nil when none fits.
local function choose_rung(rungs, room, low)
  local best = nil
  for i, r in ipairs(rungs) do
    local amount = tonumber(r.amount)
    if room == nil or amount <= room then
      if not low then return i end
      if best == nil or amount <= tonumber(rungs[best].amount) then best = i end
    end
  end
  return best
end

-- The cheapest rung's amount (what a refusal reports when no rung fits).
local function cheapest_amount(rungs)
  local least = tonumber(rungs[1].amount)
  for _, r in ipairs(rungs) do least = math.min(least, tonumber(r.amount)) end
  return least
end

-- Records that call id of context ctx_id (hash key, events list events_key) runs on
-- model `to` instead of `from`: one 'degraded' SafetyEvent per context and pair of
-- models (marker field dg:<from>><to>).
local function note_degraded(key, events_key, ctx_id, id, from, to, now)
  if redis.call('HSETNX', key, 'dg:' .. from .. '>' .. to, 1) == 0 then return end
  local event = cjson.encode({
    event_type = EdgeEvent.DEGRADED, decision = 'ALLOW', hook = HOOK, ts = now,
    reason = 'ran on ' .. to .. ' instead of ' .. from .. ' (model ladder)',
    request_id = redis.call('HGET', key, 'request_id'),
    metadata = {chain_id = ctx_id, node_id = id, from_model = from, to_model = to}})
  append_capped(events_key, EVENT_STREAM_CAP, event)
end

-- Counts a call served from a lease slice (lease_flush.lua) on a cheaper rung than it
-- asked for, from its decoded node record (degraded_from: the model asked for, model:
-- the one that ran): nd at every level of its path (keys, root first; a count that is
-- not an integer stays as it is, pcall), and note_degraded on its own context (the last
-- key; events_key, ctx_id), as reserve.lua counts a strict reserve's.
local function count_degraded(keys, events_key, ctx_id, node)
  local from, to = node.degraded_from, node.model
  if type(from) ~= 'string' or from == '' or type(to) ~= 'string' then return end
  for _, key in ipairs(keys) do redis.pcall('HINCRBY', key, 'nd', 1) end
  note_degraded(keys[#keys], events_key, ctx_id, node.node_id, from, to, now_ms())
end
