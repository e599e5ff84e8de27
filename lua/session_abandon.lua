-- session_abandon.lua: give up a creation claim (the sandbox could not be made).
-- KEYS[1] claims  the tenant's zset of creation claims
-- KEYS[2] claimers  the tenant's hash of claim ids
-- ARGV[1] member  member
-- ARGV[2] claim_id  claim id
-- Returns 1 when the caller's claim was dropped, 0 when it was not the caller's.
--
-- uses: (none)

if redis.call('HGET', claimers, member) ~= claim_id then
  return 0
end
redis.call('ZREM', claims, member)
redis.call('HDEL', claimers, member)
return 1
