-- lease_return.lua: reclaim a slice whose process stopped renewing its lease (it died):
-- what its flushes charged stays charged, the rest of the slice is returned.
--
-- KEYS[1]     bc:{R}:res      hash  open reservations (the slice's record)
-- KEYS[2]     bc:{R}:leases   zset  reservation leases
-- KEYS[3]     bc:{R}:nodes:<c> stream node records of the slice's context
-- KEYS[4]     bc:{R}:ledger   stream TokenLedgerUpdated events of the tree (unused: a
--             return spends nothing; the layout is lease_flush.lua's)
-- KEYS[5..]   per level of the slice's path, root first, two keys:
--             bc:{R}:ctx:<id> (hash) and bc:{R}:events:<id> (stream of SafetyEvents)
-- KEYS[last]  bc:{R}:slices   set   the slice ids of the tree now open
-- ARGV[1]     slice id
-- ARGV[2]     node record of the reclaim (JSON, status 'lost', nothing charged)
-- ARGV[3]     node stream cap (approximate MAXLEN)
--
-- Idempotent: a slice already returned or reclaimed changes nothing.
-- Returns 1 when the slice was reclaimed, 0 when it was already gone (or a counter on its
-- path is corrupt: lib.lua finish stops that level and the slice stays held).

local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('SREM', KEYS[#KEYS], ARGV[1])
  return 0
end
local rec = cjson.decode(raw)
local ok = finish(rec, 5, {}, false, false, '', now_ms(), KEYS[4], '')
if not ok then return 0 end  -- a corrupt counter: its level is stopped, the slice stays
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[#KEYS], ARGV[1])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'n', ARGV[2])
return 1
