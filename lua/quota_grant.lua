-- quota_grant.lua: put a grant taken from a quota (quota_take.lua) into the tree's root
-- hash, where the tree's reserves draw from it (lib/quota.lua quota_state; docs/quotas.md).
--
-- KEYS[1]  root  bc:{R}:ctx:<root>  hash  the tree's root
-- ARGV[1]  index  i, the bucket's index
-- ARGV[2]  grant_id  grant id ('-': the rule is gone, calls no longer draw from this bucket)
-- ARGV[3]  window  window id
-- ARGV[4]  end_ms  window end ms (0: never)
-- ARGV[5..] amounts{dim, granted}  pairs: dimension, granted (cumulative, the grant's whole
--           amount)
--
-- The live grant grows to what was granted; when the bucket has no live grant, this one
-- starts with nothing spent or held (dimensions not in the pairs are not limited).
-- Returns {1} applied; {0, 'gone'} no such root; {0, 'other', grant_id} the bucket has
-- another live grant (end it first: quota_end.lua); {0, 'ended', grant_id} that grant
-- was ended already (quota_end.lua leaves q<i>:x:<grant id>).
--
-- uses: numbers

if redis.call('EXISTS', root) == 0 then return {0, 'gone'} end
local p = 'q' .. index .. ':'
local cur = redis.call('HGET', root, p .. 'g')
local dims = {'usd', 'calls', 'tok'}
if cur == grant_id then
  for _, a in ipairs(amounts) do
    local l = stored_num(redis.call('HGET', root, p .. 'l:' .. a.dim)) or 0
    redis.call('HSET', root, p .. 'l:' .. a.dim, math.max(l, tonumber(a.granted)))
  end
  return {1}
end
if cur and cur ~= '' then return {0, 'other', cur} end
-- a grant once ended never starts again (a late apply of its take would spend a grant
-- its bucket already settled)
if redis.call('HEXISTS', root, p .. 'x:' .. grant_id) == 1 then
  return {0, 'ended', grant_id}
end
for _, d in ipairs(dims) do redis.call('HDEL', root, p .. 'l:' .. d) end
local set = {p .. 'g', grant_id, p .. 'w', window, p .. 'end', end_ms}
for _, d in ipairs(dims) do
  set[#set + 1] = p .. 'u:' .. d
  set[#set + 1] = 0
  set[#set + 1] = p .. 'h:' .. d
  set[#set + 1] = 0
end
for _, a in ipairs(amounts) do
  set[#set + 1] = p .. 'l:' .. a.dim
  set[#set + 1] = a.granted
end
redis.call('HSET', root, unpack(set))
return {1}
