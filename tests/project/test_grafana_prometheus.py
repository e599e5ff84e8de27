"""deploy/grafana/budget-coordinator.json and deploy/prometheus/alerts.yml against what is
really exported: every metric and label their PromQL names is scraped, with samples, from
the dashboard's /metrics (``python -m coordinator.dashboard`` on a real Redis after real
calls, a refusal, a tree waiting for approval, a quota bucket and an open breaker) or
from the ledger exporter (``coordinator.metrics`` over HTTP, as docs/tokens.md runs it).
With promtool installed, the rules load, fire as deploy/prometheus/alerts_test.yml
expects, and every panel's expression parses."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml  # type: ignore[import-untyped]
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from coordinator import CircuitBreaker, Decision
from coordinator.core.vocabulary import StopReason
from coordinator.embedded import RedisServer, free_port
from coordinator.metrics import PrometheusLedgerObserver, subscribe_ledger
from coordinator.quotas import QuotaRule, Quotas

pytest.importorskip("starlette")

from tests.support.dashboard_server import (  # noqa: E402
    VIEWER_TOKEN,
    coordinator,
    dashboard,
    open_tree,
    spend,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "budget-coordinator.json"
RULES = DEPLOY / "prometheus" / "alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "alerts_test.yml"
TARGET_LABELS = {"instance", "job"}
"""Labels Prometheus adds to every scraped sample: no exporter has them."""
KNOWN_VALUES = {"reason": {r.value for r in StopReason}}
"""Values a regex matcher may name that a short run cannot all show."""

# -- a small PromQL reader: metric names, the labels each selector matches, grouping labels

TOKEN = re.compile(r"""
    (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=(){},])
  | (?P<space>\s+)
