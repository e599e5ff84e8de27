-- quota_grant.lua: put a grant taken from a quota (quota_take.lua) into the tree's root
-- hash, where the tree's reserves draw from it (lib.lua quota_state; docs/quotas.md).
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

if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 'gone'} end
local p = 'q' .. ARGV[1] .. ':'
local cur = redis.call('HGET', KEYS[1], p .. 'g')
local dims = {'usd', 'calls', 'tok'}
if cur == ARGV[2] then
  for i = 5, #ARGV, 2 do
    local l = stored_num(redis.call('HGET', KEYS[1], p .. 'l:' .. ARGV[i])) or 0
    redis.call('HSET', KEYS[1], p .. 'l:' .. ARGV[i], math.max(l, tonumber(ARGV[i + 1])))
  end
  return {1}
end
if cur and cur ~= '' then return {0, 'other', cur} end
-- a grant once ended never starts again (a late apply of its take would spend a grant
-- its bucket already settled)
if redis.call('HEXISTS', KEYS[1], p .. 'x:' .. ARGV[2]) == 1 then
  return {0, 'ended', ARGV[2]}
end
for _, d in ipairs(dims) do redis.call('HDEL', KEYS[1], p .. 'l:' .. d) end
local set = {p .. 'g', ARGV[2], p .. 'w', ARGV[3], p .. 'end', ARGV[4]}
for _, d in ipairs(dims) do
  set[#set + 1] = p .. 'u:' .. d
  set[#set + 1] = 0
  set[#set + 1] = p .. 'h:' .. d
  set[#set + 1] = 0
end
for i = 5, #ARGV, 2 do
  set[#set + 1] = p .. 'l:' .. ARGV[i]
  set[#set + 1] = ARGV[i + 1]
end
redis.call('HSET', KEYS[1], unpack(set))
return {1}
