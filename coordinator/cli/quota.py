"""``budgetctl quota``: standing budgets (docs/quotas.md). Set, list, show and delete
rules at runtime; every change is audited and applies to the next call everywhere."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from ..errors import QuotaRuleError
from ..quotas import QuotaRule, Quotas, QuotaStatus
from ..quotas.refusal import amount_text
from ..quotas.rules import match_from_pairs
from ._common import JsonOption, connect, console, fail, print_json
from .help_format import PlainCommand, PlainGroup

app = typer.Typer(cls=PlainGroup, no_args_is_help=True,
                  help="Standing budgets: quota rules and buckets.")

ActorOption = Annotated[str | None, typer.Option(
    "--actor", help="Who makes the change, for the audit (default: USER@HOST).")]


@app.command("set", cls=PlainCommand)
def set_rule(
    ctx: typer.Context,
    rule_id: Annotated[str, typer.Argument(metavar="ID", help="The rule's name.")],
    match: Annotated[list[str], typer.Option(
        "--match", help="label=value (org, team, service, user, key or a tag; value * "
        "for each value separately); repeat for several.")],
    usd: Annotated[float | None, typer.Option(help="Dollars per period.")] = None,
    tokens: Annotated[int | None, typer.Option(help="Tokens per period.")] = None,
    calls: Annotated[int | None, typer.Option(help="Calls per period.")] = None,
    period: Annotated[str, typer.Option(
        help="day, week, month (calendar, in --tz), total, or a duration: 30s, 5m, "
        "2h, 1d.")] = "day",
    tz: Annotated[str, typer.Option(help="Time zone of calendar periods.")] = "UTC",
    retention: Annotated[int, typer.Option(
        help="Seconds a window is kept after it ends.")] = 90 * 86400,
    actor: ActorOption = None,
) -> None:
    """Create or change a rule (its match cannot change)."""
    try:
        rule = QuotaRule(id=rule_id, match=match_from_pairs(match), usd=usd, tokens=tokens,
                         calls=calls, period=period, tz=tz, retention_s=retention)
    except QuotaRuleError as exc:
        fail(str(exc), 2)
    with connect(ctx) as coord:
        try:
            stored = Quotas(coord).set(rule, actor=actor)
        except QuotaRuleError as exc:
            fail(str(exc), 2)
        print(f"quota {stored.id} set (version {stored.version})")


@app.command("delete", cls=PlainCommand)
def delete_rule(
    ctx: typer.Context,
    rule_id: Annotated[str, typer.Argument(metavar="ID")],
    actor: ActorOption = None,
) -> None:
    """Delete a rule: trees stop drawing from it (its windows stay for their retention)."""
    with connect(ctx) as coord:
        Quotas(coord).delete(rule_id, actor=actor)
        print(f"quota {rule_id} deleted")


def _table(rows: list[QuotaStatus]) -> Table:
    table = Table("rule", "bucket", "window (period)", "spent", "in grants", "limit",
                  "resets in")
    for s in rows:
        for dim, limit in s.limits.items():
            table.add_row(s.rule_id, s.bucket, f"{s.window} ({s.period})",
                          amount_text(dim, s.spent[dim]),
                          amount_text(dim, s.in_grants[dim]), amount_text(dim, limit),
                          "never" if s.resets_in_s is None else f"{s.resets_in_s:.0f}s")
    return table


@app.command("list", cls=PlainCommand)
def list_rules(ctx: typer.Context, as_json: JsonOption = False) -> None:
    """Every rule's buckets in their current window: spent, held in grants, limit."""
    with connect(ctx) as coord:
        quotas = Quotas(coord)
        rules = quotas.rules()
        rows = [s for rule in rules for s in quotas.status(rule)]
        if as_json:
            print_json(lambda: {"rules": [r.id for r in rules],
                                "buckets": [s.as_dict() for s in rows]}, None)
            return
        if not rules:
            print("no quota rules")
            return
        console().print(_table(rows))


@app.command("show", cls=PlainCommand)
def show_rule(
    ctx: typer.Context,
    rule_id: Annotated[str, typer.Argument(metavar="ID")],
    as_json: JsonOption = False,
) -> None:
    """A rule, its buckets now, and its audit trail."""
    with connect(ctx) as coord:
        quotas = Quotas(coord)
        if as_json:
            print_json(lambda: quotas.report(rule_id), None)
            return
        rule = quotas.get(rule_id)
        rows = quotas.status(rule)
        audit = quotas.audit(rule_id)
        out = console()
        out.print(f"quota {rule.id} (version {rule.version}): match "
                  + ", ".join(f"{k}={v}" for k, v in sorted(rule.match.items()))
                  + f"; per {rule.period} ({rule.tz})")
        out.print(_table(rows))
        for event in audit:
            out.print(f"{event.get('ts', '')} {event.get('actor', '')} {event.get('action', '')}")

