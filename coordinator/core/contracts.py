"""The seam between Python and the Lua scripts: each script's KEYS and ARGV declared once,
by name, in order, with their kinds; the store builds every call from these declarations
(and tests/unit/test_contracts.py holds them against each script's header comment).

A declaration reads like the header it mirrors: ``name:kind`` slots in order (a KEYS
slot's kind is always ``key``), ``name{a:kind,b:kind}`` a run of repeated groups (the
variadic tail, or a middle run whose length a ``count`` slot states), and
``n:count(name)`` the slot holding the number of groups of the run ``name`` (filled in
by the builder). Kinds: ``str``, ``int`` (a canonical integer), ``json``, ``csv``
(comma-separated ids) and ``flag`` (given as a bool, sent as ``'1'`` or ``'0'``).
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS = ("key", "str", "int", "json", "csv", "flag", "count")


@dataclass(frozen=True)
class Slot:
    """One KEYS or ARGV slot, or one field of a repeated group."""

    name: str
    kind: str
    counts: str = ""
    """For a ``count`` slot: the name of the run whose groups it counts."""


@dataclass(frozen=True)
class Run:
    """Repeated groups of slots (a pair ``dim, amount``, a level's keys...), given to the
    builder as one flat sequence."""

    name: str
    fields: tuple[Slot, ...]


Part = Slot | Run

_PART = re.compile(r"(\w+)(?::(\w+)(?:\((\w+)\))?|\{([^}]*)\})?")


def _parts(spec: str, default_kind: str) -> tuple[Part, ...]:
    out: list[Part] = []
    for m in _PART.finditer(spec):
        name, kind, counted, group = m.groups()
        if group is not None:
            fields = tuple(p for p in _parts(group, default_kind) if isinstance(p, Slot))
            out.append(Run(name, fields))
        else:
            out.append(Slot(name, kind or default_kind, counted or ""))
    for part in out:
        if not part.name.isidentifier() or keyword.iskeyword(part.name):
            raise ValueError(f"{spec!r}: {part.name!r} is not a name")
        for slot in part.fields if isinstance(part, Run) else (part,):
            if slot.kind not in KINDS:
                raise ValueError(f"{spec!r}: unknown kind {slot.kind!r}")
    return tuple(out)


def _builder(script: str, parts: tuple[Part, ...]) -> Callable[..., list[Any]]:
    """A function taking each declared name as a keyword argument (Python itself then
    rejects a missing or unknown name) and returning the list in order: generated once,
    so that a call costs what a list display written by hand costs."""
    widths = {p.name: len(p.fields) for p in parts if isinstance(p, Run)}
    names, items, checks = [], [], []
    for p in parts:
        if isinstance(p, Run):
            names.append(p.name)
            items.append(f"*{p.name}")
            if len(p.fields) > 1:
                checks.append(f"    if len({p.name}) % {len(p.fields)}: "
                              f"_uneven({script!r}, {p.name!r}, {p.name}, {len(p.fields)})")
        elif p.kind == "count":
            items.append(f"len({p.counts}) // {widths[p.counts]}")
        else:
            names.append(p.name)
            items.append(f"('1' if {p.name} else '0')" if p.kind == "flag" else p.name)
    source = f"def build(*, {', '.join(names)}):\n" if names else "def build():\n"
    source += "".join(c + "\n" for c in checks) + f"    return [{', '.join(items)}]\n"
    scope: dict[str, Any] = {"_uneven": _uneven}
    exec(source, scope)  # noqa: S102 - the source is made of declared identifiers only
    build: Callable[..., list[Any]] = scope["build"]
    build.__qualname__ = build.__name__ = f"{script}_build"
    return build


def _uneven(script: str, name: str, value: Sequence[Any], width: int) -> None:
    raise TypeError(f"{script}: {name} holds {len(value)} values, not groups of {width}")


@dataclass(frozen=True)
class Contract:
    """The KEYS and ARGV of one script (of one of its modes, for a script whose ARGV
    differ by mode: ``variant``, the section of its header that lists them)."""

    script: str
    keys: tuple[Part, ...]
    argv: tuple[Part, ...]
    variant: str = ""
    key_list: Callable[..., list[str]] = field(init=False, repr=False, compare=False)
    """KEYS in order, from a keyword argument per declared name (a run: one flat
    sequence of its groups)."""
    arg_list: Callable[..., list[Any]] = field(init=False, repr=False, compare=False)
    """ARGV in order, likewise (``count`` slots are filled in, flags take a bool)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_list", _builder(self.script, self.keys))
        object.__setattr__(self, "arg_list", _builder(self.script, self.argv))

    def slot(self, name: str) -> int:
        """The index (from 0, as in the Python list) of the ARGV slot ``name``, which
        must come before any run."""
        for i, part in enumerate(self.argv):
            if isinstance(part, Run):
                break
            if part.name == name:
                return i
        raise KeyError(f"{self.script}: no fixed ARGV slot {name!r}")


def contract(script: str, keys: str, argv: str, variant: str = "") -> Contract:
    """A contract from its compact form (see the module's docstring)."""
    return Contract(script, _parts(keys, "key"), _parts(argv, "str"), variant)


_FINISH_KEYS = "res leases nodes ledger levels{ctx,events} fin done bymodel"
_FINISH_HEAD = ("reservation_id abort_channel node:json node_cap:int ledger_channel")
_NODE_FACTS = "node_status node_stop_reason node_unreported:flag node_model"
"""What settle and release count of the node record (store/tree.py node_facts)."""
_SLICE_KEYS = "res leases nodes ledger levels{ctx,events} slices fin"
_WINDOW_ARGV = "mode window_ms:int call_id"

OPEN = contract(
    "open", "ctx kids ancestors{ctx}",
    "ctx_id parent_id path:csv request_id meta:json requested:json timeout_ms:int "
    "deadline_ms:int n_fields:count(fields) fields{field,value} limits{dim,mode,value}")
RESERVE = contract(
    "reserve", "res leases levels{ctx,events} done",
    "reservation_id lease_ms:int path:csv abort_channel keyed:flag final:flag below:int "
    "n_rungs:count(rungs) rungs{model,amount:int} amounts{dim,amount:int}")
SETTLE = contract(
    "settle", _FINISH_KEYS, f"{_FINISH_HEAD} late:flag {_NODE_FACTS} amounts{{dim,amount:int}}")
RELEASE = contract(
    "release", _FINISH_KEYS,
    f"{_FINISH_HEAD} outcome late:flag {_NODE_FACTS} amounts{{dim,amount:int}}")
ABORT = contract("abort", "ctx events", "reason detail abort_channel root ctx_id")
CLOSE = contract("close", "ctx nodes events others{key}", "retention_s:int")
RENEW = contract("renew", "leases", "lease_ms:int ids{reservation_id}")
BREAKER_CHECK = contract("breaker_check", "breaker",
                         "mode recovery_ms:int holder ttl_ms:int probe_lease_ms:int")
BREAKER_RECORD = contract("breaker_record", "breaker",
                          "outcome threshold:int holder ttl_ms:int")
WINDOW_ADMIT = contract(
    "window", "admitted spent", f"{_WINDOW_ARGV} max_calls:int degrade_calls:int max_usd:int "
    "degrade_usd:int estimate:int", "admit")
WINDOW_CHARGE = contract(
    "window", "admitted spent", f"{_WINDOW_ARGV} held:int actual:int max_usd:int "
    "degrade_usd:int", "charge")
EVENT_ONCE = contract("event_once", "ctx events", "reason event:json cap:int")
APPEND = contract("append", "events", "cap:int entry:json")
REFUSAL = contract("refusal", "ctx nodes events", "reason event:json node:json node_cap:int")
PROPAGATE = contract(
    "propagate", "done nodes ledger levels{ctx,events}",
    "charge_id path:csv abort_channel ledger_channel node:json node_cap:int "
    "amounts{dim,amount:int}")
DATA_READ_GET = contract("data_read", "levels{data,dmeta,dview}", "mode key", "get")
DATA_READ_ALL = contract("data_read", "levels{data,dmeta,dview}", "mode")
DATA_WRITE = contract("data_write", "ctx data dmeta",
                      "max_bytes:int n_sets:count(sets) sets{key,value:json} deletes{key}")
DATA_MERGE = contract("data_merge", "parent_ctx parent_data parent_dmeta child_data",
                      "policy max_value_bytes:int max_bytes:int merged{key}")
DATA_SPAWN = contract("data_spawn", "ctx dmeta dview parents{data,dmeta,dview}",
                      "isolation parallel:flag step view_mode view{key,value:json}")
DATA_SNAPSHOT = contract("data_snapshot", "levels{ctx,data,dmeta,dview}", "")
LEASE_TAKE = contract(
    "lease_take", "res leases slices lessees levels{ctx}",
    "slice_id lease_ms:int path:csv share_divisor:int owner owner_ms:int "
    "return_on_expiry:flag below:int low_least:int wants{dim,amount:int,least:int}")
LEASE_FLUSH = contract(
    "lease_flush", _SLICE_KEYS,
    "slice_id abort_channel ledger_channel node_cap:int give_back:flag path:csv batch:int "
    "n_nodes:count(node_records) n_events:count(events) node_records{node:json} "
    "events{event:json} spent{dim,amount:int}")
LEASE_RETURN = contract("lease_return", _SLICE_KEYS,
                        "slice_id node:json node_cap:int abort_channel ledger_channel")
REPAIR = contract("repair", "ctx events res", "ctx_id actor")
SET_LIMITS = contract("set_limits", "ctx events ancestors{ctx}",
                      "ctx_id root abort_channel actor why limits{dim,limit:int}")
APPROVAL_START = contract("approval", "root_ctx", "mode ctx_id reason wait_ms:int",
                          "start")
APPROVAL_END = contract("approval", "root_ctx", "mode ctx_id until_ms:int", "end")
QUOTA_SET = contract("quota_set", "rule audit",
                     "action actor definition:json audit_cap:int match:json limits{dim,limit:int}")
QUOTA_TAKE = contract(
    "quota_take", "rule bucket grants expiry takers window_index",
    "version:int start_ms:int end_ms:int expire_at_ms:int member grant_id root index:int "
    "lease_ms:int share_divisor:int takers_ms:int wants{dim,amount:int,least:int}")
QUOTA_SETTLE = contract("quota_settle", "bucket grants expiry",
                        "member grant_id unknown:flag consumed{dim,amount:int}")
QUOTA_RENEW = contract("quota_renew", "expiry grants buckets{bucket}",
                       "lease_ms:int renewals{member,grant_id,usd:int,calls:int,tok:int}")
QUOTA_GRANT = contract("quota_grant", "root", "index:int grant_id window end_ms:int "
                       "amounts{dim,granted:int}")
QUOTA_END = contract("quota_end", "root", "index:int grant_id")
SESSION_LOAD = contract("session_load", "record", "")
SESSION_SAVE = contract("session_save", "record active expiry", "member fields{field,value}")
SESSION_ACQUIRE = contract(
    "session_acquire", "record active expiry claims claimers",
    "member cap:int max_executions:int claim_id claim_ttl_ms:int")
SESSION_COMMIT = contract(
    "session_commit", "record active expiry claims claimers history",
    "member claim_id ttl_ms:int history_cap:int fields{field,value}")
SESSION_RECORD = contract("session_record", "record expiry",
                          "member duration_ms:int sandbox_id")
SESSION_TERMINATE = contract("session_terminate", "record active expiry",
                             "member status reason last_error sandbox_id only_if_expired:flag")
SESSION_LIST = contract("session_list", "expiry", "cutoff limit:int")
SESSION_ABANDON = contract("session_abandon", "claims claimers", "member claim_id")

CONTRACTS: tuple[Contract, ...] = (
    OPEN, RESERVE, SETTLE, RELEASE, ABORT, CLOSE, RENEW, BREAKER_CHECK, BREAKER_RECORD,
    WINDOW_ADMIT, WINDOW_CHARGE, EVENT_ONCE, APPEND, REFUSAL, PROPAGATE, DATA_READ_GET,
    DATA_READ_ALL, DATA_WRITE, DATA_MERGE, DATA_SPAWN, DATA_SNAPSHOT, LEASE_TAKE,
    LEASE_FLUSH, LEASE_RETURN, REPAIR, SET_LIMITS, APPROVAL_START, APPROVAL_END, QUOTA_SET,
    QUOTA_TAKE, QUOTA_SETTLE, QUOTA_RENEW, QUOTA_GRANT, QUOTA_END, SESSION_LOAD, SESSION_SAVE,
    SESSION_ACQUIRE, SESSION_COMMIT, SESSION_RECORD, SESSION_TERMINATE, SESSION_LIST,
    SESSION_ABANDON)
"""Every declared contract (a script with modes has one per mode)."""

