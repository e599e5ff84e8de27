-- session_load.lua: one session record and the Redis time.
-- KEYS[1] record  the session's record hash
-- ARGV    none
-- Returns {now_ms, field1, value1, ...}; only now_ms when there is no record. The record
-- is returned whatever its status (active, expired, error, terminated).
--
-- uses: common

local out = {now_ms()}
local flat = redis.call('HGETALL', record)
for i = 1, #flat do out[#out + 1] = flat[i] end
return out
