-- ledger.lua: the events of a tree's ledger stream and channel: TokenLedgerUpdated
-- (ledger_update) and SettleOrphaned (orphan_event).
-- needs: (none)

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
