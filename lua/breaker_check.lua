-- breaker_check.lua: may a call go to a provider whose circuit breaker is shared by every
-- process naming it? Takes the single HALF_OPEN probe when the recovery timeout has passed.
--
-- KEYS[1]  bc:{brk:<name>}:state  hash  state (CLOSED | OPEN | HALF_OPEN; absent = CLOSED),
--                                       failures, opened_ms, probe (holder id), probe_until
-- ARGV[1]  'check' (may take the probe) or 'peek' (read only)
-- ARGV[2]  recovery timeout in ms (also how long a probe may stay unresolved)
-- ARGV[3]  holder id for the probe (fresh per check; ignored by 'peek')
-- ARGV[4]  idle ttl in ms of the state hash
--
-- Returns {allowed 0|1, state, failures, took_probe 0|1, wait_ms}. With 'peek', a free
-- probe reads as {1, 'HALF_OPEN', ...} without being taken.

local now = now_ms()
local h = redis.call('HMGET', KEYS[1], 'state', 'failures', 'opened_ms', 'probe',
                     'probe_until')
local state = h[1] or 'CLOSED'
local failures = tonumber(h[2] or '0')
local recovery = tonumber(ARGV[2])

if state == 'CLOSED' then return {1, 'CLOSED', failures, 0, 0} end
if state == 'OPEN' then
  local ready = tonumber(h[3]) + recovery
  if now < ready then return {0, 'OPEN', failures, 0, ready - now} end
elseif h[4] and tonumber(h[5]) > now then
  -- HALF_OPEN and another caller's probe is unresolved (and its holder not presumed dead)
  return {0, 'HALF_OPEN', failures, 0, tonumber(h[5]) - now}
end
if ARGV[1] == 'peek' then return {1, 'HALF_OPEN', failures, 0, 0} end
redis.call('HSET', KEYS[1], 'state', 'HALF_OPEN', 'probe', ARGV[3],
           'probe_until', now + recovery)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {1, 'HALF_OPEN', failures, 1, 0}
