-- window.lua: a sliding-window limit on calls and USD for one scope (an org, a team, a
-- service, a user or a model), shared by every process. Check-and-add is one atomic step,
-- so the window is exact under any concurrency.
--
-- KEYS[1]  calls  bc:{win:<name>:<scope>:<value>}:calls  zset  member '<call id>|<micro-USD>',
--                                                       score = Redis ms it was admitted
-- KEYS[2]  usd  bc:{win:<name>:<scope>:<value>}:usd    string  micro-USD of the members
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
-- A stored amount that is not a canonical integer (lib.lua, stored_num) refuses every
-- call (code 2, retry after one window) until the keys expire: it never lifts the limit.

local now = now_ms()
local window = tonumber(ARGV[2])
local stored = redis.call('GET', KEYS[2])
local usd = stored_num(stored)
local function corrupt() return {2, redis.call('ZCARD', KEYS[1]), 0, now, window} end
if usd == false then return corrupt() end
usd = usd or 0

local function save()
  redis.call('PEXPIRE', KEYS[1], window)
  -- A call-count window never holds money: it keeps no USD key.
  if stored or usd ~= 0 then redis.call('SET', KEYS[2], usd, 'PX', window) end
end

-- Drop the entries that left the window, and their money (amounts are >= 0, so with no
-- money in the window there is none to subtract).
if usd > 0 then
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - window)) do
    local amount = stored_num(string.match(m, '|([^|]*)$'))
    if not amount then return corrupt() end
    usd = usd - amount
  end
end
if redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window) > 0 then save() end

local function retry_after()
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if #first == 0 then return 0 end
  return tonumber(first[2]) + window - now
end

local id = ARGV[3]
local calls = redis.call('ZCARD', KEYS[1])

if ARGV[1] == 'charge' then
  local held, actual = tonumber(ARGV[4]), tonumber(ARGV[5])
  local member = id .. '|' .. ARGV[4]  -- as Python wrote the number: canonical
  local score = redis.call('ZSCORE', KEYS[1], member)
  if score and held ~= actual then
    -- Keep the admission time: the actual amount leaves the window when the hold would.
    redis.call('ZREM', KEYS[1], member)
    redis.call('ZADD', KEYS[1], score, id .. '|' .. ARGV[5])
    usd = usd + actual - held
    save()
  end
  local code = 0
  local max_usd, degrade_usd = tonumber(ARGV[6]), tonumber(ARGV[7])
  if max_usd > 0 and usd >= max_usd then code = 2
  elseif max_usd > 0 and usd > degrade_usd then code = 1 end
  return {code, calls, usd, now, 0}
end

local max_calls, degrade_calls = tonumber(ARGV[4]), tonumber(ARGV[5])
local max_usd, degrade_usd = tonumber(ARGV[6]), tonumber(ARGV[7])
local estimate = tonumber(ARGV[8])
local member = id .. '|' .. ARGV[8]
if not redis.call('ZSCORE', KEYS[1], member) then
  if (max_calls > 0 and calls >= max_calls)
     or (max_usd > 0 and (usd >= max_usd or usd + estimate > max_usd)) then
    return {2, calls, usd, now, retry_after()}
  end
  redis.call('ZADD', KEYS[1], now, member)
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