""", re.X)
AGGREGATIONS = {"sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk",
                "bottomk", "quantile", "count_values"}
FUNCTIONS = {"rate", "irate", "increase", "delta", "idelta", "deriv", "clamp", "clamp_min",
             "clamp_max", "vector", "scalar", "abs", "round", "histogram_quantile",
             "max_over_time", "min_over_time", "avg_over_time", "absent", "time"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
OPERATOR_WORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


@dataclass
class Query:
    """What one PromQL expression names."""

    selectors: list[tuple[str, dict[str, tuple[str, str]]]] = field(default_factory=list)
    """(metric, {label: (matcher op, value)}) for each vector selector."""
    by: set[str] = field(default_factory=set)
    """Labels of ``by (...)`` clauses: what an aggregation keeps."""
    grouping: set[str] = field(default_factory=set)
    """Labels of every grouping or matching clause (by, without, on, ignoring, group_*)."""


def tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot read PromQL at {expr[pos:pos + 20]!r} in {expr!r}")
        kind = m.lastgroup or ""
        if kind != "space":
            out.append((kind, m.group()))
        pos = m.end()
    return out


def unquote(text: str) -> str:
    return text[1:-1].replace('\\"', '"').replace("\\\\", "\\")


def parse(expr: str) -> Query:
    toks, q, i = tokens(expr), Query(), 0

    def at(j: int) -> str:
        return toks[j][1] if j < len(toks) else ""

    while i < len(toks):
        kind, text = toks[i]
        if kind == "op" and text == "{":
            raise ValueError(f"a selector without a metric name in {expr!r}")
        if kind != "ident":
            i += 1
            continue
        if text in GROUPING:
            i += 1
            if at(i) == "(":
                i += 1
                while at(i) != ")":
                    if toks[i][0] == "ident":
                        q.grouping.add(toks[i][1])
                        if text == "by":
                            q.by.add(toks[i][1])
                    elif at(i) != ",":
                        raise ValueError(f"bad label list after {text} in {expr!r}")
                    i += 1
                i += 1
            continue
        if text in OPERATOR_WORDS:
            i += 1
            continue
        if at(i + 1) == "(" or (text in AGGREGATIONS and at(i + 1) in ("by", "without")):
            if text not in FUNCTIONS | AGGREGATIONS:
                raise ValueError(f"unknown function {text!r} in {expr!r}")
            i += 1
            continue
        matchers: dict[str, tuple[str, str]] = {}
        i += 1
        if at(i) == "{":
            i += 1
            while at(i) != "}":
                label, op, value = toks[i], toks[i + 1], toks[i + 2]
                if label[0] != "ident" or op[0] != "op" or value[0] != "string":
                    raise ValueError(f"bad matcher in {expr!r}")
                matchers[label[1]] = (op[1], unquote(value[1]))
                i += 3
                if at(i) == ",":
                    i += 1
            i += 1
        q.selectors.append((text, matchers))
    return q


def shown_labels(text: str) -> set[str]:
    """Labels a legend (``{{value}}``) or an annotation (``{{ $labels.rule }}``) prints."""
    return set(re.findall(r"\{\{\s*(\w+)\s*\}\}", text)) | set(
        re.findall(r"\$labels\.(\w+)", text))


Exported = dict[str, dict[str, set[str]]]
"""Sample name -> label -> the values seen."""


def problems(where: str, expr: str, exported: Exported,
             shown: AbstractSet[str] = frozenset()) -> list[str]:
    """What ``expr`` (and the labels its legend or annotations print) names that the
    scrape does not have."""
    q = parse(expr)
    found = []
    if not q.selectors:
        found.append(f"{where}: names no metric: {expr}")
    for name, matchers in q.selectors:
        if name not in exported:
            found.append(f"{where}: {name} is not exported")
            continue
        labels = exported[name]
        for label, (op, value) in matchers.items():
            if label not in labels:
                found.append(f"{where}: {name} has no label {label!r}")
            elif "$" in value or op in ("!=", "!~"):
                continue
            elif op == "=" and value not in labels[label]:
                found.append(f"{where}: {name}{{{label}={value!r}}} has no sample")
            elif op == "=~":
                for alt in value.split("|"):
                    if alt not in labels[label] | KNOWN_VALUES.get(label, set()):
                        found.append(f"{where}: {name}{{{label}=~...{alt!r}}} is no value")
        for label in (q.grouping | shown) - TARGET_LABELS:
            if label not in labels:
                found.append(f"{where}: {name} has no label {label!r} (grouped or shown)")
    if q.by:
        for label in shown - q.by - TARGET_LABELS:
            found.append(f"{where}: prints {label!r}, which its by (...) drops")
    return found


# -- what the two files hold

def dashboard_json() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def rules_yaml() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return doc


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard_json()["panels"] if p["type"] != "row"]


def panel_queries() -> list[tuple[str, str, set[str]]]:
    """(where, PromQL, labels its legend prints) of every panel target and variable."""
    found = [(f"panel {p['title']!r} {t['refId']}", t["expr"],
              shown_labels(t.get("legendFormat", "")))
             for p in panels() for t in p["targets"]]
    for var in dashboard_json()["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
            assert m, var
            found.append((f"variable {var['name']}", m.group(1), {m.group(2)}))
    return found


def rule_queries() -> list[tuple[str, str, set[str]]]:
    return [(f"rule {r['alert']}", r["expr"],
             shown_labels(" ".join(r["annotations"].values())))
            for g in rules_yaml()["groups"] for r in g["rules"]]


def named_metrics() -> set[str]:
    return {name for _, expr, _ in panel_queries() + rule_queries()
            for name, _ in parse(expr).selectors}


# -- the exporters, after real activity

def scrape(url: str, token: str | None = None) -> tuple[Exported, list[Sample]]:
    """The metrics and labels exported (with their values seen), and the samples."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    out: Exported = {}
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    for sample in samples:
        labels = out.setdefault(sample.name, {})
        for label, value in sample.labels.items():
            labels.setdefault(label, set()).add(value)
    return out, samples


@dataclass
class Scrapes:
    dashboard: Exported
    """The dashboard's /metrics."""
    both: Exported
    """With the ledger exporter's."""
    samples: list[Sample]
    """The dashboard's samples."""


def _complete(scrapes: Scrapes) -> bool:
    """Every metric the two files name has a sample, the refusal's stop and reason among
    them, and the capped tree counted at its ceiling."""
    both = scrapes.both
    return named_metrics() <= both.keys() and all(
        "budget_exceeded" in both[name].get("reason", set())
        for name in ("budget_stopped_trees", "budget_refusals")) and _at_ceiling(scrapes)


