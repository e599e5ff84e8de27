-- quota_renew.lua: extend the leases of grants whose holder lives, and move what their
-- trees spent so far from "held in grants" to "spent" in their buckets, so that a
-- bucket's spend shows while its trees run (docs/quotas.md). Runs on the rule's slot.
--
-- KEYS[1]  expiry  bc:{qr:<rule>}:expiry   zset  member -> lease expiry (Redis ms)
-- KEYS[2]  grants  bc:{qr:<rule>}:grants   hash  member -> grant record (JSON)
-- KEYS[3..] buckets{bucket}  per grant below: bc:{qr:<rule>}:b:<w>:<b>, its bucket's window (hash)
-- ARGV[1]  lease_ms  lease ms
-- ARGV[2..] renewals{member, grant_id, usd, calls, tok}  per grant, five: member, grant id, then
--           what its tree spent of it so far
--          in usd, calls, tok (q<i>:u:<dim>; -1 when unknown: nothing is moved)
--
-- A grant no longer there (ended) is not renewed. The record's b (spend already moved)
-- only grows, so a report repeated or late moves nothing twice; quota_settle.lua moves
-- the rest at the grant's end.
-- Returns a list of 1 (renewed) and 0 (gone), one per grant in ARGV order.
--
-- uses: numbers, common

local until_ms = now_ms() + tonumber(lease_ms)
local dims = {'usd', 'calls', 'tok'}
local out = {}
for i, renewal in ipairs(renewals) do
  local member, bucket = renewal.member, buckets[i]
  local raw = redis.call('HGET', grants, member)
  local rec = raw and cjson.decode(raw)
  if rec and rec.g == renewal.grant_id then
    redis.call('ZADD', expiry, 'XX', until_ms, member)
    rec.b = rec.b or {}
    local set = {}
    for _, d in ipairs(dims) do
      local used, b = tonumber(renewal[d]), rec.b[d] or 0
      if used > b then
        local v = redis.call('HMGET', bucket, 's:' .. d, 'g:' .. d)
        local s, g = stored_num(v[1]) or 0, stored_num(v[2]) or 0
        local granted = rec.L[d] or 0
        set[#set + 1] = 's:' .. d
        set[#set + 1] = s + used - b
        set[#set + 1] = 'g:' .. d
        set[#set + 1] = math.max(0, g - (math.min(used, granted) - math.min(b, granted)))
        rec.b[d] = used
      end
    end
    if #set > 0 then
      redis.call('HSET', bucket, unpack(set))
      redis.call('HSET', grants, member, cjson.encode(rec))
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
