-- reservations.lua: the reservation record (new_reservation, held_pairs) and the expired
-- leases a holding script hands back for settling (append_expired).
-- needs: (none)

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
