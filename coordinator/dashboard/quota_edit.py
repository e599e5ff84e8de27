"""Quota rules changed from the dashboard (docs/dashboard.md): the API's JSON body and the
Quotas page's form made into changes of a rule (every value checked, typed errors). The
change is audited under the operator's name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import QuotaRuleError
from ..quotas import QuotaRule, Quotas
from ..quotas.rules import match_from_pairs
from ..runtime.coordinator import Coordinator

FORM_LIMITS = {"usd": float, "tokens": int, "calls": int}
"""The page form's limit fields and their types (a blank field: not limited)."""
MAX_FIELD = 200


def actor_of(name: str) -> str:
    """Who an audit event names for a dashboard change."""
    return f"{name} (dashboard)"


def changes_from_body(body: object) -> dict[str, object]:
    """The API body: a JSON object of rule fields (``id`` and ``version`` are ignored)."""
    if not isinstance(body, Mapping):
        raise QuotaRuleError("body", type(body).__name__, "must be a JSON object of rule "
                             "fields: {\"match\": {\"team\": \"research\"}, \"usd\": 500}")
    return {k: v for k, v in body.items() if k not in ("id", "version")}


def _form_number(name: str, text: str) -> float | int | None:
    text = text.strip()
    if not text:
        return None
    try:  # (QuotaRule checks the value: NaN, infinite, negative, too large)
        value: float | int = FORM_LIMITS[name](text)
    except ValueError:
        raise QuotaRuleError(name, text, "must be a number" if name == "usd"
                             else "must be a whole number") from None
    return value


def changes_from_form(form: Mapping[str, Any]) -> tuple[str, dict[str, object]]:
    """The page form: ``id``, ``match`` (``team=research, user=*``; only for a new rule),
    ``usd``, ``tokens``, ``calls`` (blank: not limited), ``period`` and ``tz``."""
    fields = {k: v.strip() for k, v in form.items() if isinstance(v, str)}
    for name, text in fields.items():
        if len(text) > MAX_FIELD:
            raise QuotaRuleError(name, text[:20] + "...", f"is over {MAX_FIELD} characters")
    changes: dict[str, object] = {name: _form_number(name, fields.get(name, ""))
                                  for name in FORM_LIMITS}
    if fields.get("match"):
        changes["match"] = match_from_pairs(p for p in fields["match"].split(",") if p.strip())
    for name in ("period", "tz"):
        if fields.get(name):
            changes[name] = fields[name]
    return fields.get("id", ""), changes


def change_rule(coord: Coordinator, rule_id: str, changes: Mapping[str, object],
                actor: str) -> QuotaRule:
    """Apply ``changes`` to a rule (or create it), audited as ``actor``."""
    return Quotas(coord).change(rule_id, changes, actor=actor_of(actor))


def delete_rule(coord: Coordinator, rule_id: str, actor: str) -> None:
    Quotas(coord).delete(rule_id, actor=actor_of(actor))
