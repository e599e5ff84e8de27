-- close.lua: end a context's life and start its retention clock.
--
-- KEYS[1]     bc:{R}:ctx:<id>     hash    the context
-- KEYS[2..]   its other keys to expire with it: bc:{R}:nodes:<id>, bc:{R}:events:<id>,
--             bc:{R}:kids:<id>; for a root also bc:{R}:res, bc:{R}:leases, bc:{R}:ledger
-- ARGV[1]     retention in seconds
--
-- A running context becomes 'closed' (a stopped one keeps its stop reason); either way
-- later reserves in it and below it halt. Returns {1, status} or {-1} if it does not exist.

local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {-1} end
if status == 'running' then
  redis.call('HSET', KEYS[1], 'status', 'closed', 'reason', 'closed', 'closed_ms', now_ms())
  status = 'closed'
end
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], tonumber(ARGV[1])) end
return {1, status}
