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

local now = now_ms()
local rec = redis.call('HMGET', KEYS[1], 'status', 'ttl_ms', 'sandbox_id')
if not rec[1] or (ARGV[3] ~= '' and rec[3] ~= ARGV[3]) then
  return {'missing', now}
end
local count = redis.call('HINCRBY', KEYS[1], 'execution_count', 1)
redis.call('HINCRBY', KEYS[1], 'total_execution_time_ms', ARGV[2])
local expires = now + (stored_num(rec[2]) or 0)  -- a corrupt ttl: expired at once
redis.call('HSET', KEYS[1], 'last_used_at', now, 'expires_at', expires, 'updated_at', now)
if rec[1] == 'active' then
  redis.call('ZADD', KEYS[2], expires, ARGV[1])
end
return {'ok', now, count, expires}
