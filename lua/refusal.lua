-- refusal.lua: record a call refused before it ran: its node record, counted on its
-- context's hash (lib/calls_counted.lua count_call: n:refused, nr:<reason>, nr_last), and the
-- chain-level event once per reason per context (as event_once.lua).
--
-- KEYS[1]  ctx  bc:{R}:ctx:<id>      hash    the context of the refused call
-- KEYS[2]  nodes  bc:{R}:nodes:<id>    list    its node records
-- KEYS[3]  events  bc:{R}:events:<id>   list    its SafetyEvents
-- ARGV[1]  reason  the refusal reason (the event's event_type; ev:<reason> marks it recorded)
-- ARGV[2]  event  the SafetyEvent JSON
-- ARGV[3]  node  the node record JSON (with a stop_reason)
-- ARGV[4]  node_cap  node list cap (lib/common.lua append_capped)
--
-- Returns 1 when the event was appended, 0 when the reason was already recorded. A
-- context whose hash is gone (expired) gets the node and the event, and no counts.
--
-- uses: common, records, calls_counted

append_capped(nodes, node_cap, node)
if redis.call('EXISTS', ctx) == 0 then
  append_capped(events, EVENT_STREAM_CAP, event)
  return 1
end
count_call({ctx}, node_record(node))
if redis.call('HSETNX', ctx, 'ev:' .. reason, 1) == 0 then return 0 end
append_capped(events, EVENT_STREAM_CAP, event)
return 1
