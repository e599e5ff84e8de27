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
--
-- uses: numbers, common

local now = now_ms()
local deadline = redis.call('ZSCORE', claims, member)
if redis.call('HGET', claimers, member) ~= claim_id or not deadline
    or tonumber(deadline) <= now then
  return {'lost', now}
end
local generation = 1
local old = redis.call('HGETALL', record)
if #old > 0 then
  -- a generation that is not a canonical integer (lib/numbers.lua): one past the archived ones
  local last = stored_num(redis.call('HGET', record, 'generation'))
  if last == false then last = redis.call('XLEN', history) end
  generation = (last or 0) + 1
  redis.call('XADD', history, 'MAXLEN', '~', history_cap, '*', unpack(old))
  redis.call('DEL', record)
end
for _, f in ipairs(fields) do
  redis.call('HSET', record, f.field, f.value)
end
local expires = now + tonumber(ttl_ms)
redis.call('HSET', record, 'created_at', now, 'last_used_at', now, 'updated_at', now,
           'expires_at', expires, 'ttl_ms', ttl_ms, 'execution_count', 0,
           'total_execution_time_ms', 0, 'status', 'active', 'generation', generation)
redis.call('SADD', active, member)
redis.call('ZADD', expiry, expires, member)
redis.call('ZREM', claims, member)
redis.call('HDEL', claimers, member)
return {'ok', now, generation}
