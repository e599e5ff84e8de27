-- event_once.lua: record a chain-level stop event once per reason per context. Calls
-- refused for a reason the context already recorded add only their node record (the
-- reference ExecutionContext de-duplicates its chain events the same way).
--
-- KEYS[1]  ctx  bc:{R}:ctx:<id>     hash    the context; field ev:<reason> marks a reason
--                                      recorded (stop_level in lib/stops.lua sets it too)
-- KEYS[2]  events  bc:{R}:events:<id>  list    SafetyEvents of the context
-- ARGV[1]  reason  the stop reason (the event's event_type)
-- ARGV[2]  event  the SafetyEvent JSON
-- ARGV[3]  cap  event list cap (lib/common.lua append_capped)
--
-- Returns 1 when the event was appended, 0 when the reason was already recorded. A
-- context whose hash is gone (expired) gets the event without a mark.
--
-- uses: common

if redis.call('EXISTS', ctx) == 1 then
  if redis.call('HSETNX', ctx, 'ev:' .. reason, 1) == 0 then return 0 end
end
append_capped(events, cap, event)
return 1
