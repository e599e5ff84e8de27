-- session_acquire.lua: the usable session of a path, or the right to create one. Admission
-- against the tenant cap happens here, in the same step as the claim, so that no
-- interleaving of creators can pass the cap.
-- KEYS[1] record  the session's record hash
-- KEYS[2] active  the tenant's set of active sessions
-- KEYS[3] expiry  the tenant's zset of active sessions by expires_at
-- KEYS[4] claims  the tenant's zset of creation claims by claim deadline (ms)
-- KEYS[5] claimers  the tenant's hash of claim ids by member
-- ARGV[1] member  member "<conversation>:<path>"
-- ARGV[2] cap  cap: active sessions + live claims the tenant may hold
-- ARGV[3] max_executions  max executions before rotation
-- ARGV[4] claim_id  claim id (random, the caller's)
-- ARGV[5] claim_ttl_ms  claim ttl ms (the creation timeout)
-- Returns {kind, now_ms, retired_sandbox_id or '', n, field1, value1, ...}:
--   'existing' the record is active, unexpired, under max executions (fields follow)
--   'wait'     another caller holds a live claim for this path (n = its deadline)
--   'cap'      the tenant holds n >= cap active sessions and claims; nothing changed
--   'claimed'  the caller now holds the claim; create the sandbox, then session_commit
-- An active record that expired or reached max executions is retired first (status
-- expired, or terminated with reason rotated; removed from the indexes) and its sandbox
-- id returned so the caller kills it.
--
-- uses: numbers, common

local now = now_ms()
local cap = tonumber(cap)
local max_exec = tonumber(max_executions)
local retired = ''
local rec = redis.call('HMGET', record, 'status', 'expires_at', 'execution_count',
                       'sandbox_id')
if rec[1] == 'active' then
  -- an expiry or count that is not a canonical integer (lib/numbers.lua, stored_num) retires
  -- the record as expired (fail closed)
  local expires, count = stored_num(rec[2]), stored_num(rec[3])
  local expired = not expires or not count or expires <= now
  if not expired and count < max_exec then
    local out = {'existing', now, '', 0}
    local flat = redis.call('HGETALL', record)
    for i = 1, #flat do out[#out + 1] = flat[i] end
    return out
  end
  if expired then
    redis.call('HSET', record, 'status', 'expired', 'terminated_reason', 'expired',
               'updated_at', now)
  else
    redis.call('HSET', record, 'status', 'terminated', 'terminated_reason', 'rotated',
               'updated_at', now)
  end
  redis.call('SREM', active, member)
  redis.call('ZREM', expiry, member)
  retired = rec[4] or ''
end

-- Claims of creators that died or gave up lapse at their deadline.
local stale = redis.call('ZRANGEBYSCORE', claims, '-inf', now)
if #stale > 0 then
  redis.call('ZREM', claims, unpack(stale))
  redis.call('HDEL', claimers, unpack(stale))
end
local held = redis.call('ZSCORE', claims, member)
if held then
  return {'wait', now, retired, tonumber(held)}
end
local n = redis.call('SCARD', active) + redis.call('ZCARD', claims)
if n >= cap then
  return {'cap', now, retired, n}
end
redis.call('ZADD', claims, now + tonumber(claim_ttl_ms), member)
redis.call('HSET', claimers, member, claim_id)
return {'claimed', now, retired, n + 1}
