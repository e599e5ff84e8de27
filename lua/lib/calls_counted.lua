-- calls_counted.lua: a finished call counted from the facts of its node record on the
-- context hashes of its path (count_call, or finish's call_count_field and count_own;
-- context_keys) and in the tree's spend by model (count_model); how a keyed call is
-- remembered for its replays (remembered).
-- needs: records

-- What is counted of a call, from its decoded node record (node_record): status and
-- stop_reason (each '' unless a non-empty string), unreported (true only when the record
-- says true) and model, '<provider>|<model>' ('-' for a part not named; '' when neither
-- is). settle.lua and release.lua get these from Python in their ARGV (store/tree.py
-- node_facts) and never decode the record.
local function node_facts(node)
  local provider, model = text_field(node, 'provider'), text_field(node, 'model')
  return {status = text_field(node, 'status') or '',
          stop_reason = text_field(node, 'stop_reason') or '',
          unreported = node.unreported == true,
          model = (provider or model) and (provider or '-') .. '|' .. (model or '-') or ''}
end

-- The field a call is counted in at every level of its path (subtree included), from its
-- facts (node_facts): n:<outcome>, outcome being ok, error, interrupted (aborted,
-- timeout, lost) or halted (CALL_COUNTS, from the prelude, maps a status to its
-- outcome); nil for a call with a stop_reason (refused before it ran, counted on its own
-- context only: count_own) or a status counted in no class.
local function call_count_field(facts)
  if facts.stop_reason ~= '' then return nil end
  local outcome = CALL_COUNTS[facts.status]
  return outcome and 'n:' .. outcome or nil
end

-- Counts a call on its own context (key own) only: for a call with a stop_reason,
-- n:refused, nr:<reason> and nr_last = reason; else n:unreported for a call charged the
-- floor for reporting nothing. Fields are written only when a call counts (absent means
-- 0). A count that is not an integer (corrupt state) stays as it is: pcall, never a
-- script error after the charge was written.
local function count_own(own, facts)
  local reason = facts.stop_reason
  if reason ~= '' then
    redis.pcall('HINCRBY', own, 'n:' .. CallCount.REFUSED, 1)
    redis.pcall('HINCRBY', own, 'nr:' .. reason, 1)
    redis.call('HSET', own, 'nr_last', reason)
  elseif facts.unreported then
    redis.pcall('HINCRBY', own, 'n:unreported', 1)
  end
end

-- Counts a call from its decoded node record on the context hashes of its path, root
-- first (keys): call_count_field at every level, then count_own on its own context (the
-- last). A count that is not an integer stays as it is (pcall), as in count_own.
local function count_call(keys, node)
  local facts = node_facts(node)
  local field = call_count_field(facts)
  if field then
    for _, key in ipairs(keys) do redis.pcall('HINCRBY', key, field, 1) end
  end
  count_own(keys[#keys], facts)
end

-- The context hash keys of the first n levels (groups of ctx, events keys).
local function context_keys(levels, n)
  local keys = {}
  for lv = 1, n do keys[lv] = levels[lv].ctx end
  return keys
end

-- Adds a call's micro-USD (its 'usd' amount; amounts: groups of dim, amount) to the
-- tree's spend by model (key), field facts.model (node_facts); a call naming neither
-- provider nor model adds nothing (the close counts what no field holds as 'unknown'). A
-- corrupt field stays as it is (pcall: never a script error after the charge was
-- written).
local function count_model(key, facts, amounts)
  local usd = 0
  for _, a in ipairs(amounts) do
    if a.dim == 'usd' then usd = tonumber(a.amount) end
  end
  if usd > 0 and facts.model ~= '' then
    redis.pcall('HINCRBY', key, facts.model, usd)
  end
end

-- How a keyed call is remembered for its replays: a step that ended without returning
-- (it raised an error that is not retryable, hit a limit or was cancelled: a status of
-- ENDED_WITHOUT_RETURN, from the prelude) as halted, so a replay does not go on as if it
-- had returned. A reaped one (lost: its worker died) stays ok: the replay goes on without
-- running it again. facts: node_facts.
local function remembered(outcome, facts)
  if outcome == FinishOutcome.OK and ENDED_WITHOUT_RETURN[facts.status] then
    return FinishOutcome.HALTED
  end
  return outcome
end
