-- close.lua: end a context's life, record its summary, and start its retention clock.
--
-- KEYS[1]     ctx  bc:{R}:ctx:<id>     hash    the context
-- KEYS[2]     nodes  bc:{R}:nodes:<id>   list    its node records
-- KEYS[3]     events  bc:{R}:events:<id>  list    its SafetyEvents (the summary is appended here)
-- KEYS[4..]   others{key}  its other keys to expire with it: bc:{R}:kids:<id>, its context data
--             (bc:{R}:data:<id>, bc:{R}:dmeta:<id>, bc:{R}:dview:<id>); for a root also
--             bc:{R}:res, bc:{R}:leases, bc:{R}:ledger, bc:{R}:done, bc:{R}:fin,
--             bc:{R}:checkpoints, bc:{R}:chain
-- ARGV[1]     retention_s  retention in seconds
--
-- A running context becomes 'closed' (a stopped one keeps its stop reason); either way
-- later reserves in it and below it halt. The context_summary SafetyEvent states spend,
-- steps, time left before the deadline and tokens by direction and provider (hook HOOK,
-- the list capped at EVENT_STREAM_CAP: constants of the prelude, store/scripts.py).
-- Returns {1, status, micro-USD settled in its subtree, first} or {-1} if it does not
-- exist; first is 1 when this call closed it (set closed_ms), 0 when it was closed before
-- (by its owner or by gc: the cross-tree spend views count a tree once).
--
-- uses: numbers, common

local FIELDS = {'status', 'id', 'request_id', 'deadline', 'u:usd', 'u:steps', 'u:tin', 'u:tout',
                'h:tin', 'h:tout'}
local values = redis.call('HMGET', ctx, unpack(FIELDS))
local status = values[1]
if not status then return {-1} end
local h = {}
for i, field in ipairs(FIELDS) do h[field] = values[i] end
local now = now_ms()
local first = 1
if status == Status.RUNNING then
  redis.call('HSET', ctx, 'status', Status.CLOSED, 'reason', StopReason.CLOSED,
             'closed_ms', now)
  status = Status.CLOSED
else
  -- A stopped context keeps its status; closed_ms marks it closed all the same (writes
  -- to its context data are refused from then on: lib/data.lua).
  first = redis.call('HSETNX', ctx, 'closed_ms', now)
end

-- the summary reports a corrupt number as 0 (a close never fails on it)
local function n(field) return stored_num(h[field]) or 0 end
local function tokens(prefix)
  local input, output = n('u:' .. prefix .. 'tin'), n('u:' .. prefix .. 'tout')
  return {input = input, output = output, total = input + output,
          reserved = n('h:' .. prefix .. 'tin') + n('h:' .. prefix .. 'tout')}
end
-- A provider's counters (u:<provider>.tin, ...) are only written with tokens used or held,
-- which the base counters count too: no need to look for them otherwise.
if n('u:tin') + n('u:tout') + n('h:tin') + n('h:tout') > 0 then
  local flat = redis.call('HGETALL', ctx)
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
end
local summary = tokens('')
local by_provider = {}
for field, _ in pairs(h) do
  local slug = string.match(field, '^u:(.+)%.tin$') or string.match(field, '^u:(.+)%.tout$')
  if slug then by_provider[slug] = tokens(slug .. '.') end
end
if next(by_provider) then summary.by_provider = by_provider end
local metadata = {chain_id = h.id, cost_usd = n('u:usd') / 1000000, steps = n('u:steps'),
                  tokens = summary}
local deadline = n('deadline')
if deadline > 0 then metadata.time_remaining_ms = math.max(0, deadline - now) end
local event = cjson.encode({
  event_type = 'context_summary', decision = 'ALLOW', hook = HOOK,
  request_id = h.request_id, ts = now, metadata = metadata,
  reason = 'closed after ' .. n('u:steps') .. ' steps, ' .. n('u:usd') .. ' micro-USD, ' ..
           summary.total .. ' tokens'})
append_capped(events, EVENT_STREAM_CAP, event)

for _, key in ipairs({ctx, nodes, events, unpack(others)}) do
  redis.call('EXPIRE', key, tonumber(retention_s))
end
return {1, status, n('u:usd'), first}
