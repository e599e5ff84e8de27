-- quota_settle.lua: a grant ended (its tree closed, the rule changed, the window turned,
-- or its holder died): what the tree consumed of it becomes the bucket's spend, the rest
-- returns (docs/quotas.md). Runs on the rule's slot. Idempotent. What quota_renew.lua
-- already moved to the bucket's spend (the record's b) is not counted again.
--
-- KEYS[1]  bucket  bc:{qr:<rule>}:b:<w>:<b>  hash  the window's s:<dim> spent, g:<dim> in grants
-- KEYS[2]  grants  bc:{qr:<rule>}:grants     hash  member -> grant record (JSON)
-- KEYS[3]  expiry  bc:{qr:<rule>}:expiry     zset  member -> lease expiry
-- ARGV[1]  member  member
-- ARGV[2]  grant_id  the grant id that ended
-- ARGV[3]  unknown  '1': the tree's consumption is unknown (its keys are gone): charge the whole
--          grant; '0': charge the pairs below
-- ARGV[4..] consumed{dim, amount}  pairs: dimension (usd, calls, tok), amount consumed (integers
--           >= 0)
--
-- Returns 1 when the grant was settled; 0 when it was already (or is another grant).
--
-- uses: numbers

local raw = redis.call('HGET', grants, member)
if not raw then return 0 end
local rec = cjson.decode(raw)
if rec.g ~= grant_id then return 0 end
local used = {}
for _, c in ipairs(consumed) do used[c.dim] = tonumber(c.amount) end
local set = {}
local moved = rec.b or {}  -- spend quota_renew.lua already moved to the bucket
for _, d in ipairs({'usd', 'calls', 'tok'}) do
  local v = redis.call('HMGET', bucket, 's:' .. d, 'g:' .. d)
  local s, g = stored_num(v[1]) or 0, stored_num(v[2]) or 0
  local granted, b = rec.L[d] or 0, moved[d] or 0
  local spent = used[d] or 0
  if unknown == '1' then spent = math.max(granted, b) end
  if spent > b then
    set[#set + 1] = 's:' .. d
    set[#set + 1] = s + spent - b
  end
  if granted > b then
    set[#set + 1] = 'g:' .. d
    set[#set + 1] = math.max(0, g - (granted - b))
  end
end
if #set > 0 then redis.call('HSET', bucket, unpack(set)) end
redis.call('HDEL', grants, member)
redis.call('ZREM', expiry, member)
return 1
