-- data_write.lua: set and delete keys of a context's own data, atomically, within limits.
--
-- KEYS[1]     ctx  bc:{R}:ctx:<id>    hash  the context (a closed one refuses writes)
-- KEYS[2]     data  bc:{R}:data:<id>   hash  its data: key -> JSON
-- KEYS[3]     dmeta  bc:{R}:dmeta:<id>  hash  'bytes': the size of its data (keys + JSON)
-- ARGV[1]     max_bytes  the most bytes the context's data may hold
-- ARGV[2]     n_sets  n, the number of keys to set
-- ARGV[3..]   sets{key, value}  n pairs: key, JSON
-- ARGV[3+2n..] deletes{key}  the keys to delete
--
-- Keys and values were checked by the client (length, JSON, size of one value). Either
-- everything is written or nothing is.
-- Returns {1, bytes after, keys deleted}, {0, 'missing'}, {0, 'closed'},
-- {0, 'too_large', bytes the data would have held} or {0, 'state_corrupt', 'bytes',
-- value} when the stored size is not a canonical integer (lib/numbers.lua, stored_num).
--
-- uses: numbers, data

local refusal = data_refusal(ctx)
if refusal then return {0, refusal} end
local limit = tonumber(max_bytes)
local stored = redis.call('HGET', dmeta, 'bytes')
local bytes = stored_num(stored)
if bytes == false then return {0, StopReason.STATE_CORRUPT, 'bytes', string.sub(stored, 1, 40)} end
bytes = bytes or 0
local after = bytes
local writes = {}
for _, set in ipairs(sets) do
  local k, v = set.key, set.value
  if redis.call('HEXISTS', data, k) == 1 then
    after = after - redis.call('HSTRLEN', data, k) + #v
  else
    after = after + #k + #v
  end
  writes[#writes + 1] = k
  writes[#writes + 1] = v
end
local dels = {}
for _, k in ipairs(deletes) do
  if redis.call('HEXISTS', data, k) == 1 then
    after = after - #k - redis.call('HSTRLEN', data, k)
    dels[#dels + 1] = k
  end
end
if after > limit and after > bytes then return {0, 'too_large', after} end
data_call_chunked('HSET', data, writes, 1000)
data_call_chunked('HDEL', data, dels, 1000)
redis.call('HSET', dmeta, 'bytes', after)
return {1, after, #dels}
