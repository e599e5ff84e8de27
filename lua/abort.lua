-- abort.lua: stop a context, and with it its whole subtree, durably.
--
-- KEYS[1]     ctx  bc:{R}:ctx:<id>    hash    the context to stop
-- KEYS[2]     events  bc:{R}:events:<id> list    its SafetyEvents
-- ARGV[1]     reason  reason: 'aborted' (explicit abort) or 'timeout' (a local deadline timer)
-- ARGV[2]     detail  detail (free text)
-- ARGV[3]     abort_channel  abort channel (pub/sub, not a key)
-- ARGV[4]     root  root id
-- ARGV[5]     ctx_id  context id
--
-- Descendants are not touched: every reserve checks every level of its path, so a stopped
-- ancestor halts the whole subtree. A 'timeout' is only applied when the context's deadline
-- has passed in Redis time (a worker's clock is never trusted).
-- An abort of a context stopped by a ceiling (CEILING_REASONS), not closed, replaces that
-- stop: a raise of the limit (set_limits.lua) lifts a ceiling stop, never an abort.
-- Returns {1} when this call stopped it; {0, reason} when it was already stopped or closed;
--         {2, ms_left} when a timeout came early; {-1} when the context does not exist.
--
-- uses: numbers, common, stops

local v = redis.call('HMGET', ctx, 'status', 'reason', 'deadline', 'closed_ms')
if not v[1] then return {AbortCode.MISSING} end
if v[1] ~= Status.RUNNING then
  if reason ~= StopReason.ABORTED or v[1] ~= Status.STOPPED or v[4]
      or not CEILING_REASONS[v[2] or ''] then
    return {AbortCode.ALREADY, v[2] or v[1]}
  end
  redis.call('HSET', ctx, 'status', Status.RUNNING)  -- stop_level stops it as aborted
end
local now = now_ms()
if reason == StopReason.TIMEOUT then
  -- a corrupt deadline counts as passed (fail closed)
  local deadline = stored_num(v[3])
  if deadline ~= false and (deadline == nil or deadline == 0 or now < deadline) then
    return {AbortCode.EARLY, (deadline or 0) - now}
  end
end
stop_level(ctx, events, ctx_id, root, abort_channel, reason, detail, now)
return {AbortCode.STOPPED}
