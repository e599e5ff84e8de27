-- data_merge.lua: merge a child's own data into its parent's, atomically, with a policy.
--
-- KEYS[1]     parent_ctx  bc:{R}:ctx:<parent>    hash  the parent (a closed one refuses the merge)
-- KEYS[2]     parent_data  bc:{R}:data:<parent>   hash  the parent's data
-- KEYS[3]     parent_dmeta  bc:{R}:dmeta:<parent>  hash  its size ('bytes') and merge counter
--             ('merges')
-- KEYS[4]     child_data  bc:{R}:data:<child>    hash  the child's own data (read only; the child
--             may
--                                          be stopped or closed)
-- ARGV[1]     policy  policy: keep_existing (the parent's value stays; keys it lacks are added),
--             overwrite (the child's value wins) or merge (deep merge, lib/data.lua)
-- ARGV[2]     max_value_bytes  the most bytes one JSON value may hold
-- ARGV[3]     max_bytes  the most bytes the parent's data may hold
-- ARGV[4..]   merged{key}  the child's keys to merge (none: all of them)
--
-- Nothing is written unless every merged value and the parent's data fit.
-- Returns {1, merge number (1 for the parent's first merge), bytes after,
--          change, key, change, key, ...} with change 'added', 'overwritten' or 'merged',
--         keys in sorted order; {0, 'missing'}, {0, 'closed'}, {0, 'too_large', 'value',
--         key, bytes}, {0, 'too_large', 'context', bytes} or {0, 'state_corrupt', 'bytes',
--         value} (the stored size is not a canonical integer: lib/numbers.lua, stored_num).
--
-- uses: numbers, data

local refusal = data_refusal(parent_ctx)
if refusal then return {0, refusal} end
local max_value, max_bytes = tonumber(max_value_bytes), tonumber(max_bytes)
local keys = merged
if #keys == 0 then keys = redis.call('HKEYS', child_data) end
table.sort(keys)
local stored = redis.call('HGET', parent_dmeta, 'bytes')
local bytes = stored_num(stored)
if bytes == false then return {0, StopReason.STATE_CORRUPT, 'bytes', string.sub(stored, 1, 40)} end
bytes = bytes or 0
local after = bytes
local writes, changes = {}, {}
for _, k in ipairs(keys) do
  local cv = redis.call('HGET', child_data, k)
  if cv then
    local pv = redis.call('HGET', parent_data, k)
    local nv, change = nil, nil
    if not pv then
      nv, change = cv, 'added'
    elseif policy == 'overwrite' then
      if pv ~= cv then nv, change = cv, 'overwritten' end
    elseif policy == 'merge' then
      local joined = data_merge_text(pv, cv)
      if joined ~= pv then nv, change = joined, 'merged' end
    end
    if nv then
      if #nv > max_value then return {0, 'too_large', 'value', k, #nv} end
      if pv then after = after - #pv + #nv else after = after + #k + #nv end
      writes[#writes + 1] = k
      writes[#writes + 1] = nv
      changes[#changes + 1] = change
      changes[#changes + 1] = k
    end
  end
end
if after > max_bytes and after > bytes then return {0, 'too_large', 'context', after} end
data_call_chunked('HSET', parent_data, writes, 1000)
redis.call('HSET', parent_dmeta, 'bytes', after)
local seq = redis.call('HINCRBY', parent_dmeta, 'merges', 1)
local out = {1, seq, after}
for _, x in ipairs(changes) do out[#out + 1] = x end
return out
