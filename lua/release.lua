-- release.lua: a call did not complete; drop its hold, charge what it reported spending,
-- and (when it failed) count a retry at every level.
--
-- KEYS[1]     res  bc:{R}:res      hash  open reservations
-- KEYS[2]     leases  bc:{R}:leases   zset  reservation leases
-- KEYS[3]     nodes  bc:{R}:nodes:<c> list   node records of the calling context
-- KEYS[4]     ledger  bc:{R}:ledger   stream TokenLedgerUpdated events of the tree
-- KEYS[5..]   levels{ctx, events}  per level of the reservation's path, root first (as reserved),
--             two keys:
--             bc:{R}:ctx:<id> (hash) and bc:{R}:events:<id> (list of SafetyEvents)
-- KEYS[last-2] fin  bc:{R}:fin     zset  finished reservation ids by Redis ms (capped, lib/finished_ids.lua)
-- KEYS[last-1] done  bc:{R}:done    hash  keyed reservation id -> how it finished
-- KEYS[last]  bymodel  bc:{R}:bymodel  hash  micro-USD by '<provider>|<model>' (lib/calls_counted.lua
--             count_model)
-- ARGV[1]     reservation_id  reservation id
-- ARGV[2]     abort_channel  abort channel (pub/sub, not a key)
-- ARGV[3]     node  node record (JSON, appended to KEYS[3], never decoded: what is counted of
--             it comes in the node_ slots below, lib/calls_counted.lua node_facts; '' writes none)
-- ARGV[4]     node_cap  node list cap (lib/common.lua append_capped)
-- ARGV[5]     ledger_channel  ledger channel (pub/sub, not a key)
-- ARGV[6]     outcome  'error' (the call raised: count a retry) or 'skip' (it did not fail)
-- ARGV[7]     late  '1' when the release is late (as in settle.lua)
-- ARGV[8]     node_status  the node record's status ('' when none)
-- ARGV[9]     node_stop_reason  its stop_reason ('' when none; a refused call's, lib/calls_counted.lua
--             count_own)
-- ARGV[10]    node_unreported  '1' when the record says unreported (charged the floor)
-- ARGV[11]    node_model  '<provider>|<model>' its spend is counted by (lib/calls_counted.lua
--             count_model; '' when neither is named)
-- ARGV[12..]  amounts{dim, amount}  pairs: dimension, amount spent before the failure (integers
--             >= 0)
--
-- Idempotent, checked before it writes, and never silent about a lost reservation, like
-- settle.lua.
-- Returns the replies of settle.lua: {0} already finished; {1, level, reason, detail, ...};
--         {4, ...} never held here, charged to the path; {5} nor its path, recorded;
--         {3, level, 'state_corrupt', detail} nothing charged, the reservation kept.
--
-- uses: numbers, common, reservations, stops, levels, ledger, quota, warnings, finish,
-- uses: finished_ids, records, calls_counted, close_reservation

return close_reservation(outcome, false, outcome == FinishOutcome.ERROR, {res = res, leases = leases, nodes = nodes, ledger = ledger, levels = levels,
  fin = fin, done = done, bymodel = bymodel},
  {id = reservation_id, abort_channel = abort_channel, node = node, node_cap = node_cap,
   ledger_channel = ledger_channel, late = late, amounts = amounts,
   facts = {status = node_status, stop_reason = node_stop_reason,
            unreported = node_unreported == '1', model = node_model}})
