"""Repairing a context after an operator fixed or reset its corrupt fields (repair.lua):
re-validated, its holds recomputed from the open reservations, its state_corrupt stop
lifted, then the settles and releases the corruption stopped charged as they were asked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.contracts import REPAIR
from ..core.paths import Path
from ..errors import ContextNotFoundError, CorruptStateError
from .records import ReservationRecord
from .tree import Store
from .wire import Op


@dataclass(frozen=True)
class Repaired:
    """What a repair did."""

    chain_id: str
    lifted: bool
    """The state_corrupt stop was lifted (False: there was none)."""
    status: str
    """The context's status after the repair."""
    holds: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Hold fields set to what the open reservations hold: field -> (was, now)."""
    charged: list[str] = field(default_factory=list)
    """Reservations whose stopped settle or release was charged by this repair."""


def _holds(reply: list[Any], start: int) -> dict[str, tuple[int, int]]:
    return {str(reply[i]): (int(reply[i + 1]), int(reply[i + 2]))
            for i in range(start, len(reply), 3)}


def repair_context(store: Store, path: Path, operator: str) -> Repaired:
    """Re-validate the context at ``path`` and lift its state_corrupt stop (repair.lua),
    then charge, once, every settle or release on a path through it that a corrupt
    counter had stopped. Raises CorruptStateError while a number is still corrupt,
    ContextNotFoundError when the context does not exist."""
    ks, root, ctx_id = store.ks, path.root, path.ctx_id
    reply = store.wire.run(Op(REPAIR.script, REPAIR.key_list(
        ctx=ks.ctx(root, ctx_id), events=ks.events(root, ctx_id), res=ks.reservations(root)),
        REPAIR.arg_list(ctx_id=ctx_id, actor=operator)))
    code = int(reply[0])
    if code == -1:
        raise ContextNotFoundError(ctx_id)
    if code == 0:
        raise CorruptStateError(ctx_id, str(reply[1]), str(reply[2]))
    res_key = ks.reservations(root)
    charged = []
    for rid, raw in store.client.hgetall(res_key).items():
        record = ReservationRecord.from_json(raw)
        pending = record.pending
        if pending is None or ctx_id not in record.path:
            continue
        store.finish(Path(root, record.path), str(rid), outcome=pending.outcome,
                     node=pending.node(), amounts=pending.amounts, write_behind=False)
        if not store.client.hexists(res_key, rid):  # else another level is still corrupt
            charged.append(str(rid))
    status = store.client.hget(ks.ctx(root, ctx_id), "status")
    return Repaired(ctx_id, code == 1, str(status), _holds(reply, 1 if code == 1 else 2),
                    charged)