def _at_ceiling(scrapes: Scrapes) -> bool:
    """The dashboard counts one open tree at 100 % of its ceiling (the capped one)."""
    return any(s.value == 1 for s in scrapes.samples
               if s.name == "budget_trees_near_ceiling" and s.labels.get("band") == "100")


@pytest.fixture(scope="module")
def scrapes(redis_server: RedisServer) -> Iterator[Scrapes]:
    """The dashboard's /metrics and the ledger exporter's, once complete (or after a
    minute: the tests then say what is missing)."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    coord = coordinator(redis_server.url)
    registry = CollectorRegistry()
    observer = PrometheusLedgerObserver(registry)
    subscription = subscribe_ledger(coord, observer)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        Quotas(coord).set(QuotaRule(id="team-day", match={"team": "*"}, usd=5.0, calls=1000),
                          actor="test")
        research = open_tree(coord, "research-run", ceiling=1.0, team="research")
        assert spend(research, 0.25, tokens=400, provider="openai") == Decision.ALLOW
        capped = open_tree(coord, "capped-run", ceiling=0.1, team="infra", service="triage")
        assert spend(capped, 0.1, tokens=100, provider="anthropic") == Decision.ALLOW
        assert spend(capped, 0.01) == Decision.HALT  # refused: the tree spent its ceiling
        assert capped.stop_reason == "budget_exceeded"
        # its call waits for approval (as approval.lua shows it on the root)
        coord.client.hset(coord.keyspace.ctx("capped-run", "capped-run"), mapping={
            "approval_ctx": "capped-run", "approval_reason": "budget_exceeded",
            "approval_until_ms": int(coord.redis_now_ms()) + 600_000})
        breaker = CircuitBreaker("openai", failure_threshold=2, recovery_timeout_s=60,
                                 coordinator=coord)
        breaker.record_failure()
        breaker.record_failure()
        # an orphaned settle needs a failover (tests/faults): its event, fed as a feed would
        observer({"type": "SettleOrphaned", "charged": True})
        coord.store.flush()
        ledger_url = f"http://127.0.0.1:{port}/metrics"
        with dashboard(redis_server.url) as http:
            deadline = time.monotonic() + 60
            while True:
                dashboard_exported, samples = scrape(http.base + "/metrics", VIEWER_TOKEN)
                seen = Scrapes(dashboard_exported,
                               {**dashboard_exported, **scrape(ledger_url)[0]}, samples)
                if _complete(seen) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        yield seen
        research.close()
        capped.close()
    finally:
        subscription.close()
        server.shutdown()
        server.server_close()
        thread.join(5)
        coord.close()


# -- the tests

def test_every_metric_and_label_the_dashboard_names_is_exported(scrapes: Scrapes) -> None:
    found = [p for where, expr, shown in panel_queries()
             for p in problems(where, expr, scrapes.both, shown)]
    assert found == [], "\n".join(found)


def test_every_metric_and_label_the_alert_rules_name_is_exported(scrapes: Scrapes) -> None:
    found = [p for where, expr, shown in rule_queries()
             for p in problems(where, expr, scrapes.both, shown)]
    assert found == [], "\n".join(found)


def test_every_metric_of_the_dashboards_metrics_has_a_panel(scrapes: Scrapes) -> None:
    """A metric added to /metrics shows up here until a panel shows it."""
    assert scrapes.dashboard.keys() - named_metrics() == set()


def test_trees_near_their_ceiling_and_refusals_count_the_activity(scrapes: Scrapes) -> None:
    """The capped tree (its whole ceiling spent) counts in every band, the research tree
    (25 %) in none; the capped tree's refused call counts by its reason."""
    values = {(s.name, s.labels.get("band") or s.labels.get("reason")): s.value
              for s in scrapes.samples
              if s.name in ("budget_trees_near_ceiling", "budget_refusals")}
    assert values == {("budget_trees_near_ceiling", "50"): 1,
                      ("budget_trees_near_ceiling", "80"): 1,
                      ("budget_trees_near_ceiling", "100"): 1,
                      ("budget_refusals", "budget_exceeded"): 1}


