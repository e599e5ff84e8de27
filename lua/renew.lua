-- renew.lua: extend the leases of calls still running in a live process.
--
-- KEYS[1]     leases  bc:{R}:leases  zset  reservation id by lease expiry (Redis ms)
-- ARGV[1]     lease_ms  lease length in ms
-- ARGV[2..]   ids{reservation_id}  reservation ids
--
-- Only ids still leased are extended (ZADD XX): a lease already reaped stays reaped.
-- Returns the number of leases extended.
--
-- uses: common

local until_ms = now_ms() + tonumber(lease_ms)
local n = 0
for _, id in ipairs(ids) do
  n = n + redis.call('ZADD', leases, 'XX', 'CH', until_ms, id)
end
return n
