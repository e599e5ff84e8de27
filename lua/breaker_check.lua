-- breaker_check.lua: may a call go to a provider whose circuit breaker is shared by every
-- process naming it? Takes the single HALF_OPEN probe when the recovery timeout has passed,
-- and renews the liveness lease of a probe while its holder runs it.
--
-- KEYS[1]  breaker  bc:{brk:<name>}:state  hash  state (CLOSED | OPEN | HALF_OPEN; absent = CLOSED),
--                                       failures, opened_ms, probe (holder id), probe_until
--                                       (its lease), past (holders whose lease lapsed, comma
--                                       separated: their outcome still counts)
-- ARGV[1]  mode  'check' (may take the probe), 'peek' (read only) or 'renew' (extend the lease of
--          the probe ARGV[3] holds)
-- ARGV[2]  recovery_ms  recovery timeout in ms (how long the breaker stays OPEN)
-- ARGV[3]  holder  holder id for the probe (fresh per check; ignored by 'peek')
-- ARGV[4]  ttl_ms  idle ttl in ms of the state hash
-- ARGV[5]  probe_lease_ms  probe lease in ms: a probe whose holder stops renewing it (it died) is
--          handed to
--          the next caller once its lease has run out
--
-- A failures, opened_ms or probe_until that is not a canonical integer opens the breaker
-- from now (fail closed).
-- Returns {allowed 0|1, state, failures, took_probe 0|1, wait_ms}. With 'peek', a free
-- probe reads as {1, 'HALF_OPEN', ...} without being taken. With 'renew', allowed is 1
-- when ARGV[3] still holds the probe (its lease is extended) and 0 otherwise.
--
-- uses: numbers, common

local now = now_ms()
local h = redis.call('HMGET', breaker, 'state', 'failures', 'opened_ms', 'probe',
                     'probe_until', 'past')
local state = h[1] or 'CLOSED'
local failures, opened, probe_until = stored_num(h[2]), stored_num(h[3]), stored_num(h[5])
local recovery = tonumber(recovery_ms)
local lease = tonumber(probe_lease_ms)
if failures == false or opened == false or probe_until == false then
  -- a number that is not canonical (lib/numbers.lua, stored_num): the breaker opens from now
  -- (fail closed) and its state is written anew
  redis.call('DEL', breaker)
  redis.call('HSET', breaker, 'state', 'OPEN', 'failures', 0, 'opened_ms', now)
  redis.call('PEXPIRE', breaker, ttl_ms)
  return {0, 'OPEN', 0, 0, recovery}
end
failures = failures or 0

if mode == 'renew' then
  if state ~= 'HALF_OPEN' or h[4] ~= holder then return {0, state, failures, 0, 0} end
  redis.call('HSET', breaker, 'probe_until', now + lease)
  redis.call('PEXPIRE', breaker, ttl_ms)
  return {1, state, failures, 1, 0}
end
if state == 'CLOSED' then return {1, 'CLOSED', failures, 0, 0} end
if state == 'OPEN' then
  local ready = (opened or now) + recovery
  if now < ready then return {0, 'OPEN', failures, 0, ready - now} end
elseif h[4] and (probe_until or 0) > now then
  -- HALF_OPEN and another caller's probe is unresolved (its holder renews its lease)
  return {0, 'HALF_OPEN', failures, 0, probe_until - now}
end
if mode == 'peek' then return {1, 'HALF_OPEN', failures, 0, 0} end
local past = h[6]
if state == 'HALF_OPEN' and h[4] then
  -- The holder's lease lapsed: the probe passes on, and its outcome, if it ever comes,
  -- still counts.
  past = (past and (past .. ',') or '') .. h[4]
  redis.call('HSET', breaker, 'past', past)
end
redis.call('HSET', breaker, 'state', 'HALF_OPEN', 'probe', holder,
           'probe_until', now + lease)
redis.call('PEXPIRE', breaker, ttl_ms)
return {1, 'HALF_OPEN', failures, 1, 0}
