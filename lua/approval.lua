-- approval.lua: shows a tree as waiting for approval while one of its calls waits for an
-- operator to raise a limit (ExecutionConfig.approval_wait_s), on the root context's hash
-- (the hash budgetctl top reads), and ends that once the wait is over.
--
-- KEYS[1]  root_ctx  bc:{R}:ctx:<root>  hash  the root context; fields approval_ctx,
--                                      approval_reason, approval_until_ms
-- ARGV[1]  mode  'start' or 'end'
-- ARGV[2]  ctx_id  the waiting call's context id
-- start:
--   ARGV[3]  reason  the stop reason (or refused dimension's reason) the call waits on
--   ARGV[4]  wait_ms  how long it waits at most, in ms
-- end:
--   ARGV[3]  until_ms  the approval_until_ms its start returned
--
-- start sets approval_ctx = ctx_id, approval_reason = reason and approval_until_ms = Redis
-- now + wait_ms (a later wait in the tree replaces an earlier one) and returns
-- approval_until_ms; 0 when the root's hash is gone (nothing written). end deletes the
-- three fields if they still name this wait (approval_ctx = ctx_id and approval_until_ms =
-- until_ms) and returns 1, else 0. Readers treat the tree as waiting while
-- approval_until_ms is later than Redis now, so a wait whose process died stops showing
-- at its end.
-- Returns approval_until_ms (start; 0 when nothing was written), or 1 / 0 (end: the marks
-- removed or not).
--
-- uses: common

if mode == 'start' then
  if redis.call('EXISTS', root_ctx) == 0 then return 0 end
  local until_at = now_ms() + tonumber(wait_ms)
  redis.call('HSET', root_ctx, 'approval_ctx', ctx_id, 'approval_reason', reason,
             'approval_until_ms', until_at)
  return until_at
end
local named = redis.call('HMGET', root_ctx, 'approval_ctx', 'approval_until_ms')
if named[1] ~= ctx_id or named[2] ~= until_ms then return 0 end
redis.call('HDEL', root_ctx, 'approval_ctx', 'approval_reason', 'approval_until_ms')
return 1
