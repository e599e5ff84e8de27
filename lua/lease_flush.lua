-- lease_flush.lua: write behind what the calls served from a slice spent (one batch), and
-- with the last flush return what the slice did not use.
--
-- KEYS[1]     res  bc:{R}:res      hash  open reservations (the slice's record)
-- KEYS[2]     leases  bc:{R}:leases   zset  reservation leases
-- KEYS[3]     nodes  bc:{R}:nodes:<c> list   node records of the slice's context
-- KEYS[4]     ledger  bc:{R}:ledger   stream TokenLedgerUpdated events of the tree
-- KEYS[5..]   levels{ctx, events}  per level of the slice's path, root first, two keys:
--             bc:{R}:ctx:<id> (hash) and bc:{R}:events:<id> (list of SafetyEvents)
-- KEYS[last - 1]  slices  bc:{R}:slices set  the slice ids of the tree now open
-- KEYS[last]      fin  bc:{R}:fin   zset  finished reservation ids (a slice charged as used at
--                 its expiry is there: lease_return.lua; one given back, as 'r:<slice id>')
-- ARGV[1]     slice_id  slice id
-- ARGV[2]     abort_channel  abort channel (pub/sub, not a key)
-- ARGV[3]     ledger_channel  ledger channel (pub/sub, not a key)
-- ARGV[4]     node_cap  node list cap (lib/common.lua append_capped)
-- ARGV[5]     give_back  '1': return the rest of the slice (its record goes); '0': keep it
-- ARGV[6]     path  path ids, comma-separated, root first (the levels in KEYS)
-- ARGV[7]     batch  batch number (increasing per slice: a batch already applied is skipped)
-- ARGV[8]     n_nodes  n, the number of node records
-- ARGV[9]     n_events  m, the number of events
-- ARGV[10..]  node_records{node}  n node records (JSON) of the slice's context (each
--             node counted on the path's hashes: lib/calls_counted.lua count_call)
-- ARGV[10+n..] events{event}  m SafetyEvents (JSON) of the slice's context
-- ARGV[rest]  spent{dim, amount}  pairs: dimension, amount spent by the batch (integers >= 0;
--             'steps' counts
--             the calls that completed, 'retries' those that failed)
--
-- The batch is charged at every level (lib/finish.lua finish: ceilings reached stop their level
-- and broadcast the stop); the slice's holds shrink by what the batch consumed of them.
-- A slice already reclaimed (its process was thought dead) and given back is charged all
-- the same, with no hold to shrink; one charged as used at its reclaim charges no USD or
-- tokens again, only the steps and retries its calls counted (the reclaim gave the held
-- steps back), and its node records are appended with cost_usd 0 (the reclaim's record
-- carries their cost), so every level's ledger still equals its node records.
-- A node record naming degraded_from (a ladder call served on a cheaper rung) counts nd
-- at every level and records the context's 'degraded' event once per pair of models
-- (lib/ladder.lua count_degraded), as reserve.lua does for a strict reserve.
-- A give-back is the slice's last batch: sent again (its reply lost), it changes nothing.
-- Returns {1, level, reason, detail, ...} with the levels this flush stopped; {0} when
-- the batch was already applied; {3, level, 'state_corrupt', detail} when a counter on
-- the path is corrupt (lib/finish.lua finish): nothing was charged, the slice stays held.
--
-- uses: numbers, common, stops, levels, ledger, quota, warnings, finish, records, calls_counted
-- uses: ladder

local returned = 'r:' .. slice_id  -- in the finished ids once the slice was given back
if slice_id ~= '' and redis.call('ZSCORE', fin, returned) then
  -- a give-back sent again (its reply was lost): it was the slice's last batch
  return {FinishCode.ALREADY}
end
local actual = flat_pairs(spent, 'dim', 'amount')
local raw = redis.call('HGET', res, slice_id)
local rec, seq = nil, tonumber(batch)
local part = {p = split(path), d = {}}
part.c = part.p[#part.p]
if raw then
  rec = cjson.decode(raw)
  local applied = stored_num(rec.b)
  if applied == false then  -- a corrupt record: finish stops its level, charges nothing
    part.d = {'b', rec.b}
  elseif (applied or 0) >= seq then
    if give_back ~= '1' then return {FinishCode.ALREADY} end
    actual = {}  -- only the return is left to do
  end
end
if rec then part.q = rec.q end  -- the slice's quota grants (lib/quota.lua)
local covered = false  -- the slice was charged as used at its reclaim
if not rec and redis.call('ZSCORE', fin, slice_id) then
  -- its USD and tokens are on the books (the reclaim's node record carries them): only
  -- the calls' steps and retries, which the reclaim gave back, are counted now
  covered = true
  local counts = {}
  for i = 1, #actual, 2 do
    if actual[i] == 'steps' or actual[i] == 'retries' then
      counts[#counts + 1] = actual[i]
      counts[#counts + 1] = actual[i + 1]
    end
  end
  actual = counts
end
local rest = {}
if rec then
  local by_dim = {}
  for i = 1, #actual, 2 do by_dim[actual[i]] = (by_dim[actual[i]] or 0) + tonumber(actual[i + 1]) end
  for i = 1, #rec.d, 2 do
    local dim, held = rec.d[i], stored_num(rec.d[i + 1])
    if not held then  -- a corrupt record: finish stops its level and charges nothing
      part.d[#part.d + 1] = dim
      part.d[#part.d + 1] = rec.d[i + 1]
      held = 0
    end
    local used = math.min(held, by_dim[dim] or 0)
    if give_back == '1' then used = held end
    if used > 0 then
      part.d[#part.d + 1] = dim
      part.d[#part.d + 1] = used
    end
    if held - used > 0 then
      rest[#rest + 1] = dim
      rest[#rest + 1] = held - used
    end
  end
end
local ok, stopped = true, {}
if #part.d > 0 or #actual > 0 then
  ok, stopped = finish(part, levels, actual, false, false, abort_channel, now_ms(), ledger,
                       ledger_channel)
end
if not ok then  -- a corrupt counter: nothing charged, its level stopped, the slice kept
  local out = {FinishCode.CORRUPT}
  for _, x in ipairs(stopped) do out[#out + 1] = x end
  return out
end
for _, record in ipairs(node_records) do
  local node = node_record(record)
  if covered and type(node.cost_usd) == 'number' then
    -- its cost is in the reclaim's record: the ledger equals the records (decoded and
    -- encoded again, as lease_return.lua writes the reclaim's: cjson keeps 14 digits)
    node.cost_usd = 0
    record = cjson.encode(node)
  end
  append_capped(nodes, node_cap, record)
  local keys = context_keys(levels, #part.p)
  count_call(keys, node)
  count_degraded(keys, levels[#levels].events, part.c, node)
end
for _, event in ipairs(events) do
  append_capped(levels[#levels].events, EVENT_STREAM_CAP, event)
end
if rec then
  if give_back == '1' then
    redis.call('HDEL', res, slice_id)
    redis.call('ZREM', leases, slice_id)
    redis.call('SREM', slices, slice_id)
    redis.call('ZADD', fin, now_ms(), returned)
  else
    rec.d, rec.b = rest, seq
    redis.call('HSET', res, slice_id, cjson.encode(rec))
  end
end
local out = {FinishCode.FINISHED}
for _, x in ipairs(stopped) do out[#out + 1] = x end
return out
