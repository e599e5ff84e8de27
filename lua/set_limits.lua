-- set_limits.lua: an operator changes a running context's limits (raises or lowers them),
-- audited in the same step (docs/operators.md).
--
-- KEYS[1]     ctx  bc:{R}:ctx:<id>     hash  the context
-- KEYS[2]     events  bc:{R}:events:<id>  list  its SafetyEvents
-- KEYS[3..]   ancestors{ctx}  bc:{R}:ctx:<a>  hash  its ancestors, root first, parent last
--             (none for a root)
-- ARGV[1]     ctx_id  context id
-- ARGV[2]     root  root id
-- ARGV[3]     abort_channel  abort channel (pub/sub, not a key)
-- ARGV[4]     actor  who changes the limits (free text, kept in the event)
-- ARGV[5]     why  why (free text, kept in the event)
-- ARGV[6..]   limits{dim, limit}  pairs: dimension (usd, steps, retries, ttot, tin, tout,
--             <provider>.ttot, ...) and its new limit (a canonical integer, at least 1)
--
-- Nothing is written unless the context exists, it and every ancestor are open (not
-- closed, not gone), and every limit and counter of the context is a canonical integer
-- (lib/numbers.lua stored_num). Then the limits are set; spend and holds stay as they are.
-- A raised limit lifts the stop it caused: a context stopped with the reason of a raised
-- dimension (reason_for: budget_exceeded, step_limit_exceeded, retry_budget_exceeded,
-- token_budget_exceeded) runs again once every limit of that reason at the level is above
-- its spend; no other stop (aborted, timeout, closed, state_corrupt) is ever lifted. A
-- running context whose changed limit is at or below its spend stops with that limit's
-- reason (stop_level), as reaching it would. One limits_changed SafetyEvent (hook HOOK)
-- names the actor, why, and each limit before and after (metadata.limits: dim -> {before,
-- after}, before null when there was none), before the stop's own event. Every change is
-- broadcast on the abort channel as {root, id, lifted = {reason...}}: the processes with
-- handles under the context forget a stop that was lifted (runtime/stop_listener.py).
-- Descendants' own hashes are not touched: their halt comes from this level's stop.
-- Returns {1, status, stop_reason, lifted, dim, before, after, ...} (stop_reason ''
--         when the context runs; lifted '' when no stop was lifted; before '' when the
--         dimension had no limit); {0, id} when the context or its ancestor id is closed
--         or gone; {2, field, value} when a number of the context is corrupt; {-1} when
--         the context does not exist.
--
-- uses: numbers, common, stops

local flat = redis.call('HGETALL', ctx)
if #flat == 0 then return {LimitsCode.MISSING} end
local h = {}
for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
if h.status == Status.CLOSED or h.closed_ms then return {LimitsCode.CLOSED, ctx_id} end
local ids = {}
for i, id in ipairs(split(h.mid or '')) do ids[i] = id end
for a = 1, #ancestors do
  local v = redis.call('HMGET', ancestors[a], 'status', 'closed_ms', 'id')
  if not v[1] or v[1] == Status.CLOSED or v[2] then
    return {LimitsCode.CLOSED, v[3] or (a == 1 and root) or ids[a - 1] or ''}
  end
end

-- every limit and counter of the level is checked before anything is written
local num = {}
for field, value in pairs(h) do
  local prefix = string.sub(field, 1, 2)
  if prefix == 'l:' or prefix == 'u:' or prefix == 'h:' then
    local n = stored_num(value)
    if n == false then return {LimitsCode.CORRUPT, field, string.sub(value, 1, 40)} end
    num[field] = n
  end
end

-- What a dimension's limit bounds: its own used counter, or, for a token total, the
-- sum of its two directions.
local function used_of(d)
  if string.sub(d, -4) == 'ttot' then
    local prefix = string.sub(d, 1, -5)
    return (num['u:' .. prefix .. 'tin'] or 0) + (num['u:' .. prefix .. 'tout'] or 0)
  end
  return num['u:' .. d] or 0
end

local now = now_ms()
local set, raised, changes, texts, reply_pairs = {}, {}, {}, {}, {}
for _, l in ipairs(limits) do
  local d, after = l.dim, tonumber(l.limit)
  local before = num['l:' .. d]
  if before ~= nil and after > before then raised[reason_for(d)] = true end
  num['l:' .. d] = after
  set[#set + 1] = 'l:' .. d
  set[#set + 1] = after
  changes[d] = {before = before == nil and cjson.null or before, after = after}
  texts[#texts + 1] = d .. ' ' .. (before == nil and 'none' or amount_text(d, before)) ..
                      ' -> ' .. amount_text(d, after)
  for _, x in ipairs({d, before == nil and '' or before, after}) do
    reply_pairs[#reply_pairs + 1] = x
  end
end
redis.call('HSET', ctx, unpack(set))

-- the stop a raise lifts: every limit of its reason has room again
local status, lifted = h.status, nil
if status == Status.STOPPED and raised[h.reason] then
  local room = true
  for field, limit in pairs(num) do
    if string.sub(field, 1, 2) == 'l:' then
      local d = string.sub(field, 3)
      if reason_for(d) == h.reason and used_of(d) >= limit then room = false end
    end
  end
  if room then
    lifted, status = h.reason, Status.RUNNING
    redis.call('HSET', ctx, 'status', Status.RUNNING)
    -- ev:<reason> stays: a refusal decided before the lift was heard adds no event
    redis.call('HDEL', ctx, 'reason', 'detail', 'stopped_ms')
  end
end

-- the stop a lowering makes: a changed limit at or below what is spent
local hit = nil
if status == Status.RUNNING then
  for _, l in ipairs(limits) do
    local d, limit = l.dim, tonumber(l.limit)
    local used = used_of(d)
    if hit == nil and used >= limit then
      hit = {reason_for(d), 'dimension ' .. d .. ' at ' .. amount_text(d, used) ..
                            ' reached its limit ' .. amount_text(d, limit)}
    end
  end
end

local text = 'limits changed by ' .. actor .. ': ' .. table.concat(texts, ', ')
if why ~= '' then text = text .. ' (' .. why .. ')' end
if lifted then text = text .. '; lifted ' .. lifted end
if hit then text = text .. '; stopped: ' .. hit[1] end
local metadata = {chain_id = ctx_id, actor = actor, reason = why, limits = changes}
if lifted then metadata.lifted = lifted end
if hit then metadata.stopped = hit[1] end
append_capped(events, EVENT_STREAM_CAP, cjson.encode({
  event_type = 'limits_changed', decision = 'ALLOW', reason = text, hook = HOOK,
  request_id = h.request_id, ts = now, metadata = metadata}))
redis.call('PUBLISH', abort_channel, cjson.encode({root = root, id = ctx_id,
                                                   lifted = {lifted}}))
local stop_reason = ''
if hit then
  stop_level(ctx, events, ctx_id, root, abort_channel, hit[1], hit[2], now)
  stop_reason = hit[1]
elseif status == Status.STOPPED then
  stop_reason = h.reason or ''
end
local out = {LimitsCode.CHANGED, stop_reason == '' and Status.RUNNING or Status.STOPPED,
             stop_reason, lifted or ''}
for _, x in ipairs(reply_pairs) do out[#out + 1] = x end
return out
