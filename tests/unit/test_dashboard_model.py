"""The dashboard's pure logic: burn rate and projection, samples, alert crossings,
filters, credentials."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from coordinator.dashboard.auth import Auth, LoginThrottle, hash_password
from coordinator.dashboard.model import (
    BURN_WINDOW_MS,
    AlertRule,
    burn_rate,
    crossings,
    next_samples,
    parse_scope,
    projection,
    row_from_hash,
)

MIN = 60_000


def test_burn_rate_is_the_spend_of_the_last_minute_never_extrapolated() -> None:
    # $0.30 spent by a tree 20 s old: $0.30 in the last minute, not $0.90 per minute
    assert burn_rate([], 20_000, 300_000, 0) == pytest.approx(0.30)
    # a tree that spent everything in its first second and nothing since burns nothing
    # once that second is more than a minute ago (it showed $7.52/min six minutes on)
    samples = [(1_000, 7_520_000), (11_000, 7_520_000), (300_000, 7_520_000)]
    assert burn_rate(samples, 6 * MIN, 7_520_000, 0) == 0.0


def test_burn_rate_uses_the_spend_at_the_window_start() -> None:
    now = 60 * MIN
    samples = [(now - 10 * MIN, 1_000_000), (now - 70_000, 2_000_000),
               (now - 30_000, 2_500_000)]
    # baseline: $2.00 (the last sample before the one-minute window, 70 s ago); now $3.00
    assert burn_rate(samples, now, 3_000_000, 0) == pytest.approx(1.00 / (70 / 60))
    # an idle tree burns nothing; an old tree without samples has no baseline yet
    assert burn_rate(samples, now, 2_000_000, 0) == 0.0
    assert burn_rate([], now, 3_000_000, 0) == 0.0
    # a first sample inside the window: the rate over a full window, not a shorter span
    assert burn_rate([(now - 5_000, 1_000_000)], now, 2_000_000, 0) == pytest.approx(1.0)


def test_only_a_running_tree_burns_and_its_age_counts_from_creation() -> None:
    h = {"id": "r", "status": "stopped", "reason": "aborted", "u:usd": "500000",
         "l:usd": "1000000", "created_ms": "1000", "stopped_ms": "2000"}
    row = row_from_hash(h, 104_000, rate=7.5)
    assert row is not None
    assert row.age_s == 103.0  # not the 1 s it ran before its stop
    assert (row.usd_per_min, row.minutes_to_ceiling) == (0.0, None)
    running = row_from_hash({**h, "status": "running"}, 104_000, rate=0.25)
    assert running is not None and running.usd_per_min == 0.25
    assert running.minutes_to_ceiling == pytest.approx(2.0)


def test_samples_are_kept_for_the_window_only_and_only_when_spend_moves() -> None:
    now = 60 * MIN
    old = [(now - 20 * MIN, 1), (now - 8 * MIN, 2), (now - 3 * MIN, 3)]
    assert next_samples(old, now, 4) == [(now - 3 * MIN, 3), (now, 4)]
    assert next_samples(old, now, 3) is None  # spend did not move: nothing to write
    assert next_samples([(now - 1000, 1)], now, 9) is None  # too soon after the last
    assert all(ms >= now - BURN_WINDOW_MS - 3 * MIN for ms, _ in next_samples(old, now, 4) or [])


def test_projection_to_the_ceiling() -> None:
    assert projection(0.5, 10_000_000, 4_000_000, 1_000_000).minutes_to_ceiling == 10
    assert projection(0.0, 10_000_000, 0, 0).minutes_to_ceiling is None
    assert projection(1.0, 0, 0, 0).minutes_to_ceiling is None  # no ceiling


def _row(used: int, limit: int, team: str = "a", age_ms: int = 2 * MIN) -> object:
    return row_from_hash({"id": "r", "status": "running", "u:usd": str(used),
                          "l:usd": str(limit), "created_ms": "1",
                          "meta": f'{{"team": "{team}"}}'}, age_ms, 2.0)


def test_crossings_of_fractions_and_burn_and_label_rules() -> None:
    rules = [AlertRule(), AlertRule(fractions=(0.3,), burn_usd_per_min=1.5,
                                    match={"team": "b"})]
    # one alert for a jump past several thresholds: the highest crossed
    got = crossings(_row(850_000, 1_000_000), "r", rules, 5)  # type: ignore[arg-type]
    assert [a.threshold for a in got] == ["fraction:0.8"]
    got = crossings(_row(1_000_000, 1_000_000, "b"), "r", rules, 5)  # type: ignore[arg-type]
    assert sorted(a.threshold for a in got) == ["burn:1.5", "fraction:1"]
    assert "100% of the $1.00 ceiling spent (threshold 100%)" in got[-1].message()
    assert crossings(_row(10, 0), "r", rules, 5) == []  # type: ignore[arg-type]
    # a tree younger than a minute does not alert on its (extrapolated) burn rate
    young = crossings(_row(10, 0, "b", age_ms=30_000), "r", rules, 5)  # type: ignore[arg-type]
    assert young == []


def test_filters() -> None:
    assert parse_scope("team=a=b") == ("team", "a=b")
    assert parse_scope("") is None
    for bad in ("team", "colour=red", "team="):
        with pytest.raises(ValueError, match="LABEL=VALUE"):
            parse_scope(bad)


def test_credentials() -> None:
    hashed = hash_password("s3cret")
    auth = Auth.parse(f"amy:operator:{hashed},bob:viewer@acme:pw:with:colons",
                      "operator:" + "t" * 20)
    amy = auth.login("amy", "s3cret")
    assert amy is not None and amy.operator and amy.tenant is None
    assert auth.login("amy", "wrong") is None and auth.login("nobody", "x") is None
    bob = auth.login("bob", "pw:with:colons")
    assert bob is not None and bob.role == "viewer" and bob.tenant == "acme"
    assert not bob.may_see("") and bob.may_see("acme")
    assert auth.bearer("Bearer " + "t" * 20) is not None
    assert auth.bearer("Bearer " + "t" * 19) is None and auth.bearer(None) is None
    for users, tokens in (("amy:admin:pw", ""), ("amy:operator", ""), ("", "operator:short")):
        with pytest.raises(ValueError):
            Auth.parse(users, tokens)
    assert not Auth.parse().configured


def test_the_wheel_ships_the_templates_and_static_files(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                    str(tmp_path), str(root)], check=True, capture_output=True)
    names = set(zipfile.ZipFile(next(tmp_path.glob("*.whl"))).namelist())
    package = root / "coordinator" / "dashboard"
    for folder in ("templates", "static"):
        for f in (package / folder).iterdir():
            assert f"coordinator/dashboard/{folder}/{f.name}" in names


def test_login_throttle() -> None:
    throttle = LoginThrottle(attempts=3, window_s=60)
    for t in (0.0, 1.0, 2.0):
        assert not throttle.locked("amy", t)
        throttle.failed("amy", t)
    assert throttle.locked("amy", 3.0) and not throttle.locked("bob", 3.0)
    assert not throttle.locked("amy", 61.0)  # the oldest failures left the window
    throttle.failed("amy", 61.0)
    throttle.succeeded("amy")
    assert not throttle.locked("amy", 62.0)
