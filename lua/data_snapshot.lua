-- data_snapshot.lua: the data stack a context sees, read atomically (checkpoints).
--
-- KEYS[1..]   levels{ctx, data, dmeta, dview}  per level, the context's own first, then its
--             parent, then each ancestor up to the root: bc:{R}:ctx:<id> the context,
--             bc:{R}:data:<id>, bc:{R}:dmeta:<id>, bc:{R}:dview:<id>
-- ARGV        none
--
-- The walk stops where the context's sight stops (a sandboxed level, or an isolated one,
-- whose frozen view is included).
-- Returns one entry per level it sees, its own first:
--   {created_ms, metadata JSON, {data key, JSON, ...}, {dmeta field, value, ...},
--    {view key, JSON, ...}}
--
-- uses: (none)

local out = {}
for _, keys in ipairs(levels) do
  local ctx = redis.call('HMGET', keys.ctx, 'created_ms', 'meta')
  local meta = redis.call('HGETALL', keys.dmeta)
  local iso = redis.call('HGET', keys.dmeta, 'iso')
  local view = {}
  if iso == 'isolated' then view = redis.call('HGETALL', keys.dview) end
  out[#out + 1] = {ctx[1] or '0', ctx[2] or '{}', redis.call('HGETALL', keys.data),
                   meta, view}
  if iso == 'sandboxed' or iso == 'isolated' then break end
end
return out
