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
-- value} when the stored size is not a canonical integer (lib.lua, stored_num).

local refusal = data_refusal(KEYS[1])
if refusal then return {0, refusal} end
local limit = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local stored = redis.call('HGET', KEYS[3], 'bytes')
local bytes = stored_num(stored)
if bytes == false then return {0, StopReason.STATE_CORRUPT, 'bytes', string.sub(stored, 1, 40)} end
bytes = bytes or 0
local after = bytes
local sets = {}
for i = 3, 2 + 2 * n, 2 do
  local k, v = ARGV[i], ARGV[i + 1]
  if redis.call('HEXISTS', KEYS[2], k) == 1 then
    after = after - redis.call('HSTRLEN', KEYS[2], k) + #v
  else
    after = after + #k + #v
  end
  sets[#sets + 1] = k
  sets[#sets + 1] = v
end
local dels = {}
for i = 3 + 2 * n, #ARGV do
  local k = ARGV[i]
  if redis.call('HEXISTS', KEYS[2], k) == 1 then
    after = after - #k - redis.call('HSTRLEN', KEYS[2], k)
    dels[#dels + 1] = k
  end
end
if after > limit and after > bytes then return {0, 'too_large', after} end
data_call_chunked('HSET', KEYS[2], sets, 1000)
data_call_chunked('HDEL', KEYS[2], dels, 1000)
redis.call('HSET', KEYS[3], 'bytes', after)
return {1, after, #dels}
