-- data_read.lua: read a context's data through its isolation level, in one round trip.
--
-- KEYS[1..]   levels{data, dmeta, dview}  per level, the context's own first, then its
--             parent, then each ancestor up to the root: bc:{R}:data:<id> its data,
--             bc:{R}:dmeta:<id> its record, bc:{R}:dview:<id> its frozen view (see
--             lib/data.lua)
-- ARGV[1]     mode  'get', 'all' (every key the context sees) or 'local' (its own data only)
-- get:
--   ARGV[2]   key  the key
--
-- Returns for 'get': {1, JSON, level} (level 0 = its own data, n = n levels up, the
-- frozen view of an isolated level counting one above it) or {0};
-- for 'all' and 'local': {key, JSON, key, JSON, ...}.
--
-- uses: data

if mode == 'get' then
  local v, level = data_lookup(levels, key)
  if v then return {1, v, level} end
  return {0}
end
if mode == 'local' then return redis.call('HGETALL', levels[1].data) end
return data_visible(levels)
