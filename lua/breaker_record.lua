-- breaker_record.lua: the outcome of a call that a circuit breaker let through.
--
-- KEYS[1]  breaker  bc:{brk:<name>}:state  hash (see breaker_check.lua)
-- ARGV[1]  outcome  'success', 'failure', or 'release' (the probe was taken but the call never
--          ran)
-- ARGV[2]  threshold  failure threshold: consecutive failures that open a CLOSED breaker
-- ARGV[3]  holder  probe holder id this caller took with breaker_check ('' if none)
-- ARGV[4]  ttl_ms  idle ttl in ms of the state hash
--
-- A probe's outcome counts while the breaker is HALF_OPEN, even when its lease lapsed and
-- the probe passed to another caller: its success closes the breaker for everyone, its
-- failure re-opens it (a new recovery timeout). In CLOSED, a success resets the
-- consecutive-failure count and a failure adds one. Outcomes of calls dispatched before
-- the breaker opened (not a probe) change nothing while it is OPEN or HALF_OPEN.
-- A failures count that is not a canonical integer opens the breaker from now.
-- Returns {state, failures} after the update.
--
-- uses: numbers, common

local now = now_ms()
local h = redis.call('HMGET', breaker, 'state', 'failures', 'probe', 'past')
local state = h[1] or 'CLOSED'
local failures = stored_num(h[2])
if failures == false then  -- not a canonical integer (lib/numbers.lua): open from now, anew
  redis.call('DEL', breaker)
  redis.call('HSET', breaker, 'state', 'OPEN', 'failures', 0, 'opened_ms', now)
  redis.call('PEXPIRE', breaker, ttl_ms)
  return {'OPEN', 0}
end
failures = failures or 0
local current = state == 'HALF_OPEN' and holder ~= '' and h[3] == holder
local lapsed = false
if state == 'HALF_OPEN' and holder ~= '' and h[4] then
  for past in string.gmatch(h[4], '[^,]+') do
    if past == holder then lapsed = true end
  end
end
local is_probe = current or lapsed

if outcome == 'release' then
  if current then redis.call('HDEL', breaker, 'probe', 'probe_until') end
  return {state, failures}
end
if outcome == 'success' then
  if is_probe or (state == 'CLOSED' and failures > 0) then
    -- CLOSED with no failures is the absent hash: nothing stays behind for idle breakers
    redis.call('DEL', breaker)
    return {'CLOSED', 0}
  end
  return {state, failures}
end
if is_probe then
  redis.call('HSET', breaker, 'state', 'OPEN', 'opened_ms', now)
  redis.call('HDEL', breaker, 'probe', 'probe_until', 'past')
  redis.call('PEXPIRE', breaker, ttl_ms)
  return {'OPEN', failures}
end
if state ~= 'CLOSED' then return {state, failures} end
failures = redis.call('HINCRBY', breaker, 'failures', 1)
if failures >= tonumber(threshold) then
  state = 'OPEN'
  redis.call('HSET', breaker, 'state', 'OPEN', 'opened_ms', now)
end
redis.call('PEXPIRE', breaker, ttl_ms)
return {state, failures}
