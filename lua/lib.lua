-- lib.lua: helpers shared by the scripts. coordinator/store/scripts.py prepends this file to
-- every other script before registering it, so each script stays one atomic EVALSHA.
-- Before it comes a prelude of constants defined once in Python
-- (coordinator/core/script_constants.py): HOOK, the hook name of the SafetyEvents the
-- scripts write, and EVENT_STREAM_CAP, the approximate MAXLEN of the event and ledger
-- streams.
--
-- Context hash fields used here:
--   status  running | stopped | closed      reason, detail, stopped_ms
--   deadline  absolute Redis-time ms (0 = none)
--   l:<dim> limit   u:<dim> used (settled, subtree included)   h:<dim> held by reservations
-- Dimensions: usd (micro-USD), steps, retries, tin, tout (tokens by direction) and
-- <provider>.tin / <provider>.tout. A total is the sum of its two directions: ttot and
-- <provider>.ttot have a limit (l:) but no counters of their own.

-- The reservation record kept in bc:{R}:res for each open reservation (decoded in Python
-- by coordinator/store/records.py, ReservationRecord): c = the context id that reserved,
-- p = the path ids root first, d = the held amounts {dim, amount, ...}, k = 1 when the
-- reservation id is a keyed call id. Short keys: every reservation writes one.
local function new_reservation(ids, held, keyed)
  local rec = {c = ids[#ids], p = ids, d = held}
  if keyed then rec.k = 1 end
  return rec
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local REASONS = {usd = 'budget_exceeded', steps = 'step_limit_exceeded',
                 retries = 'retry_budget_exceeded'}

-- The stop reason of a dimension: every token dimension stops with token_budget_exceeded.
local function reason_for(dim)
  return REASONS[dim] or 'token_budget_exceeded'
end

-- An amount of dimension d as a person reads it: usd (micro-USD) in dollars ($0.021203,
-- $0.60), every other dimension as the integer it is. Used in stop and refusal details,
-- which SafetyEvents and budgetctl show.
local function amount_text(d, n)
  if d ~= 'usd' then return tostring(n) end
  local s = string.format('%.6f', n / 1000000)
  return '$' .. (string.gsub(s, '(%.%d%d%d-)0+$', '%1'))
end

local function split(csv)
  local out = {}
  for part in string.gmatch(csv, '[^,]+') do out[#out + 1] = part end
  return out
end

-- Marks a running context stopped, appends the SafetyEvent to its event stream (marking
-- the reason recorded: ev:<reason>, see event_once.lua) and broadcasts the stop. Returns
-- true if this call stopped it. The channel is a pub/sub channel, not a key.
local function stop_level(key, events_key, id, root, channel, reason, detail, now)
  local v = redis.call('HMGET', key, 'status', 'request_id')
  if v[1] ~= 'running' then return false end
  redis.call('HSET', key, 'status', 'stopped', 'reason', reason, 'detail', detail,
             'stopped_ms', now, 'ev:' .. reason, 1)
  local event = cjson.encode({event_type = reason, decision = 'HALT', reason = detail,
                              hook = HOOK, request_id = v[2], ts = now,
                              metadata = {chain_id = id}})
  redis.call('XADD', events_key, 'MAXLEN', '~', EVENT_STREAM_CAP, '*', 'e', event)
  redis.call('PUBLISH', channel, cjson.encode({root = root, id = id, reason = reason}))
  return true
end

-- The token totals among dims: {prefix, input dim, output dim, limit field} for every
-- prefix ('' or '<provider>.') with a direction in dims. A total is checked against the
-- sum of both directions' counters, so callers read both.
local function token_totals(dims)
  local out, seen = {}, {}
  for i = 1, #dims do
    local d = dims[i]
    local prefix = nil
    if string.sub(d, -3) == 'tin' then prefix = string.sub(d, 1, -4)
    elseif string.sub(d, -4) == 'tout' then prefix = string.sub(d, 1, -5) end
    if prefix and not seen[prefix] then
      seen[prefix] = true
      out[#out + 1] = {prefix, prefix .. 'tin', prefix .. 'tout', 'l:' .. prefix .. 'ttot'}
    end
  end
  return out
end

-- Appends and publishes a TokenLedgerUpdated event if any tokens were consumed: the
-- call's tokens (and the USD it was charged) and the calling context's new token totals,
-- by provider ('' = all) and direction. A call has one provider, so its USD goes in both
-- of its delta entries. The JSON is assembled from pieces (strings through cjson): cheaper
-- than encoding tables.
local function ledger_update(rec, totals, dused, caller_used, now, ledger_key, ledger_channel)
  local function amounts(input, output, extra)
    return '{"input":' .. input .. ',"output":' .. output .. ',"total":' ..
           (input + output) .. extra .. '}'
  end
  local cost = ''
  if (dused.usd or 0) > 0 then cost = ',"cost_usd":' .. dused.usd / 1000000 end
  local delta, after = {}, {}
  for _, t in ipairs(totals) do
    local din, dout = dused[t[2]], dused[t[3]]
    if din > 0 or dout > 0 then
      local slug = cjson.encode(string.sub(t[1], 1, -2)) .. ':'
      delta[#delta + 1] = slug .. amounts(din, dout, cost)
      after[#after + 1] = slug .. amounts(caller_used[t[2]], caller_used[t[3]], '')
    end
  end
  if #delta == 0 then return end
  local event = '{"type":"TokenLedgerUpdated","chain_id":' .. cjson.encode(rec.c) ..
                ',"root":' .. cjson.encode(rec.p[1]) .. ',"delta":{' ..
                table.concat(delta, ',') .. '},"totals":{' .. table.concat(after, ',') ..
                '},"ts":' .. now .. '}'
  redis.call('XADD', ledger_key, 'MAXLEN', '~', EVENT_STREAM_CAP, '*', 'e', event)
  redis.call('PUBLISH', ledger_channel, event)
end

-- Finishes a reservation at every level of its path: drops the holds, adds the actual
-- amounts (actual = flat {dim, amount, ...}), counts the step (ok) or the retry (error),
-- then stops each level that reached a ceiling (a token total: its two directions).
-- One HMGET and one HSET per level. Returns {level, reason, detail, ...} of the levels
-- this call stopped.
-- KEYS[first + 2(i-1)] and the key after it are the context hash and the event stream
-- of rec.p[i]. When tokens were consumed, a TokenLedgerUpdated event is appended to the
-- tree's ledger stream and published on the ledger channel.
local function finish(rec, first, actual, step, retry, channel, now, ledger_key,
                      ledger_channel)
  local dims, dheld, dused = {}, {}, {}
  local function touch(d)
    if dheld[d] == nil then
      dims[#dims + 1] = d
      dheld[d], dused[d] = 0, 0
    end
  end
  local held = rec.d
  for i = 1, #held, 2 do
    touch(held[i])
    dheld[held[i]] = dheld[held[i]] - tonumber(held[i + 1])
  end
  for i = 1, #actual, 2 do
    local amount = tonumber(actual[i + 1])
    if amount > 0 then
      touch(actual[i])
      dused[actual[i]] = dused[actual[i]] + amount
    end
  end
  if step then touch('steps'); dused.steps = dused.steps + 1 end
  if retry then touch('retries'); dused.retries = dused.retries + 1 end
  local totals = token_totals(dims)
  for _, t in ipairs(totals) do touch(t[2]); touch(t[3]) end

  local fields = {}
  for j, d in ipairs(dims) do
    fields[3 * j - 2], fields[3 * j - 1], fields[3 * j] = 'l:' .. d, 'u:' .. d, 'h:' .. d
  end
  for _, t in ipairs(totals) do fields[#fields + 1] = t[4] end
  local stopped = {}
  local root = rec.p[1]
  local caller_used = {}
  for lv = 1, #rec.p do
    local key, events_key = KEYS[first + 2 * (lv - 1)], KEYS[first + 2 * (lv - 1) + 1]
    local v = redis.call('HMGET', key, unpack(fields))
    local set, hit, used = {}, nil, {}
    for j, d in ipairs(dims) do
      local limit = tonumber(v[3 * j - 2])
      used[d] = tonumber(v[3 * j - 1] or '0')
      if dheld[d] ~= 0 then
        set[#set + 1] = fields[3 * j]
        set[#set + 1] = tonumber(v[3 * j] or '0') + dheld[d]
      end
      if dused[d] ~= 0 then
        used[d] = used[d] + dused[d]
        set[#set + 1] = fields[3 * j - 1]
        set[#set + 1] = used[d]
        if hit == nil and limit and used[d] >= limit then
          hit = {d, 'dimension ' .. d .. ' at ' .. amount_text(d, used[d]) ..
                 ' reached its limit ' .. amount_text(d, limit)}
        end
      end
    end
    for i, t in ipairs(totals) do
      local limit = tonumber(v[3 * #dims + i])
      if hit == nil and limit and dused[t[2]] + dused[t[3]] > 0 then
        local total = used[t[2]] + used[t[3]]
        if total >= limit then
          local name = t[1] .. 'ttot'
          hit = {name, 'dimension ' .. name .. ' at ' .. total .. ' reached its limit ' .. limit}
        end
      end
    end
    if lv == #rec.p then caller_used = used end
    if #set > 0 then redis.call('HSET', key, unpack(set)) end
    if hit and stop_level(key, events_key, rec.p[lv], root, channel, reason_for(hit[1]),
                          hit[2], now) then
      stopped[#stopped + 1] = lv
      stopped[#stopped + 1] = reason_for(hit[1])
      stopped[#stopped + 1] = hit[2]
    end
  end
  ledger_update(rec, totals, dused, caller_used, now, ledger_key, ledger_channel)
  return stopped
end

-- The body of settle.lua and release.lua (their KEYS/ARGV layout): take the open
-- reservation ARGV[1] (none: {0}, it already finished), remember a keyed one's outcome,
-- finish it with the amounts in ARGV[amounts_from..], append the node record, and return
-- {1, level, reason, detail, ...} for the levels it stopped.
local function close_reservation(outcome, step, retry, amounts_from)
  local rec = redis.call('HGET', KEYS[1], ARGV[1])
  if not rec then return {0} end
  rec = cjson.decode(rec)
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  if rec.k then redis.call('HSET', KEYS[#KEYS], ARGV[1], outcome) end
  local amounts = {}
  for i = amounts_from, #ARGV do amounts[#amounts + 1] = ARGV[i] end
  local stopped = finish(rec, 5, amounts, step, retry, ARGV[2], now_ms(), KEYS[4], ARGV[5])
  if ARGV[3] ~= '' then
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'n', ARGV[3])
  end
  local out = {1}
  for _, x in ipairs(stopped) do out[#out + 1] = x end
  return out
end
