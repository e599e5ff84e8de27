-- session_list.lua: a tenant's active sessions, from its indexes (never a keyspace scan).
-- KEYS[1] expiry  the tenant's zset of active sessions by expires_at
-- ARGV[1] cutoff  cutoff ms: only sessions whose expires_at < cutoff; '+inf' = all active
-- ARGV[2] limit  limit (max members returned)
-- Returns {now_ms, member1, expires1, member2, expires2, ...}; members are
-- "<conversation>:<path>". Only active sessions are in the index.
--
-- uses: common

local now = now_ms()
local hi = cutoff == '+inf' and '+inf' or '(' .. cutoff
local rows = redis.call('ZRANGEBYSCORE', expiry, '-inf', hi, 'WITHSCORES', 'LIMIT', 0,
                        tonumber(limit))
local out = {now}
for i = 1, #rows do out[#out + 1] = rows[i] end
return out
