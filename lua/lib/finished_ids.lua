-- finished_ids.lua: the finished reservation ids that make a finish idempotent
-- (trim_finished, its bounds), and the path of a finish whose reservation is not here
-- (path_from_levels).
-- needs: (none)

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

-- Trims the finished ids: older than the keep time, and past the floor beyond the cap.
local function trim_finished(finished, now)
  redis.call('ZREMRANGEBYSCORE', finished, '-inf', now - FINISHED_KEEP_MS)
  local over = redis.call('ZCARD', finished) - FINISHED_CAP
  if over > 0 then
    local edge = tonumber(redis.call('ZRANGE', finished, over - 1, over - 1, 'WITHSCORES')[2])
    redis.call('ZREMRANGEBYSCORE', finished, '-inf', math.min(edge, now - FINISHED_FLOOR_MS))
  end
end
