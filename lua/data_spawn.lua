-- data_spawn.lua: record a new child's isolation level and step, and freeze its view.
--
-- KEYS[1]     ctx  bc:{R}:ctx:<child>    hash  the child (opened just before; must exist)
-- KEYS[2]     dmeta  bc:{R}:dmeta:<child>  hash  its data record: iso, par, step
-- KEYS[3]     dview  bc:{R}:dview:<child>  hash  its frozen view (isolated only)
-- KEYS[4..]   parents{data, dmeta, dview}  the parent's levels, 3 keys each (data, dmeta, dview),
--             parent first
-- ARGV[1]     isolation  isolation: inherit | isolated | sandboxed
-- ARGV[2]     parallel  '1' if the child is a parallel branch, else '0'
-- ARGV[3]     step  step name ('' = none)
-- ARGV[4]     view_mode  'freeze': an isolated child's view is what the parent sees now (its data
--             and, through its own isolation level, its ancestors'), copied in this same
--             atomic step; 'given': the view is ARGV[5..] (a resume)
-- ARGV[5..]   view{key, value}  pairs: key, JSON ('given' only)
--
-- Returns {1, number of keys in the frozen view} or {0, 'missing'}.
--
-- uses: common, data

if redis.call('EXISTS', ctx) == 0 then return {0, StopReason.MISSING} end
redis.call('HSET', dmeta, 'iso', isolation, 'par', parallel, 'step', step)
if isolation ~= 'isolated' then return {1, 0} end
local frozen
if view_mode == 'freeze' then
  frozen = data_visible(parents)
else
  frozen = flat_pairs(view, 'key', 'value')
end
redis.call('DEL', dview)
data_call_chunked('HSET', dview, frozen, 1000)
return {1, #frozen / 2}
