-- session_terminate.lua: end an active session, keeping its record for audit.
-- KEYS[1] record  the session's record hash
-- KEYS[2] active  the tenant's set of active sessions
-- KEYS[3] expiry  the tenant's zset of active sessions by expires_at
-- ARGV[1] member  member
-- ARGV[2] status  new status: terminated | expired | error
-- ARGV[3] reason  reason (manual, merged, deleted, archived, expired, rotated, error)
-- ARGV[4] last_error  last error ('' = leave as is)
-- ARGV[5] sandbox_id  sandbox id expected ('' = any): a session since replaced is left alone
-- ARGV[6] only_if_expired  '1' = only when the record is past its expires_at (cleanup), else '0'
-- Returns {'ok', now_ms, sandbox_id}, {'inactive', now_ms, sandbox_id} when it was not
-- active (nothing changed), {'missing', now_ms} without a record, or {'mismatch', now_ms,
-- sandbox_id} when it names another sandbox or (ARGV[6]) has not expired.
--
-- uses: numbers, common

local now = now_ms()
local rec = redis.call('HMGET', record, 'status', 'sandbox_id', 'expires_at')
if not rec[1] then
  return {'missing', now}
end
if sandbox_id ~= '' and rec[2] ~= sandbox_id then
  return {'mismatch', now, rec[2]}
end
if rec[1] ~= 'active' then
  return {'inactive', now, rec[2]}
end
if only_if_expired == '1' and (stored_num(rec[3]) or 0) > now then  -- corrupt: expired
  return {'mismatch', now, rec[2]}
end
redis.call('HSET', record, 'status', status, 'terminated_reason', reason,
           'updated_at', now)
if last_error ~= '' then
  redis.call('HSET', record, 'last_error', last_error)
end
redis.call('SREM', active, member)
redis.call('ZREM', expiry, member)
return {'ok', now, rec[2]}
