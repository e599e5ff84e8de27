-- quota_set.lua: create, change or delete a quota rule, with its audit event, in one
-- step on the rule's slot (docs/quotas.md).
--
-- KEYS[1]  rule  bc:{qr:<rule>}:rule   hash    v (version), l:<dim> limits, def (the rule JSON)
-- KEYS[2]  audit  bc:{qr:<rule>}:audit  stream  who changed what: actor, action, before, after
-- ARGV[1]  action  'set' or 'delete'
-- ARGV[2]  actor  actor
-- ARGV[3]  definition  the rule's JSON without its version (set; '' for delete)
-- ARGV[4]  audit_cap  audit stream cap (approximate MAXLEN)
-- ARGV[5]  match  the match of the rule as JSON (set: a change may not alter it)
-- ARGV[6..] limits{dim, limit}  pairs: dimension (usd, calls, tok), limit (integers >= 0) (set)
--
-- Returns {1, version} when stored; {0, 'missing'} when deleting a rule that does not
-- exist; {0, 'match', old_match} when a set would change an existing rule's match.
--
-- uses: common

local now = now_ms()
local before = redis.call('HGET', rule, 'def') or ''
local version = tonumber(redis.call('HGET', rule, 'v') or '0')
if action == 'delete' then
  if before == '' then return {0, 'missing'} end
  redis.call('DEL', rule)
else
  if before ~= '' then
    local old, new = cjson.decode(before).match, cjson.decode(match)
    for k, v in pairs(old) do
      if new[k] ~= v then return {0, 'match', cjson.encode(old)} end
    end
    for k in pairs(new) do
      if old[k] == nil then return {0, 'match', cjson.encode(old)} end
    end
  end
  version = version + 1
  local def = cjson.decode(definition)
  def.version = version
  redis.call('DEL', rule)
  local set = {'v', version, 'def', cjson.encode(def)}
  for _, l in ipairs(limits) do
    set[#set + 1] = 'l:' .. l.dim
    set[#set + 1] = l.limit
  end
  redis.call('HSET', rule, unpack(set))
end
redis.call('XADD', audit, 'MAXLEN', '~', audit_cap, '*', 'actor', actor,
           'action', action, 'before', before,
           'after', redis.call('HGET', rule, 'def') or '', 'ts', now)
return {1, version}
