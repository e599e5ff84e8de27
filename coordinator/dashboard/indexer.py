"""The indexer: a background thread that keeps the dashboard's sorted indexes, burn
rates and open-spend views up to date, and evaluates alerts. One dashboard process per
tenant holds the lease and does the work; the others only read."""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from ..core.keys import VIEW_SHARDS
from ..core.labels import labels_of
from ..store.dashboard_index import REFUSAL_REASONS, DashboardIndex, IndexEntry
from ..store.dashboard_reads import BACKEND_ERRORS
from ..store.dashboard_series import DashboardSeries
from ..store.views import TOTAL
from .alerts import Notifier, event_json
from .model import (
    Alert,
    AlertRule,
    burn_rate,
    crossings,
    next_samples,
    row_from_hash,
    scopes,
    sort_scores,
)

log = logging.getLogger("coordinator.dashboard.indexer")

CHUNK = 500
PROVIDER_EVERY = 6
"""Token counts by provider need each root's whole hash: read every sixth pass."""
NEW_ROOT_SLACK_MS = 60_000
"""Creation scores come from the creating process's clock: look back this far."""
POINT_EVERY_MS = 10_000
"""A tree's spend series gets at most one point per minute, rewritten at most this
often within the minute."""


class Indexer:
    """Maintains one tenant's indexes from a daemon thread (its Redis commands:
    store/dashboard_index.py)."""

    def __init__(self, views: DashboardIndex, *, rules: Sequence[AlertRule] = (),
                 notifier: Notifier | None = None, tick_s: float = 0.5,
                 sweep_s: float = 5.0, retention_s: int = 7 * 24 * 3600,
                 quota_alerts: Callable[[int], list[Alert]] | None = None,
                 approval_alerts: Callable[[], list[Alert]] | None = None) -> None:
        self.views = views
        self.quota_alerts = quota_alerts
        """The quota buckets' crossings at a Redis-ish time (quota_alerts.py), checked
        every sweep."""
        self.approval_alerts = approval_alerts
        """The trees waiting for approval now (approval_alerts.py), checked every sweep."""
        self.rules = list(rules)
        self.notifier = notifier
        self.tick_s = tick_s
        self.sweep_s = sweep_s
        self.retention_s = retention_s
        self.owner = secrets.token_hex(8)
        self.leading = False
        self.alerts_emitted = 0
        self.last_sweep_ms = 0
        self._dirty: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._written: dict[str, tuple[dict[str, float], list[str], dict[str, str]]] = {}
        """What this leader last wrote per root: scores, scopes, labels."""
        self._fired: set[tuple[str, str]] = set()
        self.series = DashboardSeries(views.client, views.ks)
        self._pointed: dict[str, tuple[int, int, int]] = {}
        """The last point this leader wrote per root: minute, micro-USD, when (ms)."""
        self._cursor = 0.0
        self._shield_cursor = 0
        self._passes = 0
        self.last_sweep_s = 0.0
        self._thread = threading.Thread(target=self._run, name="budget-dashboard-indexer",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self.leading:
            try:
                self.views.resign(self.owner)
            except BACKEND_ERRORS:
                pass

    def mark_dirty(self, root: str) -> None:
        """Re-read ``root`` at the next tick (a change was observed)."""
        with self._lock:
            self._dirty.add(root)

    # -- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        next_sweep = 0.0
        down = False
        while not self._stop.is_set():
            try:
                lead = self.views.lead(self.owner, int(max(10.0, 3 * self.sweep_s) * 1000))
                if lead and not self.leading:
                    self._written.clear()
                    self._fired.clear()
                    self._pointed.clear()
                    next_sweep = 0.0
                self.leading = lead
                if lead:
                    if time.monotonic() >= next_sweep:
                        started = time.monotonic()
                        self.sweep()
                        self.last_sweep_s = time.monotonic() - started
                        # a pass never takes more than a third of the indexer's time
                        next_sweep = time.monotonic() + max(self.sweep_s,
                                                            2 * self.last_sweep_s)
                    else:
                        self.tick()
                if down:
                    log.info("indexer: Redis answers again")
                    down = False
            except BACKEND_ERRORS as exc:
                if not down:  # once per outage, not every tick
                    log.warning("indexer: Redis unavailable (%s); retrying", exc)
                    down = True
                self.leading = False
            except Exception:  # the indexer must outlive a bad tree  # noqa: BLE001
                log.exception("indexer step failed")
            self._stop.wait(self.tick_s)

    def tick(self) -> None:
        """Index new trees and the trees marked dirty."""
        new = self.views.new_roots(self._cursor - NEW_ROOT_SLACK_MS, 1000)
        with self._lock:
            dirty, self._dirty = self._dirty, set()
        roots = dirty | {r for r, _ in new if r not in self._written}
        if new:
            self._cursor = max(self._cursor, max(s for _, s in new))
        fresh = [r for r in roots if r not in self._written]
        for i in range(0, len(roots), CHUNK):
            self.index(sorted(roots)[i:i + CHUNK])
        placed = [r for r in fresh if r in self._written]
        if placed:
            self.views.announce(placed)

    def sweep(self) -> None:
        """Re-read every open tree (in chunks), drop the closed ones from the indexes,
        rewrite the open-spend views and take one step of shield discovery."""
        names = ["org", "team", "service", "stops", "held", "near", "refused", TOTAL]
        if self._passes % PROVIDER_EVERY == 0:
            names.append("provider")
        self._passes += 1
        totals: dict[str, dict[str, float]] = {k: {} for k in names}
        seen: set[str] = set()
        for chunk in self._open_chunks():
            roots = [r for r, _ in chunk]
            seen.update(roots)
            self._cursor = max(self._cursor, max(s for _, s in chunk))
            fresh = [r for r in roots if r not in self._written]
            self.index(roots, totals)
            placed = [r for r in fresh if r in self._written]
            if placed:
                self.views.announce(placed)
        indexed = self.views.indexed()
        gone = {r: labels for r, labels in indexed.items() if r not in seen}
        if gone:
            self._close(gone)
        self.views.write_aggregates(totals, self.retention_s)
        self._shield_cursor = self.views.discover_shield(self._shield_cursor, 1000)
        self.last_sweep_ms = int(time.time() * 1000)
        if self.quota_alerts is not None:
            self._emit(self.quota_alerts(self.last_sweep_ms), stream=False)
        if self.approval_alerts is not None:
            self._emit([a for a in self.approval_alerts()
                        if (a.root, a.threshold) not in self._fired])

    def _open_chunks(self) -> Iterator[list[tuple[str, float]]]:
        """The library's open trees (root, creation ms), shard by shard, in batches of
        CHUNK across shards (a batch's writes cost one command per index key it touches,
        so fewer, fuller batches cost fewer)."""
        batch: list[tuple[str, float]] = []
        for shard in range(VIEW_SHARDS):
            start = 0
            while chunk := self.views.open_roots(shard, start, CHUNK):
                start += len(chunk)
                batch += chunk
                if len(batch) >= CHUNK:
                    yield batch[:CHUNK]
                    batch = batch[CHUNK:]
                if len(chunk) < CHUNK:
                    break
        if batch:
            yield batch

    # -- one batch -----------------------------------------------------------------------

    def index(self, roots: Sequence[str],
              totals: dict[str, dict[str, float]] | None = None) -> None:
        hashes, samples_json, labels_json, created, now = self.views.read_for_index(roots)
        entries, alerts, token_roots = [], [], []
        points: list[tuple[str, int, int]] = []
        for root, h, sj, lj, listed in zip(roots, hashes, samples_json, labels_json, created,
                                           strict=True):
            if not h.get("status"):
                continue  # expired or never opened: the sweep drops it
            samples = [(int(a), int(b)) for a, b in json.loads(sj)] if sj else []
            used = int(h.get("u:usd") or 0)
            # three significant digits: a young tree's rate moves at every pass, and
            # every move rewrites its place in the burn indexes
            rate = float(f"{burn_rate(samples, now, used, int(h.get('created_ms') or now)):.3g}")
            before = self._written.get(root)
            # a context's metadata never changes after its open: parse it once
            labels = before[2] if before is not None else labels_of(h.get("meta"))
            row = row_from_hash(h, now, rate, labels)
            assert row is not None
            old = before[1] if before is not None else scopes(json.loads(lj)) if lj else []
            new_samples = next_samples(samples, now, used)
            scores = sort_scores(row)
            if listed is not None:  # ranked as the open-tree shards rank it
                scores["age"] = listed
            new_scopes = scopes(labels)
            if before is None or before[1] != new_scopes:  # (re)index in every sort
                changed, moved = scores, True
            else:
                changed = {k: v for k, v in scores.items() if before[0].get(k) != v}
                moved = False
            if changed or new_samples is not None or moved:
                entries.append(IndexEntry(
                    root, changed, new_scopes, old, labels if moved else None,
                    rate if "burn" in changed else None, new_samples))
            self._written[root] = (scores, new_scopes, labels)
            if (point := self._point(root, now, used)) is not None:
                points.append(point)
            alerts += [a for a in crossings(row, root, self.rules, now)
                       if (a.root, a.threshold) not in self._fired]
            if totals is not None:
                for label in ("org", "team", "service"):
                    if label in labels:
                        bucket = totals[label]
                        bucket[labels[label]] = bucket.get(labels[label], 0) + used
                whole = totals[TOTAL]
                whole["all"] = whole.get("all", 0) + used
                if not {"org", "team", "service"} & set(labels):
                    whole["unlabelled"] = whole.get("unlabelled", 0) + used
                if row.status == "stopped" and row.reason:
                    totals["stops"][row.reason] = totals["stops"].get(row.reason, 0) + 1
                totals["held"]["usd"] = totals["held"].get("usd", 0) + int(h.get("h:usd") or 0)
                _count_near_and_refused(h, used, totals)
                if int(h.get("u:tin") or 0) + int(h.get("u:tout") or 0):
                    token_roots.append(root)
        if entries:
            self.views.write_index(entries)
        if points:
            self.series.write(points, self.retention_s)
        if alerts:
            self._emit(alerts)
        if totals is not None and token_roots and "provider" in totals:
            for h in self.views.full_hashes(token_roots):
                for provider, count in _provider_tokens(h).items():
                    totals["provider"][provider] = totals["provider"].get(provider, 0) + count

    def _point(self, root: str, now: int, used: int) -> tuple[str, int, int] | None:
        """The spend series point to write for ``root`` (None: nothing new): its first,
        then one when spend moved, at most every POINT_EVERY_MS within a minute."""
        minute, last = now // 60_000, self._pointed.get(root)
        if last is not None and (used == last[1] or (
                minute == last[0] and now - last[2] < POINT_EVERY_MS)):
            return None
        self._pointed[root] = (minute, used, now)
        return root, minute, used

    def _close(self, gone: dict[str, str]) -> None:
        """Trees that left the open index: count their provider tokens into the day's
        closed view, alert on their final state, and unindex them."""
        roots = list(gone)
        day = time.strftime("%Y-%m-%d", time.gmtime())
        by_provider: dict[str, int] = {}
        for i in range(0, len(roots), CHUNK):
            part = roots[i:i + CHUNK]
            hashes = self.views.full_hashes(part)
            alerts = []
            for root, h in zip(part, hashes, strict=True):
                for provider, count in _provider_tokens(h).items():
                    by_provider[provider] = by_provider.get(provider, 0) + count
                now = int(time.time() * 1000)
                row = row_from_hash(h, now)
                if row is not None:
                    alerts += [a for a in crossings(row, root, self.rules, now)
                               if (a.root, a.threshold) not in self._fired]
            if alerts:
                self._emit(alerts)
        if by_provider:
            self.views.add_closed_provider(day, by_provider, self.retention_s)
        self.views.unindex({r: scopes(json.loads(lj) if lj else {}) for r, lj in gone.items()})
        for root in roots:
            self._written.pop(root, None)
            self._pointed.pop(root, None)
            self._fired = {f for f in self._fired if f[0] != root}

    def _emit(self, alerts: list[Alert], *, stream: bool = True) -> None:
        """Claim each alert's dedup key; emit the ones this process claimed (a quota's
        alert, ``stream=False``, has no context's event list: published only)."""
        claimed = self.views.claim_alerts([(a.root, a.threshold) for a in alerts],
                                          self.retention_s)
        for alert, mine in zip(alerts, claimed, strict=True):
            self._fired.add((alert.root, alert.threshold))
            if not mine:
                continue
            if stream:
                self.views.emit_alert(alert.root, alert.context, event_json(alert),
                                      json.dumps(alert.as_json()))
            else:
                self.views.publish_alert(json.dumps(alert.as_json()))
            self.alerts_emitted += 1
            if self.notifier is not None:
                self.notifier.send(alert)


NEAR_BANDS = (50, 80, 100)
"""Percents of a root's USD ceiling: a tree counts in every band its spend reached
(cumulative), as the built-in alerts' fractions 0.5, 0.8 and 1.0."""


def _count_near_and_refused(h: dict[str, str], used: int,
                            totals: dict[str, dict[str, float]]) -> None:
    """Add a root to the ``near`` bands its settled spend reached of its USD ceiling (none
    without one) and its own refused calls (``nr:<reason>``, counted on the context the
    call was made at: the root's own calls only) to ``refused``."""
    ceiling = int(h.get("l:usd") or 0)
    for band in NEAR_BANDS:
        if ceiling and used * 100 >= ceiling * band:
            totals["near"][str(band)] = totals["near"].get(str(band), 0) + 1
    for reason in REFUSAL_REASONS:
        n = h.get(f"nr:{reason}") or ""
        if n.isdigit() and int(n):
            totals["refused"][reason] = totals["refused"].get(reason, 0) + int(n)


def _provider_tokens(h: dict[str, str]) -> dict[str, int]:
    """``provider.direction`` -> tokens, from a context hash's ``u:<provider>.tin/tout``."""
    out = {}
    for field, value in h.items():
        if field.startswith("u:") and "." in field and field.endswith(("tin", "tout")):
            provider, _, direction = field[2:].rpartition(".")
            out[f"{provider}.{'input' if direction == 'tin' else 'output'}"] = int(value)
    return out
