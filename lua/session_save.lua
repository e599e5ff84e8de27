-- session_save.lua: upsert a session record and keep the tenant's indexes in step with its
-- status. Admission is not checked here (get_or_create does that in session_acquire).
-- KEYS[1] record  the session's record hash
-- KEYS[2] active  the tenant's set of active sessions (members "<conversation>:<path>")
-- KEYS[3] expiry  the tenant's zset of active sessions by expires_at (ms)
-- ARGV[1] member  member "<conversation>:<path>"
-- ARGV[2..] fields{field, value}  field, value pairs (must include status and expires_at)
-- Returns now_ms (also written as updated_at).

local now = now_ms()
local member = ARGV[1]
redis.call('DEL', KEYS[1])
local status, expires = nil, nil
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  if ARGV[i] == 'status' then status = ARGV[i + 1] end
  if ARGV[i] == 'expires_at' then expires = tonumber(ARGV[i + 1]) end
end
redis.call('HSET', KEYS[1], 'updated_at', now)
if status == 'active' then
  redis.call('SADD', KEYS[2], member)
  redis.call('ZADD', KEYS[3], expires, member)
else
  redis.call('SREM', KEYS[2], member)
  redis.call('ZREM', KEYS[3], member)
end
return now
