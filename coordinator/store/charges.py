"""Charges without a call: propagate.lua adds a cost spent outside a wrapped call (a bill
that arrives later) to every level of a context's path at once, like a settle."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.contracts import PROPAGATE
from ..core.paths import Path
from ..core.script_constants import NODE_STREAM_CAP
from ..core.vocabulary import ChargeCode
from ..models_records import NodeFields, encode_node
from .errors import UNAVAILABLE
from .tree import Stop, Store, decode_stops
from .wire import Op


def decode_propagate(path: Path, reply: list[Any]) -> list[Stop] | None:
    """propagate.lua's reply: the levels of ``path`` the charge stopped (none for a charge
    already applied; a ``state_corrupt`` stop for a charge that a corrupt counter kept
    from being applied), or None when a level does not exist."""
    if int(reply[0]) == ChargeCode.MISSING:
        return None
    return decode_stops(path, reply)


def propagate(store: Store, path: Path, charge_id: str, amounts: Sequence[str | int],
              node: NodeFields) -> list[Stop] | None:
    """Charge ``amounts`` to every level of ``path`` at once, with nothing held;
    idempotent per ``charge_id``. Returns the levels it stopped, or None when a level
    does not exist. When Redis cannot be reached the charge is queued (the flusher resends
    it) and the error raised."""
    ks = store.ks
    keys = PROPAGATE.key_list(done=ks.done(path.root), nodes=ks.nodes(path.root, path.ctx_id),
                              ledger=ks.ledger(path.root), levels=store.level_keys(path))
    op = Op(PROPAGATE.script, keys, PROPAGATE.arg_list(
        charge_id=charge_id, path=",".join(path.ids), abort_channel=ks.abort_channel,
        ledger_channel=ks.ledger_channel, node=encode_node(node), node_cap=NODE_STREAM_CAP,
        amounts=amounts))
    try:
        reply = store.wire.run(op)
    except UNAVAILABLE:
        store.wire.queue(op)  # spend is never lost: sent again with the next round trip
        raise
    return decode_propagate(path, reply)
