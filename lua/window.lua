-- window.lua: a sliding-window limit on calls and USD for one scope (an org, a team, a
-- service, a user or a model), shared by every process. Check-and-add is one atomic step,
-- so the window is exact under any concurrency.
--
-- KEYS[1]  admitted  bc:{win:<name>:<scope>:<value>}:calls  zset  member '<call id>|<micro-USD>',
--                                                       score = Redis ms it was admitted
-- KEYS[2]  spent  bc:{win:<name>:<scope>:<value>}:usd    string  micro-USD of the members
-- ARGV[1]  mode  'admit' or 'charge'
-- ARGV[2]  window_ms  window length in ms; an entry counts while now - score < window
-- ARGV[3]  call_id  call id
-- admit:
--   ARGV[4]  max_calls  max calls (0 = no call limit)
--   ARGV[5]  degrade_calls  calls already in the window (before this one) from which it
--            degrades
--   ARGV[6]  max_usd  max micro-USD (0 = none)
--   ARGV[7]  degrade_usd  micro-USD above which it degrades
--   ARGV[8]  estimate  the call's estimate in micro-USD (held in the window until charged)
-- charge:
--   ARGV[4]  held  micro-USD held at admission
--   ARGV[5]  actual  actual micro-USD
--   ARGV[6]  max_usd  max micro-USD (0 = none)
--   ARGV[7]  degrade_usd  micro-USD above which it degrades
--
-- Returns {code, calls, micro-USD, now_ms, retry_after_ms}: code 0 ALLOW, 1 DEGRADE,
-- 2 HALT (admit: not added; retry_after_ms is when the oldest entry leaves the window).
-- Admitting a call id twice adds it once. Both keys expire one window after the last write.
-- A stored amount that is not a canonical integer (lib/numbers.lua, stored_num) refuses every
-- call (code 2, retry after one window) until the keys expire: it never lifts the limit.
--
-- uses: numbers, common

local now = now_ms()
local window = tonumber(window_ms)
local stored = redis.call('GET', spent)
local usd = stored_num(stored)
local function corrupt() return {2, redis.call('ZCARD', admitted), 0, now, window} end
if usd == false then return corrupt() end
usd = usd or 0

local function save()
  redis.call('PEXPIRE', admitted, window)
  -- A call-count window never holds money: it keeps no USD key.
  if stored or usd ~= 0 then redis.call('SET', spent, usd, 'PX', window) end
end

-- Drop the entries that left the window, and their money (amounts are >= 0, so with no
-- money in the window there is none to subtract).
if usd > 0 then
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', admitted, '-inf', now - window)) do
    local amount = stored_num(string.match(m, '|([^|]*)$'))
    if not amount then return corrupt() end
    usd = usd - amount
  end
end
if redis.call('ZREMRANGEBYSCORE', admitted, '-inf', now - window) > 0 then save() end

local function retry_after()
  local first = redis.call('ZRANGE', admitted, 0, 0, 'WITHSCORES')
  if #first == 0 then return 0 end
  return tonumber(first[2]) + window - now
end

local id = call_id
local calls = redis.call('ZCARD', admitted)

if mode == 'charge' then
  local member = id .. '|' .. held  -- as Python wrote the number: canonical
  local score = redis.call('ZSCORE', admitted, member)
  if score and tonumber(held) ~= tonumber(actual) then
    -- Keep the admission time: the actual amount leaves the window when the hold would.
    redis.call('ZREM', admitted, member)
    redis.call('ZADD', admitted, score, id .. '|' .. actual)
    usd = usd + tonumber(actual) - tonumber(held)
    save()
  end
  local code = 0
  local max, degrade = tonumber(max_usd), tonumber(degrade_usd)
  if max > 0 and usd >= max then code = 2
  elseif max > 0 and usd > degrade then code = 1 end
  return {code, calls, usd, now, 0}
end

local member = id .. '|' .. estimate
max_calls, degrade_calls = tonumber(max_calls), tonumber(degrade_calls)
max_usd, degrade_usd, estimate = tonumber(max_usd), tonumber(degrade_usd), tonumber(estimate)
if not redis.call('ZSCORE', admitted, member) then
  if (max_calls > 0 and calls >= max_calls)
     or (max_usd > 0 and (usd >= max_usd or usd + estimate > max_usd)) then
    return {2, calls, usd, now, retry_after()}
  end
  redis.call('ZADD', admitted, now, member)
  calls = calls + 1
  usd = usd + estimate
  save()
end
local code = 0
-- Calls: judged on the calls made before this one (the reference's rule), so a call
-- never degrades itself. USD: on the window with this call's estimate held.
if (max_calls > 0 and calls - 1 >= degrade_calls) or (max_usd > 0 and usd > degrade_usd) then
  code = 1
end
return {code, calls, usd, now, 0}
