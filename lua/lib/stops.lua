-- stops.lua: the stop of a level (stop_level) and the stop reason of a dimension
-- (reason_for).
-- needs: common

-- The stop reason of a dimension (DIMENSION_REASONS, from the prelude): every token
-- dimension stops with token_budget_exceeded.
local function reason_for(dim)
  return DIMENSION_REASONS[dim] or StopReason.TOKEN_BUDGET_EXCEEDED
end

-- Marks a running context stopped, appends the SafetyEvent to its event list (marking
-- the reason recorded: ev:<reason>, see event_once.lua) and broadcasts the stop. Returns
-- true if this call stopped it. The channel is a pub/sub channel, not a key.
local function stop_level(key, events_key, id, root, channel, reason, detail, now)
  local v = redis.call('HMGET', key, 'status', 'request_id')
  if v[1] ~= Status.RUNNING then return false end
  redis.call('HSET', key, 'status', Status.STOPPED, 'reason', reason, 'detail', detail,
             'stopped_ms', now, 'ev:' .. reason, 1)
  local event = cjson.encode({event_type = reason, decision = 'HALT', reason = detail,
                              hook = HOOK, request_id = v[2], ts = now,
                              metadata = {chain_id = id}})
  append_capped(events_key, EVENT_STREAM_CAP, event)
  redis.call('PUBLISH', channel, cjson.encode({root = root, id = id, reason = reason}))
  return true
end
