-- close_reservation.lua: the body of settle.lua and release.lua (close_reservation).
-- needs: common, reservations, finish, finished_ids, ledger, calls_counted

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
-- call: id, abort_channel, node, node_cap, ledger_channel, late, amounts (their ARGV) and
-- facts, what is counted of the node record (lib/calls_counted.lua node_facts), as sent
-- next to it: the record itself is only appended, never decoded.
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
  local facts = call.facts
  local ok, stopped = finish(rec, keys.levels, amounts, step, retry, call.abort_channel, now,
                             keys.ledger, call.ledger_channel, call_count_field(facts))
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
    if rec.k then redis.call('HSET', done, id, remembered(outcome, facts)) end
    if code == FinishCode.ORPHAN_CHARGED then
      orphan_event(id, rec.p, true, amounts, now, keys.ledger, call.ledger_channel)
    end
    if call.node ~= '' then
      append_capped(keys.nodes, call.node_cap, call.node)
      count_own(keys.levels[#rec.p].ctx, facts)
      count_model(keys.bymodel, facts, call.amounts)
    end
  end
  local out = {code}
  for _, x in ipairs(stopped) do out[#out + 1] = x end
  return out
end
