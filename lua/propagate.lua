-- propagate.lua: charge a cost spent outside a wrapped call (a bill that arrives later) to
-- a context and every ancestor in one atomic step, like a settle: the amounts are added at
-- every level of the path, and each level that reaches a ceiling is stopped (its event
-- recorded and the stop broadcast). Nothing is held and no step is counted.
--
-- KEYS[1]     done  bc:{R}:done          hash    charge id -> 'propagated' (a repeated charge,
--                                          e.g. resent after a lost reply, changes nothing)
-- KEYS[2]     nodes  bc:{R}:nodes:<c>     list    node records of the charged context
-- KEYS[3]     ledger  bc:{R}:ledger        stream  TokenLedgerUpdated events of the tree
-- KEYS[4..]   levels{ctx, events}  per level of the path, root first, two keys: bc:{R}:ctx:<id>
--             (hash) and
--             bc:{R}:events:<id> (list of SafetyEvents)
-- ARGV[1]     charge_id  charge id
-- ARGV[2]     path  path ids, comma-separated, root first (same order as the levels in KEYS)
-- ARGV[3]     abort_channel  abort channel (pub/sub, not a key)
-- ARGV[4]     ledger_channel  ledger channel (pub/sub, not a key)
-- ARGV[5]     node  node record (JSON, appended to KEYS[2])
-- ARGV[6]     node_cap  node list cap (lib/common.lua append_capped)
-- ARGV[7..]   amounts{dim, amount}  pairs: dimension, amount (integers > 0)
--
-- Every level is checked before anything is written (see lib/finish.lua).
-- Returns {0} when the charge id was already applied; {-1, level} when a level of the
-- path does not exist (nothing is written); {3, level, 'state_corrupt', detail, ...}
-- when a counter on the path is corrupt (nothing charged, the charge id not recorded,
-- the level stopped); {1, level, reason, detail, ...} otherwise, with the levels this
-- charge stopped.
--
-- uses: numbers, common, reservations, stops, levels, ledger, quota, warnings, finish

local ids = split(path)
for lv = 1, #ids do
  if redis.call('EXISTS', levels[lv].ctx) == 0 then return {ChargeCode.MISSING, lv} end
end
if redis.call('HSETNX', done, 'p:' .. charge_id, 'propagated') == 0 then
  return {ChargeCode.ALREADY}
end
local rec = new_reservation(ids, {}, false)
local ok, stopped = finish(rec, levels, flat_pairs(amounts, 'dim', 'amount'), false, false,
                           abort_channel, now_ms(), ledger, ledger_channel)
local out = {ChargeCode.CORRUPT}
if ok then
  append_capped(nodes, node_cap, node)
  out = {ChargeCode.CHARGED}
else
  redis.call('HDEL', done, 'p:' .. charge_id)  -- not applied: a later send may apply it
end
for _, x in ipairs(stopped) do out[#out + 1] = x end
return out
