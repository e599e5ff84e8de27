-- release.lua: a call did not complete; drop its hold, charge what it reported spending,
-- and (when it failed) count a retry at every level.
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
-- ARGV[6]     'error' (the call raised: count a retry) or 'skip' (it did not fail)
-- ARGV[7..]   pairs: dimension, amount spent before the failure (integers >= 0)
--
-- Idempotent like settle.lua.
-- Returns {0} when the reservation is not open; {1, level, reason, detail, ...} otherwise.

local rec = redis.call('HGET', KEYS[1], ARGV[1])
if not rec then return {0} end
rec = cjson.decode(rec)
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if rec.k then redis.call('HSET', KEYS[#KEYS], ARGV[1], ARGV[6]) end

local spent = {}
for i = 7, #ARGV do spent[#spent + 1] = ARGV[i] end

local stopped = finish(rec, 5, spent, false, ARGV[6] == 'error', ARGV[2], now_ms(), KEYS[4],
                       ARGV[5])
if ARGV[3] ~= '' then
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'n', ARGV[3])
end
local out = {1}
for _, x in ipairs(stopped) do out[#out + 1] = x end
return out
