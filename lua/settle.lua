-- settle.lua: a call completed; replace its held estimate with the actual amounts.
--
-- KEYS[1]     bc:{R}:res      hash  open reservations
-- KEYS[2]     bc:{R}:leases   zset  reservation leases
-- KEYS[3]     bc:{R}:nodes:<c> stream node records of the calling context
-- KEYS[4]     bc:{R}:ledger   stream TokenLedgerUpdated events of the tree
-- KEYS[5..]   per level of the reservation's path, root first (as reserved), two keys:
--             bc:{R}:ctx:<id> (hash) and bc:{R}:events:<id> (stream of SafetyEvents)
-- KEYS[last]  bc:{R}:done     hash  keyed reservation id -> how it finished
-- ARGV[1]     reservation id
-- ARGV[2]     abort channel (pub/sub, not a key)
-- ARGV[3]     node record (JSON, written to KEYS[3]; '' writes none)
-- ARGV[4]     node stream cap (approximate MAXLEN)
-- ARGV[5]     ledger channel (pub/sub, not a key)
-- ARGV[6..]   pairs: dimension, actual amount (integers >= 0)
--
-- Idempotent: keyed by the reservation id; a second settle of the same id (after a retry,
-- a failover or a lease reap) changes nothing.
-- Returns {0} when the reservation is not open (already settled or reaped);
--         {1, level, reason, detail, ...} with the levels this settle stopped.

local rec = redis.call('HGET', KEYS[1], ARGV[1])
if not rec then return {0} end
rec = cjson.decode(rec)
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if rec.k then redis.call('HSET', KEYS[#KEYS], ARGV[1], 'ok') end

local actual = {}
for i = 6, #ARGV do actual[#actual + 1] = ARGV[i] end

local stopped = finish(rec, 5, actual, true, false, ARGV[2], now_ms(), KEYS[4], ARGV[5])
if ARGV[3] ~= '' then
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'n', ARGV[3])
end
local out = {1}
for _, x in ipairs(stopped) do out[#out + 1] = x end
return out
