-- session_commit.lua: turn a live creation claim into an active session record.
-- KEYS[1] record  the session's record hash
-- KEYS[2] active  the tenant's set of active sessions
-- KEYS[3] expiry  the tenant's zset of active sessions by expires_at
-- KEYS[4] claims  the tenant's zset of creation claims
-- KEYS[5] claimers  the tenant's hash of claim ids
-- KEYS[6] history  the tenant's session history stream (replaced records, for audit)
-- ARGV[1] member  member
-- ARGV[2] claim_id  claim id
-- ARGV[3] ttl_ms  ttl ms
-- ARGV[4] history_cap  history cap (approximate MAXLEN)
-- ARGV[5..] fields{field, value}  field, value pairs of the new record (identity, sandbox, budget
--           path)
-- Returns {'ok', now_ms, generation} or {'lost', now_ms} when the claim lapsed or is not
-- the caller's (then nothing changed: kill the sandbox just made).

local now = now_ms()
local member = ARGV[1]
local deadline = redis.call('ZSCORE', KEYS[4], member)
if redis.call('HGET', KEYS[5], member) ~= ARGV[2] or not deadline
    or tonumber(deadline) <= now then
  return {'lost', now}
end
local generation = 1
local old = redis.call('HGETALL', KEYS[1])
if #old > 0 then
  -- a generation that is not a canonical integer (lib.lua): one past the archived ones
  local last = stored_num(redis.call('HGET', KEYS[1], 'generation'))
  if last == false then last = redis.call('XLEN', KEYS[6]) end
  generation = (last or 0) + 1
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[4], '*', unpack(old))
  redis.call('DEL', KEYS[1])
end
for i = 5, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
local expires = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'created_at', now, 'last_used_at', now, 'updated_at', now,
           'expires_at', expires, 'ttl_ms', ARGV[3], 'execution_count', 0,
           'total_execution_time_ms', 0, 'status', 'active', 'generation', generation)
redis.call('SADD', KEYS[2], member)
redis.call('ZADD', KEYS[3], expires, member)
redis.call('ZREM', KEYS[4], member)
redis.call('HDEL', KEYS[5], member)
return {'ok', now, generation}
