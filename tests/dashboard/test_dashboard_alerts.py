"""Alerts: each threshold crossing is emitted once per (context, threshold), however
many dashboards watch, as an event on the tree's stream, on pub/sub and to webhooks
(HMAC-signed, retried with backoff, Slack-compatible on request)."""

from __future__ import annotations

import json
import multiprocessing
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis

from coordinator import ExecutionContext
from coordinator.dashboard.alerts import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Notifier,
    Webhook,
    sign,
)
from coordinator.dashboard.model import Alert
from tests.support.dashboard_server import (
    WebhookReceiver,
    coordinator,
    dashboard,
    open_tree,
    spend_steps,
)
from tests.support.waiting import until

pytest.importorskip("starlette")
SECRET = "hook-secret-0123456789"


def test_alerts_at_80_and_100_percent_reach_the_webhook_once_each(redis_url: str) -> None:
    coord = coordinator(redis_url)
    root = open_tree(coord, "alerting-run", ceiling=1.0, team="research")
    token = root.token
    coord.store.flush()
    listener = redis.Redis.from_url(redis_url, decode_responses=True)
    pubsub = listener.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe("bc:dash:alerts")
    env = {"BUDGET_ALERT_WEBHOOKS": "", "BUDGET_ALERT_WEBHOOK_SECRET": SECRET,
           "BUDGET_ALERT_FRACTIONS": "0.8,1"}
    with WebhookReceiver() as hook:
        env["BUDGET_ALERT_WEBHOOKS"] = hook.url
        # two dashboards watch the same Redis: the dedup in Redis sends each alert once
        with dashboard(redis_url, env=env), dashboard(redis_url, env=env):
            proc = multiprocessing.get_context("spawn").Process(
                target=spend_steps, args=(redis_url, token, [0.5, 0.35, 0.15], 1.5))
            proc.start()
            proc.join(120)  # room for a process start on a loaded CI machine
            assert proc.exitcode == 0
            until(lambda: len(hook.received) >= 2, "both alerts delivered", 120)
            time.sleep(3)  # three more indexer passes: no repeat may arrive
        received = list(hook.received)
    thresholds = []
    for headers, body in received:
        stamp = headers[TIMESTAMP_HEADER]
        assert headers[SIGNATURE_HEADER] == sign(SECRET, stamp, body)
        payload = json.loads(body)
        assert payload["type"] == "budget_alert" and payload["root"] == "alerting-run"
        assert payload["labels"]["team"] == "research"
        thresholds.append(payload["threshold"])
    assert sorted(thresholds) == ["fraction:0.8", "fraction:1"]
    snap = ExecutionContext.load_snapshot("alerting-run", coord)
    assert snap.status == "stopped" and snap.abort_reason == "budget_exceeded"
    on_stream = sorted(e.metadata["threshold"] for e in snap.events
                       if e.event_type == "budget_alert")
    assert on_stream == ["fraction:0.8", "fraction:1"]
    published = []
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:  # (the first read is the subscription's reply)
        msg = pubsub.get_message(timeout=0.1)
        if msg is not None:
            published.append(json.loads(msg["data"])["threshold"])
    assert sorted(published) == ["fraction:0.8", "fraction:1"]
    pubsub.close()
    listener.close()
    root.close()
    coord.close()


class _Flaky:
    """A webhook endpoint that answers 503 to the first ``fail`` POSTs."""

    def __init__(self, fail: int) -> None:
        self.bodies: list[bytes] = []
        self.attempts: list[float] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.attempts.append(time.monotonic())
                ok = len(outer.attempts) > fail
                if ok:
                    outer.bodies.append(body)
                self.send_response(200 if ok else 503)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"


def _alert() -> Alert:
    return Alert(root="r1", context="r1", threshold="fraction:0.8", value=0.83,
                 labels={"team": "<b>ops</b>"}, spend_usd=0.83, ceiling_usd=1.0, ts_ms=1)


def test_webhook_is_retried_with_backoff_and_slack_payload() -> None:
    import threading

    flaky = _Flaky(fail=2)
    thread = threading.Thread(target=flaky.server.serve_forever, daemon=True)
    thread.start()
    notifier = Notifier([Webhook(flaky.url, slack=True)], delays=(0.2, 0.4, 0.8))
    started = time.monotonic()
    notifier.send(_alert())  # returns at once: delivery happens on the notifier's thread
    assert time.monotonic() - started < 0.05
    deadline = time.monotonic() + 10
    while notifier.sent < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    notifier.close()
    flaky.server.shutdown()
    flaky.server.server_close()
    assert notifier.sent == 1 and notifier.failed == 0
    assert len(flaky.attempts) == 3
    gaps = [b - a for a, b in zip(flaky.attempts, flaky.attempts[1:], strict=False)]
    assert gaps[0] >= 0.18 and gaps[1] >= 0.38  # backoff grows
    assert json.loads(flaky.bodies[0]) == {
        "text": "budget team=<b>ops</b>: 83% of the $1.00 ceiling spent (threshold 80%)"}


def test_webhook_gives_up_after_its_retries() -> None:
    import threading

    flaky = _Flaky(fail=100)
    thread = threading.Thread(target=flaky.server.serve_forever, daemon=True)
    thread.start()
    notifier = Notifier([Webhook(flaky.url, secret=SECRET)], delays=(0.05, 0.05))
    notifier.send(_alert())
    deadline = time.monotonic() + 10
    while notifier.failed < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    notifier.close()
    flaky.server.shutdown()
    flaky.server.server_close()
    assert (notifier.sent, notifier.failed, len(flaky.attempts)) == (0, 1, 3)


def test_an_alerts_process_without_the_web_part(redis_url: str) -> None:
    """``python -m coordinator.dashboard alerts``: the indexer and its alerts alone."""
    import os
    import signal
    import subprocess
    import sys

    coord = coordinator(redis_url)
    root = open_tree(coord, "headless-run", ceiling=2.0)
    coord.store.flush()
    with WebhookReceiver() as hook:
        env = dict(os.environ, BUDGET_ALERT_WEBHOOKS=hook.url, BUDGET_ALERT_FRACTIONS="0.5",
                   BUDGET_DASHBOARD_SWEEP_S="1")
        proc = subprocess.Popen([sys.executable, "-m", "coordinator.dashboard", "alerts",
                                 "--redis", redis_url], env=env)
        try:
            from tests.support.dashboard_server import spend

            spend(root, 1.2, tokens=10, provider="openai")  # 60 %: published, seen at once
            coord.store.flush()
            # the alert arrives once the process has started (before that, SIGINT would
            # interrupt its imports)
            until(lambda: hook.received, "the alert delivered", 120)
            time.sleep(2)
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(10) == 0
        assert [json.loads(b)["threshold"] for _, b in hook.received] == ["fraction:0.5"]
    root.close()
    coord.close()
