-- session_save.lua: upsert a session record and keep the tenant's indexes in step with its
-- status. Admission is not checked here (get_or_create does that in session_acquire).
-- KEYS[1] record  the session's record hash
-- KEYS[2] active  the tenant's set of active sessions (members "<conversation>:<path>")
-- KEYS[3] expiry  the tenant's zset of active sessions by expires_at (ms)
-- ARGV[1] member  member "<conversation>:<path>"
-- ARGV[2..] fields{field, value}  field, value pairs (must include status and expires_at)
-- Returns now_ms (also written as updated_at).
--
-- uses: common

local now = now_ms()
redis.call('DEL', record)
local status, expires = nil, nil
for _, f in ipairs(fields) do
  redis.call('HSET', record, f.field, f.value)
  if f.field == 'status' then status = f.value end
  if f.field == 'expires_at' then expires = tonumber(f.value) end
end
redis.call('HSET', record, 'updated_at', now)
if status == 'active' then
  redis.call('SADD', active, member)
  redis.call('ZADD', expiry, expires, member)
else
  redis.call('SREM', active, member)
  redis.call('ZREM', expiry, member)
end
return now
