-- quota_end.lua: end a tree's grant from a quota bucket: no call draws from it any more,
-- and what it consumed (spent + held by calls in flight, which may settle for less) is
-- returned for quota_settle.lua (docs/quotas.md). Idempotent: ending the grant again
-- returns the same amounts. The grant id is marked ended (q<i>:x:<id>), so that a late
-- quota_grant.lua never starts it.
--
-- KEYS[1]  root  bc:{R}:ctx:<root>  hash  the tree's root
-- ARGV[1]  index  i, the bucket's index
-- ARGV[2]  grant_id  the grant id to end
--
-- Returns {1, 'usd', n, 'calls', n, 'tok', n} the grant's consumption (0 for a grant that
-- never started here: now it never will); {2} unknown (the root is gone, a counter of
-- the grant is not a number, or the grant ended here before and is older than the last
-- one ended): quota_settle.lua then charges the whole grant.
--
-- uses: numbers

if redis.call('EXISTS', root) == 0 then return {2} end
local p = 'q' .. index .. ':'
-- whatever this finds, the grant can never start (again) in this tree
local seen = redis.call('HSETNX', root, p .. 'x:' .. grant_id, 1) == 0
local dims = {'usd', 'calls', 'tok'}
local out = {1}
local cur = redis.call('HGET', root, p .. 'g')
if cur == grant_id and cur ~= '' and cur ~= '-' then
  local set = {p .. 'g', '', p .. 'eg', cur}
  local corrupt = false
  for _, d in ipairs(dims) do
    local v = redis.call('HMGET', root, p .. 'u:' .. d, p .. 'h:' .. d)
    local u, h = stored_num(v[1]), stored_num(v[2])
    corrupt = corrupt or u == false or h == false
    local used = (u or 0) + (h or 0)
    out[#out + 1] = d
    out[#out + 1] = used
    set[#set + 1] = p .. 'ec:' .. d
    set[#set + 1] = used
    redis.call('HDEL', root, p .. 'l:' .. d)
  end
  redis.call('HSET', root, unpack(set))
  if corrupt then return {2} end  -- a counter that is not a number: charge the grant
  return out
end
local replay = redis.call('HGET', root, p .. 'eg') == grant_id
if seen and not replay then return {2} end
for _, d in ipairs(dims) do
  out[#out + 1] = d
  -- a grant never started here (its take was not applied yet) consumed nothing
  out[#out + 1] = replay and stored_num(redis.call('HGET', root, p .. 'ec:' .. d)) or 0
end
return out
