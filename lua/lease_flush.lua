-- lease_flush.lua: write behind what the calls served from a slice spent (one batch), and
-- with the last flush return what the slice did not use.
--
-- KEYS[1]     bc:{R}:res      hash  open reservations (the slice's record)
-- KEYS[2]     bc:{R}:leases   zset  reservation leases
-- KEYS[3]     bc:{R}:nodes:<c> stream node records of the slice's context
-- KEYS[4]     bc:{R}:ledger   stream TokenLedgerUpdated events of the tree
-- KEYS[5..]   per level of the slice's path, root first, two keys:
--             bc:{R}:ctx:<id> (hash) and bc:{R}:events:<id> (stream of SafetyEvents)
-- KEYS[last]  bc:{R}:slices   set   the slice ids of the tree now open
-- ARGV[1]     slice id
-- ARGV[2]     abort channel (pub/sub, not a key)
-- ARGV[3]     ledger channel (pub/sub, not a key)
-- ARGV[4]     node stream cap (approximate MAXLEN)
-- ARGV[5]     '1': return the rest of the slice (its record goes); '0': keep it
-- ARGV[6]     path ids, comma-separated, root first (the levels in KEYS)
-- ARGV[7]     batch number (increasing per slice: a batch already applied is skipped)
-- ARGV[8]     n, the number of node records; ARGV[9] m, the number of events
-- ARGV[10..]  n node records (JSON), then m SafetyEvents (JSON) of the slice's context
-- ARGV[rest]  pairs: dimension, amount spent by the batch (integers >= 0; 'steps' counts
--             the calls that completed, 'retries' those that failed)
--
-- The batch is charged at every level (lib.lua finish: ceilings reached stop their level
-- and broadcast the stop); the slice's holds shrink by what the batch consumed of them.
-- A slice already reclaimed (its process was thought dead) is charged all the same, with
-- no hold to shrink.
-- Returns {1, level, reason, detail, ...} with the levels this flush stopped; {0} when
-- the batch was already applied; {3, level, 'state_corrupt', detail} when a counter on
-- the path is corrupt (lib.lua finish): nothing was charged, the slice stays held.

local n, m = tonumber(ARGV[8]), tonumber(ARGV[9])
local actual = {}
for i = 10 + n + m, #ARGV do actual[#actual + 1] = ARGV[i] end
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local rec, seq = nil, tonumber(ARGV[7])
if raw then
  rec = cjson.decode(raw)
  if (rec.b or 0) >= seq then
    if ARGV[5] ~= '1' then return {0} end
    actual = {}  -- only the return is left to do
  end
end
local part = {p = split(ARGV[6]), d = {}}
part.c = part.p[#part.p]
local rest = {}
if rec then
  local spent = {}
  for i = 1, #actual, 2 do spent[actual[i]] = (spent[actual[i]] or 0) + tonumber(actual[i + 1]) end
  for i = 1, #rec.d, 2 do
    local dim, held = rec.d[i], tonumber(rec.d[i + 1])
    local used = math.min(held, spent[dim] or 0)
    if ARGV[5] == '1' then used = held end
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
local ok, stopped = finish(part, 5, actual, false, false, ARGV[2], now_ms(), KEYS[4],
                          ARGV[3])
if not ok then  -- a corrupt counter: nothing charged, its level stopped, the slice kept
  local out = {3}
  for _, x in ipairs(stopped) do out[#out + 1] = x end
  return out
end
local nodes_key, events_key = KEYS[3], KEYS[#KEYS - 1]
for i = 10, 9 + n do
  redis.call('XADD', nodes_key, 'MAXLEN', '~', ARGV[4], '*', 'n', ARGV[i])
end
for i = 10 + n, 9 + n + m do
  redis.call('XADD', events_key, 'MAXLEN', '~', EVENT_STREAM_CAP, '*', 'e', ARGV[i])
end
if rec then
  if ARGV[5] == '1' then
    redis.call('HDEL', KEYS[1], ARGV[1])
    redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('SREM', KEYS[#KEYS], ARGV[1])
  else
    rec.d, rec.b = rest, seq
    redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(rec))
  end
end
local out = {1}
for _, x in ipairs(stopped) do out[#out + 1] = x end
return out
