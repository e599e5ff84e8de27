"""Alert delivery: webhooks (JSON POST, HMAC-SHA256 signed, Slack-compatible on request)
sent from a background thread with retries and backoff, so that nobody waits on them."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.redaction import redact_url
from ..errors import InvalidConfigError
from .model import Alert, AlertRule

log = logging.getLogger("coordinator.dashboard.alerts")

SIGNATURE_HEADER = "X-Budget-Signature"
"""``sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`` with the webhook's secret."""
TIMESTAMP_HEADER = "X-Budget-Timestamp"
RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0)


@dataclass(frozen=True)
class Webhook:
    """Where alerts are POSTed."""

    url: str
    secret: str = ""
    """Signs each body (header X-Budget-Signature); empty: unsigned."""
    slack: bool = False
    """Send ``{"text": ...}`` (a Slack incoming-webhook payload) instead of the alert JSON."""


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The signature header value of a body sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def payload(hook: Webhook, alert: Alert) -> bytes:
    if hook.slack:
        return json.dumps({"text": alert.message()}).encode()
    return json.dumps({"type": _type(alert), **alert.as_json()}).encode()


def _type(alert: Alert) -> str:
    """``approval_needed`` for a tree waiting for approval, else ``budget_alert``."""
    return "approval_needed" if alert.kind == "approval_needed" else "budget_alert"


def event_json(alert: Alert) -> str:
    """The alert as a SafetyEvent (JSON) for the context's event list."""
    return json.dumps({"event_type": _type(alert), "decision": "ALLOW",
                       "reason": alert.message(), "hook": "dashboard", "request_id": None,
                       "ts": alert.ts_ms,
                       "metadata": {**alert.as_json(), "chain_id": alert.context}})


class Notifier:
    """Sends alerts to webhooks from one daemon thread. ``send`` never blocks: a full
    queue drops the alert with a warning (the event list and pub/sub still have it)."""

    def __init__(self, hooks: Sequence[Webhook], *, timeout_s: float = 5.0,
                 delays: Sequence[float] = RETRY_DELAYS_S,
                 post: Callable[[str, bytes, dict[str, str], float], int] | None = None
                 ) -> None:
        self.hooks = list(hooks)
        self.sent = 0
        self.failed = 0
        self._timeout = timeout_s
        self._delays = tuple(delays)
        self._post = post or _post
        self._queue: queue.Queue[tuple[float, int, Webhook, Alert] | None] = queue.Queue(10_000)
        self._thread = threading.Thread(target=self._run, name="budget-webhooks", daemon=True)
        self._thread.start()

    def send(self, alert: Alert) -> None:
        for hook in self.hooks:
            try:
                self._queue.put_nowait((0.0, 0, hook, alert))
            except queue.Full:
                log.warning("webhook queue full: alert %s dropped", alert.threshold)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        waiting: list[tuple[float, int, Webhook, Alert]] = []
        while True:
            now = time.monotonic()
            due = [w for w in waiting if w[0] <= now]
            waiting = [w for w in waiting if w[0] > now]
            for item in due:
                self._attempt(item, waiting)
            timeout = min((w[0] for w in waiting), default=now + 0.5) - time.monotonic()
            try:
                got = self._queue.get(timeout=max(0.01, timeout))
            except queue.Empty:
                continue
            if got is None:
                return
            self._attempt(got, waiting)

    def _attempt(self, item: tuple[float, int, Webhook, Alert],
                 waiting: list[tuple[float, int, Webhook, Alert]]) -> None:
        _, attempt, hook, alert = item
        body = payload(hook, alert)
        stamp = str(int(time.time()))
        headers = {"Content-Type": "application/json", TIMESTAMP_HEADER: stamp}
        if hook.secret:
            headers[SIGNATURE_HEADER] = sign(hook.secret, stamp, body)
        try:
            status = self._post(hook.url, body, headers, self._timeout)
        except OSError as exc:  # refused, timed out, DNS: all worth a retry
            status, error = 0, str(exc)
        else:
            error = f"HTTP {status}"
        if 200 <= status < 300:
            self.sent += 1
            return
        if attempt < len(self._delays) and (status == 0 or status == 429 or status >= 500):
            waiting.append((time.monotonic() + self._delays[attempt], attempt + 1, hook, alert))
            return
        self.failed += 1
        log.warning("webhook %s gave up on alert %s/%s: %s", redact_url(hook.url), alert.root,
                    alert.threshold, error)


def _post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> int:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - configured URL
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def rules_from_env(env: dict[str, str] | None = None) -> list[AlertRule]:
    """``BUDGET_ALERT_FRACTIONS=0.5,0.8,1`` (default) and ``BUDGET_ALERT_BURN_USD_PER_MIN``;
    ``BUDGET_ALERT_RULES`` (JSON list of {"fractions", "burn_usd_per_min", "match"}) adds
    rules for labelled roots."""
    env = dict(os.environ if env is None else env)
    given = env.get("BUDGET_ALERT_FRACTIONS", "0.5,0.8,1")
    fractions = _setting("BUDGET_ALERT_FRACTIONS", given, lambda: AlertRule(fractions=tuple(
        float(x) for x in given.split(",") if x.strip())).fractions)
    burn = env.get("BUDGET_ALERT_BURN_USD_PER_MIN")
    rules = [AlertRule(fractions=fractions, burn_usd_per_min=_setting(
        "BUDGET_ALERT_BURN_USD_PER_MIN", burn, lambda: AlertRule(
            burn_usd_per_min=float(burn) if burn else None).burn_usd_per_min))]
    specs = env.get("BUDGET_ALERT_RULES") or "[]"
    rules += _setting("BUDGET_ALERT_RULES", specs,
                      lambda: [_rule(spec) for spec in json.loads(specs)])
    return rules


def _setting(name: str, given: object, build: Callable[[], Any]) -> Any:
    """``build()``, a bad value in it raised as InvalidConfigError naming ``name``."""
    try:
        return build()
    except (ValueError, TypeError, OverflowError) as exc:
        why = ("; ".join(str(p["msg"]) for p in exc.problems)
               if isinstance(exc, InvalidConfigError) else str(exc))
        raise InvalidConfigError("alert setting", [{"loc": (name,), "msg": why,
                                                    "input": given}]) from None


def _rule(spec: Any) -> AlertRule:
    if not isinstance(spec, dict):
        raise ValueError(f"an alert rule must be a JSON object; got {spec!r}")
    burn = spec.get("burn_usd_per_min")
    return AlertRule(fractions=tuple(float(f) for f in spec.get("fractions", ())),
                     burn_usd_per_min=float(burn) if burn is not None else None,
                     match={str(k): str(v) for k, v in (spec.get("match") or {}).items()})


def webhooks_from_env(env: dict[str, str] | None = None) -> list[Webhook]:
    """``BUDGET_ALERT_WEBHOOKS``: comma-separated URLs, each optionally prefixed
    ``slack+``; ``BUDGET_ALERT_WEBHOOK_SECRET`` signs them all."""
    env = dict(os.environ if env is None else env)
    secret = env.get("BUDGET_ALERT_WEBHOOK_SECRET", "")
    hooks = []
    for url in (env.get("BUDGET_ALERT_WEBHOOKS") or "").split(","):
        url = url.strip()
        if url:
            slack = url.startswith("slack+")
            hooks.append(Webhook(url[6:] if slack else url, secret, slack))
    return hooks
