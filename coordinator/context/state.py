"""ContextState: what one local handle knows of its context (where it sits, whether it is
open, stopped or closed, the events recorded while Redis was away) and the few things it
does with that knowledge. The facade, the per-call machinery and the ledger share it."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..core.amounts import micro_to_usd
from ..core.paths import Path
from ..core.plans import OpenPlan
from ..core.script_constants import HOOK
from ..core.vocabulary import CEILING_REASONS, StopReason
from ..errors import ContextExistsError, ContextNotFoundError, TokenMalformedError
from ..models import ChainMetadata, ContextSnapshot, Decision, ExecutionConfig, SafetyEvent
from ..models_records import BudgetWarning
from ..quotas.hooks import quota_attachment
from ..runtime.coordinator import Coordinator
from ..shield.pipeline import ShieldPipeline
from ..store.errors import UNAVAILABLE
from ..store.tree import OpenRefused, Store
from .budget_warnings import WarningHub
from .cancellation import CancellationToken

log = logging.getLogger("coordinator")

_id_prefix = secrets.token_hex(8)
_id_seq = itertools.count()
"""An unkeyed call's id: this process's random prefix and a counter (32 hex characters,
unique across processes; one urandom read per process, not per call)."""


def _new_id_prefix() -> None:
    global _id_prefix, _id_seq
    _id_prefix, _id_seq = secrets.token_hex(8), itertools.count()


os.register_at_fork(after_in_child=_new_id_prefix)  # a forked child draws its own

CANCELLING_REASONS = frozenset({StopReason.ABORTED, StopReason.TIMEOUT})
"""Stops that cancel work in flight. Ceiling stops (budget, steps, retries, tokens) let
calls that already hold a reservation finish: they fit under the ceiling by design."""

LIFT_RECHECK_S = 2.0
"""How long after a lift a ceiling stop heard for the same reason is checked in Redis."""


@dataclass(frozen=True)
class PendingOpen:
    """An open not yet done in Redis (it was unreachable when the handle was made)."""

    plan: OpenPlan
    meta_json: str
    fresh: bool = False
    """No open was sent yet: finding the id taken means another context has it."""


@dataclass(eq=False)
class ContextState:
    """One handle's state. Equality is identity (a handle is tracked in weak sets)."""

    coord: Coordinator
    path: Path
    config: ExecutionConfig
    metadata: ChainMetadata
    pipeline: ShieldPipeline | None
    circuit_breaker: Any | None
    owner: bool
    """True when this handle opened the context (closing it closes it in Redis)."""
    pending_open: PendingOpen | None = None
    cancellation_token: CancellationToken = field(default_factory=CancellationToken)
    stopped: str | None = None
    closed: bool = False
    deadline_ms: int = 0
    mirrored: int = 0
    offline_events: list[SafetyEvent] = field(default_factory=list)
    last_snapshot: ContextSnapshot | None = None
    call_seq: itertools.count[int] | None = None
    opening: threading.Lock = field(default_factory=threading.Lock, repr=False)
    lifted: tuple[float, frozenset[str]] | None = None
    """Until when (monotonic) a stop heard for these lifted reasons is checked in Redis."""
    owed_abort: str | None = None
    """The detail of an abort made before the open landed (queued by the open)."""
    abort_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    warnings: WarningHub | None = None
    """The handle's budget warning callbacks (ExecutionContext.on_warning), if any."""
    store: Store = field(init=False)
    """The coordinator's store (kept here: the hot path reads it on every call)."""
    backend_key: str = field(init=False)
    """A key of the tree: the backend breaker's ``allow``/``failed`` find by it the node
    serving the tree (on a Cluster, each primary has its own breaker)."""

    def __post_init__(self) -> None:
        self.store = self.coord.store
        self.backend_key = self.store.ks.reservations(self.path.root)

    @property
    def tree_path(self) -> Path:
        """Where the context sits (what the stop listener matches broadcasts against)."""
        return self.path

    @property
    def ctx_id(self) -> str:
        return self.path.ctx_id

    def has_time_to_resend(self) -> bool:
        """Whether a reserve that gets no answer may be sent once more: its node is not
        in a streak of timeouts already, and the context's deadline, if any, leaves room
        for another hot-path timeout and the call."""
        coord = self.coord
        if coord.backend.timing_out(self.backend_key):
            return False
        return not self.deadline_ms or (self.deadline_ms - coord.redis_now_ms()
                                        > 2 * coord.hot_timeout_ms)

    # -- opening -------------------------------------------------------------------------

    def ensure_open(self, *, first: bool = False, unless_closed: bool = False) -> None:
        """Open the context in Redis if that has not happened yet (fails closed), one
        thread at a time (a background open, a token read and a first call may race to
        it). Opens share the backend breaker: while it is open this raises
        ``BackendDown`` at once, so calls queued on a root opened during a stall do not
        each wait a timeout. ``unless_closed``: a handle closed meanwhile stays unopened."""
        if self.pending_open is None:
            return
        with self.opening:
            if not (unless_closed and self.closed):
                self._open(first=first)

    def is_open(self) -> bool:
        """Whether the context is open in Redis, once an open in flight is done."""
        with self.opening:
            return self.pending_open is None

    def _open(self, *, first: bool) -> None:
        pending = self.pending_open
        if pending is None:
            return
        plan = pending.plan
        first = first or pending.fresh
        # a root: the quota buckets its labels match, written by the open itself
        fields, attached = quota_attachment(self.coord, self.path, self.metadata)
        if plan.fields:
            fields = [*fields, *plan.fields]
        try:
            opened = self.coord.backend.guard(lambda: self.store.open(
                self.path, request_id=self.metadata.request_id, meta_json=pending.meta_json,
                config_json=plan.config_json, timeout_ms=plan.config.timeout_ms,
                deadline_ms=plan.deadline_ms, triples=plan.triples, fields=fields),
                self.backend_key)
        except UNAVAILABLE:
            if pending.fresh:  # it may have landed: a retry that finds it finds its own
                self.pending_open = dataclasses.replace(pending, fresh=False)
            raise
        if isinstance(opened, OpenRefused):
            if opened.reason == "missing":
                raise ContextNotFoundError(opened.ancestor or "")
            if opened.reason == "bad_path":
                raise TokenMalformedError(f"{opened.ancestor} is not at that place in the tree")
            if first:
                raise ContextExistsError(self.ctx_id)
            # A retried open whose first attempt went through before the connection broke.
            h = self.store.read_hash(self.path.root, self.ctx_id)
            if "q" in h:  # named by the open that landed
                attached()
            self._mark_open()
            self.activate(int(h.get("deadline") or 0))
            return
        self.coord.observe_redis_time(opened.created_ms)
        attached()
        self.apply_limits(opened.limits)
        self._mark_open()
        self.activate(opened.deadline_ms)
        if opened.stop_reason:
            self.handle_stop(opened.stop_reason)

    def apply_limits(self, limits: dict[str, int]) -> None:
        """Make ``config`` state the effective limits the open reported (a root's are
        those it asked for: no copy then)."""
        effective: dict[str, Any] = {}
        if "usd" in limits:
            effective["max_cost_usd"] = micro_to_usd(limits["usd"])
        if "steps" in limits:
            effective["max_steps"] = limits["steps"]
        if "retries" in limits:
            effective["max_retries_total"] = limits["retries"]
        update = {k: v for k, v in effective.items() if getattr(self.config, k) != v}
        if update:
            self.config = self.config.model_copy(update=update)

    def activate(self, deadline_ms: int) -> None:
        """The context exists in Redis: listen for its stops, and time its deadline."""
        self.deadline_ms = deadline_ms
        self.coord.register(self)
        if deadline_ms:
            self.coord.call_at_redis_ms(deadline_ms, self.deadline_reached)

    # -- stops ---------------------------------------------------------------------------

    def handle_stop(self, reason: str) -> None:
        """This context or an ancestor was stopped (heard here or by pub/sub)."""
        self.stopped = reason
        if reason in CANCELLING_REASONS:
            self.cancellation_token.cancel(reason)
        lifted = self.lifted
        if lifted is not None and reason in lifted[1] and time.monotonic() < lifted[0]:
            # a reserve's reply may tell of a stop the lift just ended: ask Redis
            self.coord.call_later(0, self.recheck_stop)

    def handle_lift(self, reasons: frozenset[str]) -> None:
        """Stops for ``reasons`` at this context or above were lifted (an operator raised
        a limit: Coordinator.set_limits): forget one heard, so the next call asks Redis."""
        self.lifted = (time.monotonic() + LIFT_RECHECK_S, reasons)
        if self.stopped in reasons:
            self.stopped = None

    def handle_warning(self, warning: BudgetWarning) -> None:
        """A level of the path reached a warn_at threshold (heard by pub/sub)."""
        if self.warnings is not None:
            self.warnings.hear(warning)

    def recheck_stop(self) -> None:
        """Forget the ceiling stop heard here unless Redis still stops the path with it."""
        try:
            still = self.store.read_stops([self.path])[0]
        except UNAVAILABLE:
            self.coord.call_later(0.5, self.recheck_stop)
            return
        if self.stopped in CEILING_REASONS and self.stopped not in still:
            self.stopped = None

    def deadline_reached(self) -> None:
        if self.closed:
            return
        try:
            reply = self.store.abort(self.path, StopReason.TIMEOUT, "deadline reached")
        except UNAVAILABLE:
            reply = None  # Redis will stop it itself at the next reserve (TIME > deadline)
        if reply is not None and reply.outcome == "early":
            # early by our clock estimate: try again when Redis agrees
            self.coord.call_later(max(0.001, reply.wait_ms / 1000), self.deadline_reached)
            return
        self.handle_stop(StopReason.TIMEOUT)

    def abort(self, detail: str) -> None:
        """Stop here at once (work in flight is cancelled), the durable abort queued
        first: any read this process makes once the stop shows carries it
        (read-your-writes). Before the open landed, the open queues it."""
        with self.abort_lock:
            self.owed_abort = detail
            if self.pending_open is None:
                self._queue_owed_abort()
        self.handle_stop(StopReason.ABORTED)

    def _mark_open(self) -> None:
        """The open landed: an abort made meanwhile is queued before it shows open."""
        with self.abort_lock:
            self._queue_owed_abort()
            self.pending_open = None

    def _queue_owed_abort(self) -> None:
        if self.owed_abort is not None:
            self.store.wire.queue(self.store.abort_op(self.path, StopReason.ABORTED,
                                                      self.owed_abort))
            self.owed_abort = None

    def send_abort(self) -> None:
        """Make the queued abort land in Redis (opening the context first if it was not
        yet), retrying in the background until it does."""
        try:
            self.ensure_open()
            self.store.flush(self.path.root)
        except UNAVAILABLE as exc:
            log.warning("abort of %s not yet durable (%s); retrying", self.ctx_id, exc)
            self.coord.call_later(0.5, self.send_abort)

    # -- events --------------------------------------------------------------------------

    def record_event(self, event: SafetyEvent) -> None:
        """Append an event to the context's event log (written with the next round trip)."""
        self.store.queue_event(self.path, event.model_dump_json())
        self.coord.schedule_flush()

    def event(self, event_type: str, reason: str, decision: Decision = Decision.HALT,
              **metadata: Any) -> SafetyEvent:
        """A SafetyEvent of the core itself (hook ``HOOK``) about this context."""
        return SafetyEvent(event_type=event_type, decision=decision, reason=reason, hook=HOOK,
                           request_id=self.metadata.request_id,
                           metadata={"chain_id": self.ctx_id, **metadata})

    def mirror_pipeline_events(self, pipeline: ShieldPipeline) -> None:
        """Copy the pipeline's events recorded since the last call to the event log."""
        events, self.mirrored = pipeline.events_since(self.mirrored)
        for event in events:
            self.record_event(event)

    # -- calls ---------------------------------------------------------------------------

    def next_call_id(self) -> tuple[str, bool]:
        """The next call's id and whether it is keyed: ``<ctx_id>:<n>`` once call keys
        are enabled, else a random one."""
        if self.call_seq is None:
            return f"{_id_prefix}{next(_id_seq):016x}", False
        return f"{self.ctx_id}:{next(self.call_seq)}", True
