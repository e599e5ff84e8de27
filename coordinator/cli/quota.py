"""``budgetctl quota``: standing budgets (docs/quotas.md). Set, list, show and delete
rules at runtime; every change is audited and applies to the next call everywhere."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from ..core.durations import human_age
from ..errors import QuotaRuleError
from ..quotas import QuotaRule, Quotas, QuotaStatus
from ..quotas.api import JSON_DIMS
from ..quotas.rules import match_from_pairs
from ._common import JsonOption, connect, fail, print_json
from .help_format import PlainCommand, PlainGroup

app = typer.Typer(cls=PlainGroup, no_args_is_help=True,
                  help="Standing budgets: quota rules and buckets.")


class Limit(str, Enum):
    """A limit ``--unset`` removes (a rule's field)."""

    usd = "usd"
    tokens = "tokens"
    calls = "calls"


ActorOption = Annotated[str | None, typer.Option(
    "--actor", metavar="WHO", help="Who makes the change, for the audit (default: USER@HOST).")]


@app.command("set", cls=PlainCommand)
def set_rule(
    ctx: typer.Context,
    rule_id: Annotated[str, typer.Argument(metavar="ID", help="The rule's name.")],
    match: Annotated[list[str] | None, typer.Option(
        "--match", metavar="LABEL=VALUE", help="org, team, service, user, key or a tag "
        "(value * for each value separately); repeat for several. A new rule needs one; "
        "a rule's match cannot change.")] = None,
    usd: Annotated[float | None, typer.Option(
        metavar="DOLLARS", help="Dollars per period.")] = None,
    tokens: Annotated[int | None, typer.Option(metavar="N", help="Tokens per period.")] = None,
    calls: Annotated[int | None, typer.Option(metavar="N", help="Calls per period.")] = None,
    unset: Annotated[list[Limit] | None, typer.Option(
        help="Remove this limit; repeat for several.")] = None,
    period: Annotated[str | None, typer.Option(
        help="day (a new rule's), week, month (calendar, in --tz), total, or a duration: "
        "30s, 5m, 2h, 1d.")] = None,
    tz: Annotated[str | None, typer.Option(
        metavar="ZONE", help="Time zone of calendar periods (a new rule's: UTC).")] = None,
    retention: Annotated[int | None, typer.Option(
        metavar="SECONDS", help="How long a window is kept after it ends (a new rule's: "
        "90 days).")] = None,
    actor: ActorOption = None,
) -> None:
    """Create a rule, or change the options given of one (the others keep their value)."""
    try:
        given = {"match": match_from_pairs(match) if match else None, "usd": usd,
                 "tokens": tokens, "calls": calls, "period": period, "tz": tz,
                 "retention_s": retention}
        changes: dict[str, object] = {k: v for k, v in given.items() if v is not None}
        changes.update({limit.value: None for limit in unset or ()})
    except QuotaRuleError as exc:
        fail(str(exc), 2)
    if not changes:
        fail("quota set: nothing to set (give --match, --usd, --tokens, --calls, --unset, "
             "--period, --tz or --retention)", 2)
    with connect(ctx) as coord:
        try:
            stored = Quotas(coord).change(rule_id, changes, actor=actor)
        except QuotaRuleError as exc:
            new_without_match = exc.field == "match" and exc.value is None
            fail("quota rule match: a new rule needs --match LABEL=VALUE" if new_without_match
                 else str(exc), 2)
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


def _window_text(rule: QuotaRule, rows: list[QuotaStatus]) -> str:
    """``per day, window 2026-11-28, resets in 16h51m`` (the same for all its buckets)."""
    if not rows:
        return f"per {rule.period}, no spend in its current window"
    s = rows[0]
    resets = "never" if s.resets_in_s is None else human_age(s.resets_in_s * 1000)
    return f"per {rule.period}, window {s.window}, resets in {resets}"


def _amount(dim: str, amount: int) -> str:
    return f"${amount / 1_000_000:,.6f}".rstrip("0").rstrip(".") if dim == "usd" else \
        f"{amount:,}"


def _lines(rows: list[QuotaStatus]) -> list[str]:
    """A header, then each bucket whole on its line and one line per limited dimension
    under it: spent, held in grants, limit (plain lines: no id is ever cut)."""
    cells = [(JSON_DIMS[d], _amount(d, s.spent[d]), _amount(d, s.in_grants[d]),
              _amount(d, limit)) for s in rows for d, limit in s.limits.items()]
    widths = [max(len(c[i]) for c in [("", "SPENT", "IN GRANTS", "LIMIT"), *cells])
              for i in range(4)]

    def line(cell: tuple[str, str, str, str]) -> str:
        return "    " + "  ".join([cell[0].ljust(widths[0]),
                                  *(c.rjust(w) for c, w in zip(cell[1:], widths[1:], strict=True))])

    out = [line(("", "SPENT", "IN GRANTS", "LIMIT"))]
    rest = iter(cells)
    for s in rows:
        out.append(f"  {s.bucket}")
        out += [line(next(rest)) for _ in s.limits]
    return out


@app.command("list", cls=PlainCommand)
def list_rules(ctx: typer.Context, as_json: JsonOption = False) -> None:
    """Every rule's buckets in their current window: spent, held in grants, limit."""
    with connect(ctx) as coord:
        quotas = Quotas(coord)
        rules = quotas.rules()
        status = {rule.id: quotas.status(rule) for rule in rules}
        if as_json:
            print_json(lambda: {"rules": [r.id for r in rules],
                                "buckets": [s.as_dict() for r in rules
                                            for s in status[r.id]]}, None)
            return
        if not rules:
            print("no quota rules")
            return
        for rule in rules:
            rows = status[rule.id]
            print("\n".join([f"{rule.id}: {_window_text(rule, rows)}",
                             *(_lines(rows) if rows else [])]))


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
        match = ", ".join(f"{k}={v}" for k, v in sorted(rule.match.items()))
        print(f"quota {rule.id} (version {rule.version}): match {match} ({rule.tz}); "
              f"{_window_text(rule, rows)}")
        if rows:
            print("\n".join(_lines(rows)))
        for event in quotas.audit(rule_id):
            print(f"{event.get('at', '')} {event.get('actor', '')} {event.get('action', '')}")
