-- append.lua: append one entry to a context's capped list (a SafetyEvent a process
-- records without a stop or a count: lib/common.lua append_capped).
--
-- KEYS[1]  events  bc:{R}:events:<id>  list  the context's SafetyEvents
-- ARGV[1]  cap  the list's cap (EVENT_STREAM_CAP)
-- ARGV[2]  entry  the entry (SafetyEvent JSON)
--
-- Returns 1.
--
-- uses: common

append_capped(events, cap, entry)
return 1
