-- finish.lua: a reservation finished at every level of its path (finish): settle, release,
-- propagate and the lease scripts charge through it.
-- needs: numbers, stops, levels, ledger, quota, warnings

-- Finishes a reservation at every level of its path: drops the holds, adds the actual
-- amounts (actual = flat {dim, amount, ...}), counts the step (ok) or the retry (error),
-- then stops each level that reached a ceiling (a token total: its two directions).
-- A level whose spend or steps reached a warn_at threshold not warned of yet records and
-- broadcasts its budget_warning (lib/warnings.lua), before any stop of that level.
-- Every level is read and checked before anything is written: a corrupt counter (used or
-- held, which the finish must add to) makes it change nothing but stop that level
-- (state_corrupt); a corrupt limit still takes the charge and stops its level.
-- Returns ok (false: nothing was written but those stops) and {level, reason, detail, ...}
-- of the levels this call stopped.
-- levels[i].ctx and levels[i].events are the context hash and the event list of rec.p[i].
-- When tokens were consumed, a TokenLedgerUpdated event is appended to the tree's ledger
-- stream and published on the ledger channel.
-- count (optional): a field ('n:<class>', lib/calls_counted.lua call_count_field) counting
-- the call at every level, read with the level and written in its HSET; a count that is
-- not a canonical integer stays as it is (never a stop: a count is not a limit).
local function finish(rec, levels, actual, step, retry, channel, now, ledger_key,
                      ledger_channel, count)
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

  local head, warn_dims = warn_head(dims, dused)
  local shape = level_shape(head, dims, totals)
  local fields = shape.fields
  local count_at = nil
  if count then
    count_at = #fields + 1
    fields[count_at] = count
  end
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
    plan[lv] = {key = key, events = levels[lv].events, set = set, hit = hit,
                calls = count_at and level[count_at],
                warns = warn_plan(key, level, shape, warn_dims, used, dused, set)}
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
    if p.calls then
      p.set[#p.set + 1] = count
      p.set[#p.set + 1] = p.calls + 1
    end
    if #p.set > 0 then redis.call('HSET', p.key, unpack(p.set)) end
    for _, w in ipairs(p.warns or {}) do
      warn_level(p.key, p.events, rec.p[lv], root, channel, w[1], w[2], now)
    end
    if p.hit then stop(lv, p.hit[1], p.hit[2]) end
  end
  ledger_update(rec, totals, dused, caller_used, now, ledger_key, ledger_channel)
  return true, stopped
end
