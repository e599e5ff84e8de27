-- lib.lua: helpers shared by the scripts. coordinator/store/scripts.py prepends this file to
-- every other script before registering it, so each script stays one atomic EVALSHA.
-- Before it comes a prelude of constants defined once in Python
-- (coordinator/core/script_constants.py): HOOK, the hook name of the SafetyEvents the
-- scripts write, and EVENT_STREAM_CAP, the approximate length cap of a context's event
-- list and of the tree's ledger stream.
--
-- Context hash fields used here:
--   status  running | stopped | closed      reason, detail, stopped_ms
--   deadline  absolute Redis-time ms (0 = none)
--   l:<dim> limit   u:<dim> used (settled, subtree included)   h:<dim> held by reservations
--   n:<outcome> calls counted by outcome, nr:<reason> and nr_last refusals (count_call)
-- Dimensions: usd (micro-USD), steps, retries, tin, tout (tokens by direction) and
-- <provider>.tin / <provider>.tout. A total is the sum of its two directions: ttot and
-- <provider>.ttot have a limit (l:) but no counters of their own.

-- Stored numbers are parsed, not coerced: the project writes every limit, counter, hold,
-- deadline and time as a canonical decimal integer (digits only, no sign, no leading
-- zero, below 2^53: how Redis writes a Lua integer, how redis-py writes a Python int; no
-- script and no Python code stores a negative number). Anything else ('abc', '', '-5',
-- '1.5', '1e8', '0x7fffffff', ' 5', '+5', '5.0', '007', '0x1p30', which Lua's tonumber
-- would read as numbers) is corrupt state. The level holding it is stopped with reason
-- state_corrupt (fail closed): it never lifts a ceiling and never makes a script raise.
-- The Python twin is coordinator/store/state_check.py (canonical_int).
local MAX_EXACT = 9007199254740992  -- 2^53: integers above it are not exact in Lua

-- The number stored in a field (an HMGET value) or decoded from a record (cjson gives
-- numbers): nil when absent, false when corrupt. Digits-only strings above 2^53 are
-- corrupt too (tonumber reads them inexactly, or as inf).
local find = string.find
local function stored_num(v)
  if not v then return nil end
  local t = type(v)
  if t == 'string' then
    if v == '0' then return 0 end
    if find(v, '^[1-9]%d*$') then
      local n = tonumber(v)
      if n < MAX_EXACT then return n end
    end
    return false
  end
  if t == 'number' and v >= 0 and v < MAX_EXACT and math.floor(v) == v then return v end
  return false
end

-- Why a stored value (of field) is corrupt: the detail of a state_corrupt stop.
local function not_a_number(field, value)
  local shown = string.sub(tostring(value), 1, 40)
  return 'field ' .. field .. ' holds ' .. cjson.encode(shown) .. ', not a number'
end

-- values[i] (field name) as a number, default when absent; nil and the reason when corrupt.
local function checked(values, i, field, default)
  local n = stored_num(values[i])
  if n == false then return nil, not_a_number(field, values[i]) end
  if n == nil then return default end
  return n
end

