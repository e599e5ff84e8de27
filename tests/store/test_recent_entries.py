"""The newest node records and events across a tree's per-context lists (the tree page),
and the time read from an entry (gc's last activity)."""

from __future__ import annotations

import json

import redis

from coordinator.store.recent_entries import entry_ms, newest_entries


def test_entry_ms_reads_each_time_format_the_project_writes() -> None:
    assert entry_ms(json.dumps({"ts": 1795713154703})) == 1795713154703  # a script's ms
    assert entry_ms(json.dumps({"ts": "2026-11-26T17:00:00.250000Z"})) == 1795712400250
    assert entry_ms(json.dumps({"start_ts": 1795713150.25, "end_ts": 1795713151.5})) == (
        1795713151500)  # a node record: its end, in seconds
    assert entry_ms(json.dumps({"start_ts": 1795713150.25, "end_ts": None})) == 1795713150250
    for junk in ("", "not json", "[1, 2]", json.dumps({"ts": "yesterday"}), "{}"):
        assert entry_ms(junk) == 0


def test_newest_entries_merges_lists_by_time_newest_first(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    lists = {"a": [100, 400, 700], "b": [200, 500], "c": [300], "d": []}
    for owner, times in lists.items():
        for t in times:
            client.rpush(f"recent:{owner}", json.dumps({"ts": t * 10**10, "o": owner}))
    keys = [(owner, f"recent:{owner}") for owner in lists]

    got = newest_entries(client, keys, 4)
    assert [(o, json.loads(e)["ts"] // 10**10) for o, e in got] == [
        ("a", 700), ("b", 500), ("a", 400), ("c", 300)]
    assert len(newest_entries(client, keys, 100)) == 6
    assert newest_entries(client, keys, 0) == [] and newest_entries(client, [], 5) == []
