-- settle.lua: a call completed; replace its held estimate with the actual amounts.
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
-- ARGV[6]     late  '1' when the settle is late (first sent over 2 s ago, or its lease may have
--             lapsed): finding no trace of the id, it charges nothing (see lib/finished_ids.lua)
-- ARGV[7]     node_status  the node record's status ('' when none)
-- ARGV[8]     node_stop_reason  its stop_reason ('' when none; a refused call's, lib/calls_counted.lua
--             count_own)
-- ARGV[9]     node_unreported  '1' when the record says unreported (charged the floor)
-- ARGV[10]    node_model  '<provider>|<model>' its spend is counted by (lib/calls_counted.lua
--             count_model; '' when neither is named)
-- ARGV[11..]  amounts{dim, amount}  pairs: dimension, actual amount (integers >= 0)
--
-- Idempotent: keyed by the reservation id; a second settle of the same id (after a retry,
-- a failover or a lease reap) changes nothing. Every level is checked before anything is
-- written (a corrupt counter: nothing changes but a state_corrupt stop).
-- Returns {0} when the reservation already finished (settled or reaped);
--         {1, level, reason, detail, ...} with the levels this settle stopped;
--         {4, level, reason, detail, ...} when the reservation was never held here (lost
--         in a failover): charged to the path in KEYS all the same, with a
--         SettleOrphaned event on the ledger stream and channel;
--         {5} when that path does not exist here either (the event, no charge);
--         {3, level, 'state_corrupt', detail} when a counter on the path is corrupt:
--         nothing charged, the reservation stays held, the level is stopped.
--
-- uses: numbers, common, reservations, stops, levels, ledger, quota, warnings, finish,
-- uses: finished_ids, records, calls_counted, close_reservation

return close_reservation(FinishOutcome.OK, true, false, {res = res, leases = leases, nodes = nodes, ledger = ledger, levels = levels,
  fin = fin, done = done, bymodel = bymodel},
  {id = reservation_id, abort_channel = abort_channel, node = node, node_cap = node_cap,
   ledger_channel = ledger_channel, late = late, amounts = amounts,
   facts = {status = node_status, stop_reason = node_stop_reason,
            unreported = node_unreported == '1', model = node_model}})