-- The reservation record kept in bc:{R}:res for each open reservation (decoded in Python
-- by coordinator/store/records.py, ReservationRecord): c = the context id that reserved,
-- p = the path ids root first, d = the held amounts {dim, amount, ...}, k = 1 when the
-- reservation id is a keyed call id. Short keys: every reservation writes one.
local function new_reservation(ids, held, keyed)
  local rec = {c = ids[#ids], p = ids, d = held}
  if keyed then rec.k = 1 end
  return rec
end

-- The amounts a reservation holds as {dim, amount, ...} (zero amounts left out): the
-- record's d field, and what the holding script replies.
local function held_pairs(dims, amounts)
  local held = {}
  for j, d in ipairs(dims) do
    if amounts[j] > 0 then
      held[#held + 1] = d
      held[#held + 1] = amounts[j]
    end
  end
  return held
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The stop reason of a dimension (DIMENSION_REASONS, from the prelude): every token
-- dimension stops with token_budget_exceeded.
local function reason_for(dim)
  return DIMENSION_REASONS[dim] or StopReason.TOKEN_BUDGET_EXCEEDED
end

-- An amount of dimension d as a person reads it: usd (micro-USD) in dollars ($0.021203,
-- $0.60), every other dimension as the integer it is. Used in stop and refusal details,
-- which SafetyEvents and budgetctl show.
local function amount_text(d, n)
  if d ~= 'usd' then return tostring(n) end
  local s = string.format('%.6f', n / 1000000)
  return '$' .. (string.gsub(s, '(%.%d%d%d-)0+$', '%1'))
end

-- Appends value to a capped list (a context's node records or its events; a list, not a
-- stream: Redis preallocates about 4 KB for a stream's first entry): once the list passes
-- cap by a tenth it is trimmed to its cap newest entries, so a trim is rare (as XADD's
-- MAXLEN ~). cap may be a string (an ARGV).
local function append_capped(key, cap, value)
  cap = tonumber(cap)
  if redis.call('RPUSH', key, value) > cap + math.floor(cap / 10) then
    redis.call('LTRIM', key, -cap, -1)
  end
end

-- Appends to out (id, record) for up to 8 entries whose lease (score in leases_key, Redis
-- ms) expired before now, their records read from records_key (a hash): reservations
-- and slices of a tree, or grants of a quota, for the caller to settle. A lease whose
-- record is gone is dropped. Returns out.
local function append_expired(out, records_key, leases_key, now)
  local expired = redis.call('ZRANGEBYSCORE', leases_key, '-inf', now, 'LIMIT', 0, 8)
  for _, id in ipairs(expired) do
    local rec = redis.call('HGET', records_key, id)
    if rec then
      out[#out + 1] = id
      out[#out + 1] = rec
    else
      redis.call('ZREM', leases_key, id)
    end
  end
  return out
end

local function split(csv)
  local out = {}
  for part in string.gmatch(csv, '[^,]+') do out[#out + 1] = part end
  return out
end

-- A run of pairs (a list of groups, as the slot prologue binds them) as the flat list
-- {g[first], g[second], ...} that reservation records and finish use.
local function flat_pairs(groups, first, second)
  local out = {}
  for _, g in ipairs(groups) do
    out[#out + 1] = g[first]
    out[#out + 1] = g[second]
  end
  return out
end

-- Marks a running context stopped, appends the SafetyEvent to its event list (marking
-- the reason recorded: ev:<reason>, see event_once.lua) and broadcasts the stop. Returns
-- true if this call stopped it. The channel is a pub/sub channel, not a key.
local function stop_level(key, events_key, id, root, channel, reason, detail, now)
  local v = redis.call('HMGET', key, 'status', 'request_id')
  if v[1] ~= Status.RUNNING then return false end
  redis.call('HSET', key, 'status', Status.STOPPED, 'reason', reason, 'detail', detail,
             'stopped_ms', now, 'ev:' .. reason, 1)
  local event = cjson.encode({event_type = reason, decision = 'HALT', reason = detail,
                              hook = HOOK, request_id = v[2], ts = now,
                              metadata = {chain_id = id}})
  append_capped(events_key, EVENT_STREAM_CAP, event)
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

-- How levels are read by read_level: the fields of one HMGET. head: named fields read
-- first ('status' as stored, any other a number, 0 when absent); then l:, u:, h: of each
-- dimension of dims; then the limit of each token total of totals (token_totals: both
-- its directions must be among dims). slot[d]: where dimension d's numbers are in a level
-- read with this shape ({limit, used, held}) and its u: and h: fields (used_field,
-- held_field, for the caller's HSET); total_slot[i]: where the limit of totals[i] is;
-- limit_at[i]: true when fields[i] is a limit (absent: no limit, where a counter is 0).
local function level_shape(head, dims, totals)
  local fields, slot, total_slot, limit_at = {}, {}, {}, {}
  for i, f in ipairs(head) do fields[i] = f end
  for _, d in ipairs(dims) do
    local n = #fields
    fields[n + 1], fields[n + 2], fields[n + 3] = 'l:' .. d, 'u:' .. d, 'h:' .. d
    slot[d] = {limit = n + 1, used = n + 2, held = n + 3, used_field = fields[n + 2],
               held_field = fields[n + 3]}
    limit_at[n + 1] = true
  end
  for i, t in ipairs(totals) do
    fields[#fields + 1] = t[4]
    total_slot[i] = #fields
    limit_at[#fields] = true
  end
  return {head = head, fields = fields, slot = slot, total_slot = total_slot,
          limit_at = limit_at}
end

-- read_level's number at level[i] (default when absent), noting why when it is corrupt.
local function level_num(level, fields, i, default)
  local v = level[i]
  local n = stored_num(v)
  if n == nil then return default end
  if n == false then
    local detail = not_a_number(fields[i], v)
    level.why = level.why or {}
    level.why[fields[i]] = detail
    if not level.corrupt then level.corrupt, level.corrupt_field = detail, fields[i] end
  end
  return n
end

-- A level's context hash (key) read with one HMGET of shape's fields (level_shape), every
-- number parsed (stored_num) where it was read: level[shape.slot[d].limit] (.used, .held)
-- and level[shape.total_slot[i]] are numbers, and the head's fields are named (status as
-- stored, level.deadline...). An absent limit is nil, an absent counter or head number 0;
-- a corrupt number is false, and level.why = {field -> detail} says why (not_a_number;
-- nil when none is). level.corrupt and level.corrupt_field: the detail and the field of
-- the first corrupt number in field order. The callers (reserve.lua, lease_take.lua,
-- finish) check status, deadline and each limit against its counters themselves.
-- The numbers replace the HMGET reply's strings in place: no table per level beyond it.
local function read_level(key, shape)
  local fields, limit_at = shape.fields, shape.limit_at
  local level = redis.call('HMGET', key, unpack(fields))
  local head = shape.head
  for i, f in ipairs(head) do
    if f == 'status' then level.status = level[i] else level[f] = level_num(level, fields, i, 0) end
  end
  for i = #head + 1, #fields do
    if limit_at[i] then
      level[i] = level_num(level, fields, i, nil)
    else
      level[i] = level_num(level, fields, i, 0)
    end
  end
  return level
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

-- Quota grants counted by finish: defined by quota_lib.lua (prepended after this file).
local quota_finish

-- Finishes a reservation at every level of its path: drops the holds, adds the actual
-- amounts (actual = flat {dim, amount, ...}), counts the step (ok) or the retry (error),
-- then stops each level that reached a ceiling (a token total: its two directions).
-- Every level is read and checked before anything is written: a corrupt counter (used or
-- held, which the finish must add to) makes it change nothing but stop that level
-- (state_corrupt); a corrupt limit still takes the charge and stops its level.
-- Returns ok (false: nothing was written but those stops) and {level, reason, detail, ...}
-- of the levels this call stopped.
-- levels[i].ctx and levels[i].events are the context hash and the event list of rec.p[i].
-- When tokens were consumed, a TokenLedgerUpdated event is appended to the tree's ledger
-- stream and published on the ledger channel.
local function finish(rec, levels, actual, step, retry, channel, now, ledger_key,
                      ledger_channel)
  local dims, dheld, dused = {}, {}, {}
  local function touch(d)
    if dheld[d] == nil then
      dims[#dims + 1] = d
      dheld[d], dused[d] = 0, 0
    end
  end
  local held, bad_record = rec.d, nil
  for i = 1, #held, 2 do
    local n = stored_num(held[i + 1])
    if not n then
      bad_record = 'a reservation record holds ' ..
                   cjson.encode(string.sub(tostring(held[i + 1]), 1, 40)) .. ', not a number'
    else
      touch(held[i])
      dheld[held[i]] = dheld[held[i]] - n
    end
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

  local shape = level_shape({}, dims, totals)
  local fields = shape.fields
  local root = rec.p[1]
  local caller_used = {}
  local plan, broken = {}, {}
  for lv = 1, #rec.p do
    local key = levels[lv].ctx
    local level = read_level(key, shape)
    local why = level.why
    local set, hit, used, bad = {}, nil, {}, nil
    for _, d in ipairs(dims) do
      local slot = shape.slot[d]
      local limit, u, h = level[slot.limit], level[slot.used], level[slot.held]
      bad = bad or (u == false and why[slot.used_field])
            or (h == false and why[slot.held_field]) or nil
      if limit == false and hit == nil then hit = {StopReason.STATE_CORRUPT, why[fields[slot.limit]]} end
      used[d] = u
      if dheld[d] ~= 0 and h then
        set[#set + 1] = slot.held_field
        set[#set + 1] = h + dheld[d]
      end
      if dused[d] ~= 0 and u then
        used[d] = u + dused[d]
        set[#set + 1] = slot.used_field
        set[#set + 1] = used[d]
        if hit == nil and limit and used[d] >= limit then
          hit = {reason_for(d), 'dimension ' .. d .. ' at ' .. amount_text(d, used[d]) ..
                 ' reached its limit ' .. amount_text(d, limit)}
        end
      end
    end
    for i, t in ipairs(totals) do
      local limit = level[shape.total_slot[i]]
      if limit == false and hit == nil then hit = {StopReason.STATE_CORRUPT, why[t[4]]} end
      if hit == nil and not bad and limit and dused[t[2]] + dused[t[3]] > 0 then
        local total = used[t[2]] + used[t[3]]
        if total >= limit then
          local name = t[1] .. 'ttot'
          hit = {reason_for(name),
                 'dimension ' .. name .. ' at ' .. total .. ' reached its limit ' .. limit}
        end
      end
    end
    if bad then broken[#broken + 1] = {lv, bad} end
    if lv == #rec.p then caller_used = used end
    plan[lv] = {key = key, events = levels[lv].events, set = set, hit = hit}
  end
  if bad_record then broken[#broken + 1] = {#rec.p, bad_record} end
  local stopped = {}
  local function stop(lv, reason, detail)
    local p = plan[lv]
    if stop_level(p.key, p.events, rec.p[lv], root, channel, reason, detail, now) then
      stopped[#stopped + 1] = lv
      stopped[#stopped + 1] = reason
      stopped[#stopped + 1] = detail
    end
  end
  if #broken > 0 then
    for _, b in ipairs(broken) do stop(b[1], StopReason.STATE_CORRUPT, b[2]) end
    return false, stopped
  end
  if rec.q then quota_finish(plan[1].key, rec, dheld, dused, plan[1].set) end
  for lv = 1, #rec.p do
    local p = plan[lv]
    if #p.set > 0 then redis.call('HSET', p.key, unpack(p.set)) end
    if p.hit then stop(lv, p.hit[1], p.hit[2]) end
  end
  ledger_update(rec, totals, dused, caller_used, now, ledger_key, ledger_channel)
  return true, stopped
end

-- Finished reservation ids (the fin key, a zset by Redis ms), so that a settle
-- repeated (a write-behind retry, a reply lost in a failover) changes nothing. An id is
-- kept FINISHED_FLOOR_MS at least, at most FINISHED_KEEP_MS, and past the floor only
-- among the FINISHED_CAP latest: a busy tree's set stays small. A repeat that may come
-- later than the floor is flagged late by its sender (store/lateness.py: first sent over
-- 2 s ago, or its lease may have lapsed and been reaped); a late finish that finds no
-- trace of its id is taken as finished, never charged again (docs/bounds.md).
local FINISHED_KEEP_MS = 3600000
local FINISHED_FLOOR_MS = 5000
local FINISHED_CAP = 1000
-- The set is trimmed by about one finish in this many (those whose Redis ms is a multiple
-- of it): the others only add their id. An id is kept longer, never shorter, so the trim's
-- rate does not touch the guarantee; the root's close expires the set.
local FINISHED_TRIM_EVERY = 16
-- How long the record of a settle whose tree does not exist here is kept (7 days).
local ORPHAN_RECORD_KEEP_S = 604800

-- The ids of the path whose levels (groups of ctx, events keys) are given, read from the
-- hashes themselves (a settle whose reservation is not here); nil when one is missing.
local function path_from_levels(levels)
  local ids = {}
  for lv = 1, #levels do
    local id = redis.call('HGET', levels[lv].ctx, 'id')
    if not id then return nil end
    ids[lv] = id
  end
  return ids
end

-- Records a settle or release that found no reservation and no trace of its finish (the
-- reservation was lost, e.g. in a failover before it reached the replica): a
-- SettleOrphaned event on the tree's ledger stream and channel (metrics count it), with
-- the amounts and whether they were charged to the path.
local function orphan_event(id, ids, charged, amounts, now, ledger_key, ledger_channel)
  local flat = {}
  for i = 1, #amounts, 2 do flat[amounts[i]] = tonumber(amounts[i + 1]) end
  local event = cjson.encode({type = 'SettleOrphaned', reservation_id = id,
                              path = ids or {}, charged = charged, amounts = flat, ts = now})
  redis.call('XADD', ledger_key, 'MAXLEN', '~', EVENT_STREAM_CAP, '*', 'e', event)
  redis.call('PUBLISH', ledger_channel, event)
end

-- A node record (JSON, as Python writes it) decoded, {} when it is not a JSON object:
-- its fields are read from the decoded table, never matched in the text. pcall: a record
-- arrives after the charge was written, and never makes the script raise.
local function node_record(json)
  local ok, node = pcall(cjson.decode, json)
  if ok and type(node) == 'table' then return node end
  return {}
end

-- A record's field when it is a non-empty string (cjson gives JSON null as cjson.null).
local function text_field(node, name)
  local v = node[name]
  if type(v) == 'string' and v ~= '' then return v end
  return nil
end

-- Counts a call from its decoded node record (node_record) on the context hashes of
-- its path, root first (keys): n:<outcome> at every level (subtree included), outcome
-- being ok, error, interrupted (aborted, timeout, lost) or halted; on its own context
-- only, n:unreported for a call charged the floor for reporting nothing and, for a node
-- with a stop_reason (refused before it ran), n:refused, nr:<reason> and nr_last = reason
-- instead of an outcome (CALL_COUNTS, from the prelude, maps a status to its outcome).
-- Fields are written only when a call counts (absent means 0).
-- A count that is not an integer (corrupt state) stays as it is: pcall, never a script
-- error after the charge was written.
local function count_call(keys, node)
  local own = keys[#keys]
  local reason = text_field(node, 'stop_reason')
  if reason then
    redis.pcall('HINCRBY', own, 'n:' .. CallCount.REFUSED, 1)
    redis.pcall('HINCRBY', own, 'nr:' .. reason, 1)
    redis.call('HSET', own, 'nr_last', reason)
    return
  end
  local outcome = CALL_COUNTS[text_field(node, 'status') or '']
  if outcome then
    for _, key in ipairs(keys) do redis.pcall('HINCRBY', key, 'n:' .. outcome, 1) end
  end
  if node.unreported == true then
    redis.pcall('HINCRBY', own, 'n:unreported', 1)
  end
end

-- The context hash keys of the first n levels (groups of ctx, events keys).
local function context_keys(levels, n)
  local keys = {}
  for lv = 1, n do keys[lv] = levels[lv].ctx end
  return keys
end

-- Adds a call's micro-USD (its 'usd' amount; amounts: groups of dim, amount) to the
-- tree's spend by model (key), field '<provider>|<model>' of its node record ('-' for a
-- part not named); a call naming neither adds nothing (the close counts what no field
-- holds as 'unknown'). A corrupt field stays as it is (pcall: never a script error after
-- the charge was written).
local function count_model(key, node, amounts)
  local usd = 0
  for _, a in ipairs(amounts) do
    if a.dim == 'usd' then usd = tonumber(a.amount) end
  end
  if usd <= 0 then return end
  local provider, model = text_field(node, 'provider'), text_field(node, 'model')
  if provider or model then
    redis.pcall('HINCRBY', key, (provider or '-') .. '|' .. (model or '-'), usd)
  end
end

-- Trims the finished ids: older than the keep time, and past the floor beyond the cap.
local function trim_finished(finished, now)
  redis.call('ZREMRANGEBYSCORE', finished, '-inf', now - FINISHED_KEEP_MS)
  local over = redis.call('ZCARD', finished) - FINISHED_CAP
  if over > 0 then
    local edge = tonumber(redis.call('ZRANGE', finished, over - 1, over - 1, 'WITHSCORES')[2])
    redis.call('ZREMRANGEBYSCORE', finished, '-inf', math.min(edge, now - FINISHED_FLOOR_MS))
  end
end

-- How a keyed call is remembered for its replays: a step that ended without returning
-- (it raised an error that is not retryable, hit a limit or was cancelled: a status of
-- ENDED_WITHOUT_RETURN, from the prelude) as halted, so a replay does not go on as if it
-- had returned. A reaped one (lost: its worker died) stays ok: the replay goes on without
-- running it again. node: the decoded record.
local function remembered(outcome, node)
  if outcome == FinishOutcome.OK and ENDED_WITHOUT_RETURN[text_field(node, 'status') or ''] then
    return FinishOutcome.HALTED
  end
  return outcome
end

-- The body of settle.lua and release.lua: take the open reservation call.id, remember
-- that it finished (and a keyed one's outcome), finish it with call.amounts (groups of
-- dim, amount), append the node record, and return {1, level, reason, detail, ...} for
-- the levels it stopped. An id that already finished returns {0} and changes nothing. An
-- id never held here (lost in a failover) is charged to the path of keys.levels all the
-- same: {4, level, reason, detail, ...}; {5} when that path does not exist here either
-- (recorded, not charged). {3, level, 'state_corrupt', detail}: a counter on the path is
-- corrupt, nothing was charged, the reservation stays held with this finish kept in its
-- record (f = {outcome, node, amounts}): the reaper and a repair (budgetctl repair)
-- charge it as it was asked, once.
-- keys: res, leases, nodes, ledger, levels, fin, done, bymodel (the scripts' KEYS);
-- call: id, abort_channel, node, node_cap, ledger_channel, late, amounts (their ARGV).
-- call.late '1': a late finish (see FINISHED_FLOOR_MS); without a trace of its id it
-- returns {0} with a SettleLate event on the ledger, and charges nothing.
local function close_reservation(outcome, step, retry, keys, call)
  local id, finished, done = call.id, keys.fin, keys.done
  local amounts = flat_pairs(call.amounts, 'dim', 'amount')
  local now = now_ms()
  local code = FinishCode.FINISHED
  local rec = redis.call('HGET', keys.res, id)
  if rec then
    rec = cjson.decode(rec)
  else
    if redis.call('ZSCORE', finished, id) or redis.call('HEXISTS', done, id) == 1 then
      return {FinishCode.ALREADY}
    end
    if #amounts == 0 and not step and not retry then  -- nothing to charge: remember it
      redis.call('ZADD', finished, now, id)
      return {FinishCode.ALREADY}
    end
    if call.late == '1' then  -- finished long ago (its id trimmed): not charged again
      local event = cjson.encode({type = 'SettleLate', reservation_id = id, ts = now})
      redis.call('XADD', keys.ledger, 'MAXLEN', '~', EVENT_STREAM_CAP, '*', 'e', event)
      return {FinishCode.ALREADY}
    end
    local ids = path_from_levels(keys.levels)
    if ids == nil then
      -- the tree is gone here: its ledger stream keeps the record a week, not forever
      local fresh = redis.call('EXISTS', keys.ledger) == 0
      orphan_event(id, nil, false, amounts, now, keys.ledger, call.ledger_channel)
      if fresh then redis.call('EXPIRE', keys.ledger, ORPHAN_RECORD_KEEP_S) end
      return {FinishCode.ORPHAN_RECORDED}
    end
    rec, code = new_reservation(ids, {}, false), FinishCode.ORPHAN_CHARGED
  end
  local ok, stopped = finish(rec, keys.levels, amounts, step, retry, call.abort_channel, now,
                             keys.ledger, call.ledger_channel)
  if not ok then
    if code == FinishCode.FINISHED and rec.f == nil then
      rec.f = {outcome, call.node, amounts}
      redis.call('HSET', keys.res, id, cjson.encode(rec))
    end
    code = FinishCode.CORRUPT
  else
    redis.call('HDEL', keys.res, id)
    redis.call('ZREM', keys.leases, id)
    redis.call('ZADD', finished, now, id)
    if now % FINISHED_TRIM_EVERY == 0 then trim_finished(finished, now) end
    local node = call.node ~= '' and node_record(call.node) or {}
    if rec.k then redis.call('HSET', done, id, remembered(outcome, node)) end
    if code == FinishCode.ORPHAN_CHARGED then
      orphan_event(id, rec.p, true, amounts, now, keys.ledger, call.ledger_channel)
    end
    if call.node ~= '' then
      append_capped(keys.nodes, call.node_cap, call.node)
      count_call(context_keys(keys.levels, #rec.p), node)
      count_model(keys.bymodel, node, call.amounts)
    end
  end
  local out = {code}
  for _, x in ipairs(stopped) do out[#out + 1] = x end
  return out
end