def test_the_check_reports_what_is_not_exported() -> None:
    exported: Exported = {"budget_open_trees": {"tenant": {""}},
                          "budget_stopped_trees": {"tenant": {""}, "reason": {"aborted"}}}
    assert problems("p", "sum(budget_open_trees)", exported) == []
    assert problems("p", "sum(budget_no_such_metric)", exported) == [
        "p: budget_no_such_metric is not exported"]
    assert problems("p", 'budget_open_trees{team="x"}', exported) == [
        "p: budget_open_trees has no label 'team'"]
    assert problems("p", "sum by (org) (budget_open_trees)", exported, {"org"}) == [
        "p: budget_open_trees has no label 'org' (grouped or shown)"]
    assert problems("p", "sum by (tenant) (budget_open_trees)", exported, {"reason"}) == [
        "p: budget_open_trees has no label 'reason' (grouped or shown)",
        "p: prints 'reason', which its by (...) drops"]
    assert problems("p", 'budget_stopped_trees{reason=~"aborted|budget_exceded"}',
                    exported) == ["p: budget_stopped_trees{reason=~...'budget_exceded'} "
                                  "is no value"]
    with pytest.raises(ValueError, match="unknown function 'sumby'"):
        parse("sumby(budget_open_trees)")
    q = parse('max by (tenant, rule) (a{x="1",y=~"$v"} / (b > 0) or (b == 0) + 1) >= 0.5')
    assert [n for n, _ in q.selectors] == ["a", "b", "b"] and q.by == {"tenant", "rule"}


def test_the_dashboard_is_an_importable_grafana_dashboard() -> None:
    dash = dashboard_json()
    assert dash["schemaVersion"] >= 39 and dash["uid"] and dash["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert {"tenant", "org", "team", "service"} <= variables.keys()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
    for p in panels():
        assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, p["title"]
        assert p["targets"] and p["description"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"] and t["expr"].strip(), p["title"]
            parse(t["expr"])


def test_the_alert_rules_file_has_prometheus_structure() -> None:
    doc = rules_yaml()
    assert set(doc) == {"groups"}
    names = [g["name"] for g in doc["groups"]]
    assert len(names) == len(set(names))
    alerts = []
    for group in doc["groups"]:
        assert set(group) == {"name", "rules"} and group["rules"], group["name"]
        for rule in group["rules"]:
            assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule
            assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", rule["alert"])
            assert re.fullmatch(r"\d+[smhdwy]", rule["for"]), rule["alert"]
            assert rule["labels"]["severity"] in {"info", "warning", "critical"}
            assert set(rule["annotations"]) == {"summary", "description"}
            assert all(isinstance(v, str) and v for v in rule["annotations"].values())
            parse(rule["expr"])
            alerts.append(rule["alert"])
    assert len(alerts) == len(set(alerts))
    # the built-in quota alert's default fractions, one band each
    quota = [r["expr"] for g in doc["groups"] for r in g["rules"]
             if r["alert"].startswith("BudgetQuotaBucket")]
    assert [re.search(r"\)\s*(>=.*)$", e).group(1) for e in quota] == [  # type: ignore[union-attr]
        ">= 0.5 < 0.8", ">= 0.8 < 1", ">= 1"]


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
def test_promtool_loads_the_rules_and_they_fire_as_expected(tmp_path: Path) -> None:
    def run(*args: str) -> str:
        out = subprocess.run([str(PROMTOOL), *args], capture_output=True, text=True,
                             timeout=60, cwd=RULES.parent)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    run("check", "rules", RULES.name)
    run("test", "rules", RULE_TESTS.name)
    # every panel's expression, Grafana's variables given values, as a recording rule
    record = [{"record": f"budget:panel_{i}", "expr": re.sub(r"\$\w+", ".*", expr)}
              for i, (_, expr, _) in enumerate(panel_queries())]
    panels_file = tmp_path / "panels.yml"
    panels_file.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": record}]}))
    run("check", "rules", str(panels_file))
