-- lease_take.lua: take a slice of budget for one process (lease mode), held at every
-- level of the path exactly like a reservation, or refuse it.
--
-- KEYS[1]     res  bc:{R}:res      hash  reservation id -> its record (the slice's record too)
-- KEYS[2]     leases  bc:{R}:leases   zset  reservation id by lease expiry (Redis ms)
-- KEYS[3]     slices  bc:{R}:slices   set   the slice ids of the tree now open
-- KEYS[4]     lessees  bc:{R}:lessees  zset  who asked for a slice lately (slice owner -> until
--             ms)
-- KEYS[5..]   levels{ctx}  per level of the path, root first, caller last: bc:{R}:ctx:<id> (hash)
-- ARGV[1]     slice_id  slice id (a reservation id starting with 'slice:')
-- ARGV[2]     lease_ms  lease length in ms (its expiry; renewed while the process lives)
-- ARGV[3]     path  path ids, comma-separated, root first (the levels in KEYS)
-- ARGV[4]     share_divisor  share divisor: a slice takes at most (what remains) / (divisor * n)
--             of a
--             limited dimension, n being the owners that asked for a slice lately (this
--             one included, granted or refused: a process refused counts, so that the
--             others' next slices leave it room)
-- ARGV[5]     owner  the slice owner (one per process and context)
-- ARGV[6]     owner_ms  how long an owner counts after asking, in ms
-- ARGV[7]     return_on_expiry  '1': at its expiry the slice gives back what was not flushed
--             (record
--             field r = 1, LeasePolicy.return_on_expiry); '0': that part is charged as
--             used (lease_return.lua)
-- ARGV[8]     below  the context's model ladder threshold in parts per million of a ceiling
--             (0: none): the reply says whether some level was below it
-- ARGV[9]     low_least  the least USD worth taking when some level is below it (a ladder
--             call's cheapest rung; 0: usd's least, as when none is)
-- ARGV[10..]  wants{dim, amount, least}  triples: dimension, amount wanted, least amount worth
--             taking (integers)
--
-- A level that is not running (or holds a corrupt number), past its deadline, or that cannot spare the least amount
-- of a dimension refuses the slice and changes nothing (the caller then takes a strict
-- reserve, which reports and records the stop). A token total limits tin + tout. A
-- level's final reserve (fr) is never taken: it is not part of the USD a slice may hold
-- (final calls spend it through strict reserves). low is 1 when, before the take, some
-- level had less than `below` of its USD ceiling left (limit - used - held), as
-- reserve.lua judges a ladder call: the slice then serves its ladder calls the cheapest
-- rung that fits, so such a slice need only cover that rung (low_least), while one taken
-- above the threshold must cover the requested model (usd's least).
-- The record is new_reservation's (lib/reservations.lua) with s = 1 (a slice); a lease expiry reclaims
-- it like any reservation (lease_return.lua: what was flushed stays charged, the rest is
-- charged as used, or given back with r = 1).
-- The root's quota grants (lib/quota.lua quota_state) cap the slice like a level's room,
-- and hold it too; a grant that cannot spare the least amount refuses the slice.
-- Returns {1, now_ms, low, ndims, dim, amount, ..., expired_id, expired_json, ...} when taken
--         (with up to 8 reservations of this tree whose lease expired, as reserve.lua);
--         {0, now_ms, reason} when refused.
--
-- uses: numbers, common, reservations, levels, quota

local now = now_ms()
local ids = split(path)
local divisor = tonumber(share_divisor)
local dims, want, least = {}, {}, {}
for _, w in ipairs(wants) do
  dims[#dims + 1] = w.dim
  want[#want + 1] = tonumber(w.amount)
  least[#least + 1] = tonumber(w.least)
end
local totals = token_totals(dims)
-- a token total limits the counters of both its directions: read those not asked for too
local read_dims, asked = {}, {}
for j, d in ipairs(dims) do read_dims[j], asked[d] = d, true end
for _, t in ipairs(totals) do
  for k = 2, 3 do
    if not asked[t[k]] then read_dims[#read_dims + 1], asked[t[k]] = t[k], true end
  end
end
-- the root's number of quota buckets (q) and the final reserve (fr) are read at every level
local shape = level_shape({'status', 'deadline', 'q', 'fr'}, read_dims, totals)
local low_ppm, low = tonumber(below), 0
local usd_low = tonumber(low_least)  -- usd's least once low (0: the same)
-- the least of dimension j: the smaller of usd's two while low is not known (any level)
local function least_of(j, known)
  if dims[j] ~= 'usd' or usd_low == 0 or (known and low == 0) then return least[j] end
  return math.min(least[j], usd_low)
end

redis.call('ZREMRANGEBYSCORE', lessees, '-inf', now)
redis.call('ZADD', lessees, now + tonumber(owner_ms), owner)
redis.call('PEXPIRE', lessees, tonumber(owner_ms))
local share = 1 / (divisor * redis.call('ZCARD', lessees))
local grant = {}
for j = 1, #dims do grant[j] = want[j] end
local read = {}
for lv = 1, #levels do
  local level = read_level(levels[lv], shape)
  if level.status ~= Status.RUNNING then return {TakeCode.REFUSED, now, 'not running'} end
  -- a corrupt field refuses the slice: the strict reserve that follows stops the level
  -- (state_corrupt, lib/finish.lua)
  if level.corrupt then return {TakeCode.REFUSED, now, 'corrupt ' .. level.corrupt_field} end
  local deadline = level.deadline
  if deadline > 0 and now >= deadline then return {TakeCode.REFUSED, now, 'deadline passed'} end
  for j, d in ipairs(dims) do
    local slot = shape.slot[d]
    local limit = level[slot.limit]
    if limit then
      local left = limit - level[slot.used] - level[slot.held]
      if d == 'usd' then
        if left * 1000000 < low_ppm * limit then low = 1 end
        left = left - level.fr
      end
      local cap = math.floor(left * share)
      if cap < grant[j] then grant[j] = cap end
      if left < least_of(j, false) then return {TakeCode.REFUSED, now, d .. ' too low'} end
    end
  end
  for i, t in ipairs(totals) do
    local limit = level[shape.total_slot[i]]
    if limit then
      local a, b = shape.slot[t[2]], shape.slot[t[3]]
      local left = limit - level[a.used] - level[a.held] - level[b.used] - level[b.held]
      local cap = math.floor(left * share / 2)
      for j, d in ipairs(dims) do
        if (d == t[2] or d == t[3]) and cap < grant[j] then grant[j] = cap end
      end
    end
  end
  read[lv] = level
end
local qst = nil
local nq = read[1].q
if nq > 0 then
  local why
  qst, why = quota_state(levels[1], nq, now)
  if not qst then return {TakeCode.REFUSED, now, 'quota ' .. why} end
  for _, d in ipairs(QUOTA_DIMS) do
    if qst.left[d] and qst.left[d] <= 0 then
      return {TakeCode.REFUSED, now, 'quota ' .. qst.short[d] .. ' used up'}
    end
  end
  local cap = {usd = qst.left.usd, steps = qst.left.calls}
  if qst.left.tok then cap.tin, cap.tout = math.floor(qst.left.tok / 2), math.floor(qst.left.tok / 2) end
  for j, d in ipairs(dims) do
    if cap[d] and cap[d] < grant[j] then grant[j] = cap[d] end
  end
end
for j = 1, #dims do
  if grant[j] < least_of(j, true) then
    return {TakeCode.REFUSED, now, dims[j] .. ' share too small'}
  end
end

-- Every level can spare it: hold the grant everywhere (one HSET per level).
local held = held_pairs(dims, grant)
for lv = 1, #levels do
  local set = {}
  for j, d in ipairs(dims) do
    if grant[j] > 0 then
      local slot = shape.slot[d]
      set[#set + 1] = slot.held_field
      set[#set + 1] = read[lv][slot.held] + grant[j]
    end
  end
  if lv == 1 and qst then
    local got = {}
    for j, d in ipairs(dims) do got[d] = grant[j] end
    quota_holds(qst, quota_amounts(function(d) return got[d] or 0 end), set)
  end
  if #set > 0 then redis.call('HSET', levels[lv], unpack(set)) end
end
local rec = new_reservation(ids, held, false)
rec.s = 1
if return_on_expiry == '1' then rec.r = 1 end
-- The root's quota grants (lib/quota.lua quota_state) cap the slice like a level's room,
-- and hold it too; a grant that cannot spare the least amount refuses the slice.
redis.call('HSET', res, slice_id, cjson.encode(rec))
redis.call('ZADD', leases, now + tonumber(lease_ms), slice_id)
redis.call('SADD', slices, slice_id)

local out = {TakeCode.TAKEN, now, low, #held / 2}
for _, x in ipairs(held) do out[#out + 1] = x end
return append_expired(out, res, leases, now)
