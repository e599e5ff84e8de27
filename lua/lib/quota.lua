-- quota.lua: quota grants in a tree's root hash (docs/quotas.md), shared by the scripts
-- that hold (reserve, lease_take) and finish (finish.lua: settle, release, lease_flush,
-- lease_return). Each function takes the key of the root hash it reads (the first level
-- of the path); returns: see each function.
-- needs: numbers
--
-- Quota grants (docs/quotas.md): a tree drawing from quotas keeps, in its root's hash,
-- q = the number of its buckets and per bucket i: q<i>:g the live grant's id ('' none:
-- calls are refused until one is taken; '-' the rule is gone), q<i>:end the Redis ms its
-- window ends (0 never), and per quota dimension d (usd, calls, tok = tin + tout)
-- q<i>:l:<d> granted (absent: not limited), q<i>:u:<d> spent, q<i>:h:<d> held. A call
-- holds its amounts there too; its record keeps the grant ids (rec.q), and its finish
-- counts only in grants still live (an ended grant was counted at used + held).
local QUOTA_DIMS = {'usd', 'calls', 'tok'}
local QUOTA_STRIDE = 11

-- The amounts of a call in quota dimensions, from get(dim) (0 when absent).
local function quota_amounts(get)
  return {usd = get('usd'), calls = get('steps'), tok = get('tin') + get('tout')}
end

-- Reads the grants of the root hash key (n buckets): nil and a refusal detail
-- ('<i> none|window|corrupt') when a call cannot draw now; else a state with left[d],
-- the least room over the buckets (nil: not limited) and short[d], the bucket giving it.
local function quota_state(key, n, now)
  local fields = {}
  for i = 1, n do
    local p = 'q' .. i .. ':'
    fields[#fields + 1] = p .. 'g'
    fields[#fields + 1] = p .. 'end'
    for _, d in ipairs(QUOTA_DIMS) do
      fields[#fields + 1] = p .. 'l:' .. d
      fields[#fields + 1] = p .. 'u:' .. d
      fields[#fields + 1] = p .. 'h:' .. d
    end
  end
  local v = redis.call('HMGET', key, unpack(fields))
  local st = {v = v, f = fields, n = n, gids = {}, left = {}, short = {}}
  for i = 1, n do
    local b = (i - 1) * QUOTA_STRIDE
    local g = v[b + 1]
    if not g or g == '' then return nil, i .. ' none' end
    st.gids[i] = g
    if g ~= '-' then
      local e = stored_num(v[b + 2])
      if e == false then return nil, i .. ' corrupt' end
      if e and e > 0 and now >= e then return nil, i .. ' window' end
      for j, d in ipairs(QUOTA_DIMS) do
        local at = b + 3 + (j - 1) * 3
        local l, u, h = stored_num(v[at]), stored_num(v[at + 1]), stored_num(v[at + 2])
        if l == false or u == false or h == false then return nil, i .. ' corrupt' end
        if l then
          local left = l - (u or 0) - (h or 0)
          if st.left[d] == nil or left < st.left[d] then st.left[d], st.short[d] = left, i end
        end
      end
    end
  end
  return st
end

-- The HSET pairs adding amt[d] to the holds of every live grant of st.
local function quota_holds(st, amt, set)
  for i = 1, st.n do
    local b = (i - 1) * QUOTA_STRIDE
    if st.gids[i] ~= '-' then
      for j, d in ipairs(QUOTA_DIMS) do
        local at = b + 3 + (j - 1) * 3
        if amt[d] > 0 then
          set[#set + 1] = st.f[at + 2]
          set[#set + 1] = (stored_num(st.v[at + 2]) or 0) + amt[d]
        end
      end
    end
  end
  return set
end

-- A finish in the root hash key: release rec's holds, add what was used, in the grants
-- that are still the ones it held (dheld, dused: finish's changes by dimension); the
-- HSET pairs are appended to set (the root's own).
local function quota_finish(key, rec, dheld, dused, set)
  local function get(t) return function(d) return t[d] or 0 end end
  local held, used = quota_amounts(get(dheld)), quota_amounts(get(dused))
  used.calls = used.calls + (dused.retries or 0)
  local n = #rec.q
  local fields = {}
  for i = 1, n do
    fields[#fields + 1] = 'q' .. i .. ':g'
    for _, d in ipairs(QUOTA_DIMS) do
      fields[#fields + 1] = 'q' .. i .. ':u:' .. d
      fields[#fields + 1] = 'q' .. i .. ':h:' .. d
    end
  end
  local v = redis.call('HMGET', key, unpack(fields))
  for i = 1, n do
    local b = (i - 1) * 7
    if v[b + 1] == rec.q[i] and rec.q[i] ~= '-' then
      for j, d in ipairs(QUOTA_DIMS) do
        local u, h = stored_num(v[b + 2 * j]), stored_num(v[b + 2 * j + 1])
        if u ~= false and h ~= false then
          if used[d] ~= 0 then
            set[#set + 1] = fields[b + 2 * j]
            set[#set + 1] = (u or 0) + used[d]
          end
          if held[d] ~= 0 then
            set[#set + 1] = fields[b + 2 * j + 1]
            set[#set + 1] = math.max(0, (h or 0) + held[d])
          end
        end
      end
    end
  end
end

