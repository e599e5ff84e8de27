-- lease_return.lua: reclaim a slice whose process stopped renewing its lease (it died).
-- What its flushes charged stays charged; the USD and tokens it did not flush are charged
-- as used (which calls the process admitted from it cannot be known: a provider may have
-- billed them all), as a dead worker's reservation is charged its estimate; its steps go
-- back. A slice taken with LeasePolicy(return_on_expiry=True) (record field r = 1) gives
-- every unflushed amount back instead.
--
-- KEYS[1]     res  bc:{R}:res      hash  open reservations (the slice's record)
-- KEYS[2]     leases  bc:{R}:leases   zset  reservation leases
-- KEYS[3]     nodes  bc:{R}:nodes:<c> list   node records of the slice's context
-- KEYS[4]     ledger  bc:{R}:ledger   stream TokenLedgerUpdated events of the tree
-- KEYS[5..]   levels{ctx, events}  per level of the slice's path, root first, two keys:
--             bc:{R}:ctx:<id> (hash) and bc:{R}:events:<id> (list of SafetyEvents)
-- KEYS[last - 1]  slices  bc:{R}:slices set  the slice ids of the tree now open
-- KEYS[last]      fin  bc:{R}:fin   zset  finished reservation ids by Redis ms: a slice charged
--                 as used is added, so a late flush of it (its process was only slow)
--                 charges nothing twice
-- ARGV[1]     slice_id  slice id
-- ARGV[2]     node  node record of the reclaim (JSON, status 'halted'; its cost_usd is set here
--             to the USD charged)
-- ARGV[3]     node_cap  node list cap (lib/common.lua append_capped)
-- ARGV[4]     abort_channel  abort channel (pub/sub, not a key)
-- ARGV[5]     ledger_channel  ledger channel (pub/sub, not a key)
--
-- The charge is lib/finish.lua's finish: levels that reach a ceiling stop. A slice_expired
-- SafetyEvent on the slice's context names the slice and what was charged (or returned).
-- Idempotent: a slice already returned or reclaimed changes nothing.
-- Returns 1 when the slice was reclaimed, 0 when it was already gone (or a counter on its
-- path is corrupt: lib/finish.lua finish stops that level and the slice stays held).
--
-- uses: numbers, common, stops, levels, ledger, quota, warnings, finish

local raw = redis.call('HGET', res, slice_id)
if not raw then
  redis.call('ZREM', leases, slice_id)
  redis.call('SREM', slices, slice_id)
  return 0
end
local rec = cjson.decode(raw)
local now = now_ms()
local returns = rec.r == 1
local unflushed, shown = {}, {}
for i = 1, #rec.d, 2 do
  local amount = stored_num(rec.d[i + 1])
  -- a corrupt amount: finish stops the level instead; steps held are given back (a
  -- count of calls, not spend: the node records of the calls that ran are lost with it)
  if amount and amount > 0 and rec.d[i] ~= 'steps' then
    unflushed[#unflushed + 1] = rec.d[i]
    unflushed[#unflushed + 1] = amount
    shown[rec.d[i]] = amount
  end
end
local charge = unflushed
if returns then charge = {} end
local ok = finish(rec, levels, charge, false, false, abort_channel, now, ledger, ledger_channel)
if not ok then return 0 end  -- a corrupt counter: its level is stopped, the slice stays
redis.call('HDEL', res, slice_id)
redis.call('ZREM', leases, slice_id)
redis.call('SREM', slices, slice_id)
if not returns then redis.call('ZADD', fin, now, slice_id) end
local record = cjson.decode(node)
record.cost_usd = 0
if not returns then record.cost_usd = (shown.usd or 0) / 1000000 end
append_capped(nodes, node_cap, cjson.encode(record))
local usd = amount_text('usd', shown.usd or 0)
local detail = 'slice ' .. slice_id .. ' expired (its process stopped renewing it): ' .. usd
if returns then detail = detail .. ' not flushed returned (return_on_expiry)'
else detail = detail .. ' not flushed charged as used' end
local metadata = {chain_id = rec.c, slice_id = slice_id}
if next(shown) then
  if returns then metadata.returned = shown else metadata.charged = shown end
end
local event = cjson.encode({event_type = 'slice_expired', decision = 'ALLOW', hook = HOOK,
                            reason = detail, ts = now, metadata = metadata})
append_capped(levels[#levels].events, EVENT_STREAM_CAP, event)
return 1
