-- session_record.lua: count one execution: execution_count + 1, total_execution_time_ms +
-- duration, last_used_at = now, expires_at = now + the record's ttl_ms (Redis time).
-- KEYS[1] record  the session's record hash
-- KEYS[2] expiry  the tenant's zset of active sessions by expires_at
-- ARGV[1] member  member
-- ARGV[2] duration_ms  duration ms (integer >= 0)
-- ARGV[3] sandbox_id  sandbox id the execution ran in ('' = any): a record since replaced by
--         another sandbox is not counted
-- Returns {'ok', now_ms, execution_count, expires_at} or {'missing', now_ms} when there
-- is no record (or it names another sandbox).
--
-- uses: numbers, common

local now = now_ms()
local rec = redis.call('HMGET', record, 'status', 'ttl_ms', 'sandbox_id')
if not rec[1] or (sandbox_id ~= '' and rec[3] ~= sandbox_id) then
  return {'missing', now}
end
local count = redis.call('HINCRBY', record, 'execution_count', 1)
redis.call('HINCRBY', record, 'total_execution_time_ms', duration_ms)
local expires = now + (stored_num(rec[2]) or 0)  -- a corrupt ttl: expired at once
redis.call('HSET', record, 'last_used_at', now, 'expires_at', expires, 'updated_at', now)
if rec[1] == 'active' then
  redis.call('ZADD', expiry, expires, member)
end
return {'ok', now, count, expires}
