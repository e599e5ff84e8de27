-- quota_take.lua: a tree takes (or tops up) a grant from one bucket's window of a quota
-- rule, or is refused (docs/quotas.md). Runs on the rule's slot.
--
-- KEYS[1]  rule  bc:{qr:<rule>}:rule       hash  v (version), l:<dim> limits (usd, calls, tok)
-- KEYS[2]  bucket  bc:{qr:<rule>}:b:<w>:<b>  hash  the window's s:<dim> spent, g:<dim> in grants
-- KEYS[3]  grants  bc:{qr:<rule>}:grants     hash  member -> grant record (JSON)
-- KEYS[4]  expiry  bc:{qr:<rule>}:expiry     zset  member -> lease expiry (Redis ms)
-- KEYS[5]  takers  bc:{qr:<rule>}:takers:<w>:<b>  zset  trees that asked lately -> until (ms)
-- KEYS[6]  window_index  bc:{qr:<rule>}:w:<w>      set   the window's buckets (what listings read)
-- ARGV[1]  version  the rule version the caller computed the window with
-- ARGV[2]  start_ms  window start ms
-- ARGV[3]  end_ms  window end ms (0: the window never ends)
-- ARGV[4]  expire_at_ms  Redis ms at which the bucket's window expires (0: never)
-- ARGV[5]  member  member: '<bucket>|<window>|<root>' (the bucket's name is the member's part
--          before the first '|')
-- ARGV[6]  grant_id  grant id proposed for a new grant
-- ARGV[7]  root  root id
-- ARGV[8]  index  the bucket's index in the tree (its q<i> fields)
-- ARGV[9]  lease_ms  lease ms (the grant is reclaimed when not renewed for that long)
-- ARGV[10] share_divisor  share divisor: a grant takes at most (what remains) / (divisor * n), n
--          the
--          trees that asked lately (this one included), and at least the least amount
-- ARGV[11] takers_ms  how long a tree counts among the takers, in ms
-- ARGV[12..] wants{dim, amount, least}  triples: dimension (usd, calls, tok), amount wanted,
--            least amount
--
-- The sum of spent and in grants never passes a limit: a dimension whose limit cannot
-- spare the least amount refuses the grant and changes nothing.
-- Returns {1, now, grant_id, n, dim, granted, ..., expired_member, expired_json, ...}:
--   granted is the grant's cumulative amount (the tree's q<i>:l), for the limited
--   dimensions only; then up to 8 grants whose lease expired (their holder is gone);
-- {0, now, 'gone'} no such rule; {0, now, 'stale', version} the rule changed;
-- {0, now, 'window'} now is outside the window;
-- {0, now, 'exceeded', dim, limit, spent, in_grants, expired_member, expired_json, ...}
--   the limit cannot spare the least (the grants whose lease expired follow: reclaimed,
--   they may make room).
--
-- uses: numbers, common, reservations

local now = now_ms()
local stored = redis.call('HMGET', rule, 'v', 'l:usd', 'l:calls', 'l:tok')
if not stored[1] then return {0, now, 'gone'} end
if stored[1] ~= version then return {0, now, 'stale', stored[1]} end
local start, stop = tonumber(start_ms), tonumber(end_ms)
if stop > 0 and (now < start or now >= stop) then return {0, now, 'window'} end
local limits = {usd = stored_num(stored[2]), calls = stored_num(stored[3]),
                tok = stored_num(stored[4])}

redis.call('ZREMRANGEBYSCORE', takers, '-inf', now)
redis.call('ZADD', takers, now + tonumber(takers_ms), root)
redis.call('PEXPIRE', takers, tonumber(takers_ms))
local share = 1 / (tonumber(share_divisor) * redis.call('ZCARD', takers))

local raw = redis.call('HGET', grants, member)
local rec
if raw then rec = cjson.decode(raw) else
  rec = {g = grant_id, r = root, i = tonumber(index), L = {}}
end
local set = {}
for _, w in ipairs(wants) do
  local d, want, least = w.dim, tonumber(w.amount), tonumber(w.least)
  local limit = limits[d]
  if limit then
    local sg = redis.call('HMGET', bucket, 's:' .. d, 'g:' .. d)
    local s, g = stored_num(sg[1]) or 0, stored_num(sg[2]) or 0
    local left = limit - s - g
    if left < least then
      return append_expired({0, now, 'exceeded', d, limit, s, g}, grants, expiry, now)
    end
    local x = math.min(want, math.max(least, math.floor(left * share)))
    set[#set + 1] = 'g:' .. d
    set[#set + 1] = g + x
    rec.L[d] = (rec.L[d] or 0) + x
  end
end
if #set > 0 then redis.call('HSET', bucket, unpack(set)) else
  redis.call('HSETNX', bucket, 's:usd', 0)
end
redis.call('SADD', window_index, string.match(member, '^[^|]*'))
if tonumber(expire_at_ms) > 0 then
  redis.call('PEXPIREAT', bucket, tonumber(expire_at_ms))
  redis.call('PEXPIREAT', window_index, tonumber(expire_at_ms))
end
redis.call('HSET', grants, member, cjson.encode(rec))
redis.call('ZADD', expiry, now + tonumber(lease_ms), member)

local out = {1, now, rec.g, 0}
for d, amount in pairs(rec.L) do
  out[#out + 1] = d
  out[#out + 1] = amount
  out[4] = out[4] + 1
end
return append_expired(out, grants, expiry, now)
