"""The demo's two scenarios (a ceiling reached by twelve sub-agents, an abort of six
running ones) and the live progress line they print."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, TextIO

from ..context.execution import ExecutionContext
from ..models import ChainMetadata, ExecutionConfig
from ..runtime.coordinator import Coordinator

ShowTree = Callable[[Coordinator, str], str]
"""Renders a tree as text (budgetctl passes its `tree` view: the demo never imports the
CLI)."""

ROLES = ["planner", "researcher", "critic", "coder", "tester", "writer",
         "summarizer", "fact-checker", "translator", "reviewer", "analyst", "editor"]


class _Progress:
    """One status line, redrawn in place on a terminal."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.last = 0.0

    def show(self, text: str) -> None:
        if self.tty:
            self.out.write("\r\x1b[2K" + text)
            self.out.flush()
        elif time.monotonic() - self.last >= 1.0:
            self.out.write(text + "\n")
            self.last = time.monotonic()

    def done(self) -> None:
        if self.tty:
            self.out.write("\n")


def _bar(used: int, limit: int, width: int = 24) -> str:
    filled = min(width, round(width * used / limit)) if limit else 0
    return "█" * filled + "░" * (width - filled)


def _kids(coord: Coordinator, root: ExecutionContext) -> list[dict[str, str]]:
    return [coord.store.read_hash(root.root_id, cid)
            for cid in coord.store.children(root.root_id, root.chain_id)]


def _refusal(coord: Coordinator, cid: str, at: str) -> str | None:
    """Why a finished sub-agent's call was refused by the ceiling of ``at``, if it was."""
    snap = ExecutionContext.load_snapshot(cid, coord)
    for event in reversed(snap.events):
        if event.decision.value == "HALT" and event.metadata.get("stopped_at") == at:
            return event.reason
    return None


def _watch(coord: Coordinator, root: ExecutionContext, expected: int, out: TextIO,
           timeout_s: float = 90.0) -> list[dict[str, str]]:
    """Show live progress until every sub-agent's context is finished."""
    progress = _Progress(out)
    t0 = time.monotonic()
    announced = False
    seen: set[str] = set()
    kids: list[dict[str, str]] = []
    while time.monotonic() - t0 < timeout_s:
        h = coord.store.read_hash(root.root_id, root.chain_id)
        ids = coord.store.children(root.root_id, root.chain_id)
        kids = [coord.store.read_hash(root.root_id, cid) for cid in ids]
        used, held, limit = (int(h.get(k) or 0) for k in ("u:usd", "h:usd", "l:usd"))
        done = [cid for cid, k in zip(ids, kids, strict=True)
                if k.get("status") in ("closed", "stopped")]
        progress.show(
            f"[{time.monotonic() - t0:5.1f}s] {_bar(used, limit)} ${used / 1e6:.4f} of "
            f"${limit / 1e6:.2f} (+${held / 1e6:.4f} reserved)  agents: "
            f"{len(kids) - len(done)} running, {len(done)} finished, "
            f"{expected - len(kids)} queued")
        if not announced and h.get("status") == "stopped":
            progress.done()
            print(f"  >> orchestrator stopped: {h.get('reason')} ({h.get('detail')}); "
                  f"every further call in the tree is refused", file=out)
            announced = True
        for cid in done:
            if cid in seen or announced:
                continue
            seen.add(cid)
            why = _refusal(coord, cid, root.chain_id)
            if why:
                progress.done()
                print(f"  >> ceiling reached: the orchestrator's ceiling refused a call of "
                      f"sub-agent {cid} before it ran ({why})", file=out)
                announced = True
        if len(kids) == expected and len(done) == expected:
            break
        time.sleep(0.2)
    progress.done()
    return kids


def _orchestrator(coord: Coordinator, max_cost_usd: float) -> ExecutionContext:
    """A fresh root context for one scenario."""
    meta = ChainMetadata(request_id=uuid.uuid4().hex, chain_id=f"demo-{uuid.uuid4().hex[:8]}",
                         service="orchestrator")
    return ExecutionContext(ExecutionConfig(max_cost_usd=max_cost_usd, max_steps=500,
                                            max_retries_total=20),
                            metadata=meta, coordinator=coord)


def scenario_ceiling(coord: Coordinator, sub_agent: Any, out: TextIO,
                     show_tree: ShowTree) -> None:
    print("\n== Scenario 1: 12 sub-agents (gpt-4o, cap $0.12 each) under one $0.60 "
          "ceiling, on 2 Celery workers", file=out)
    with _orchestrator(coord, 0.60) as root:
        for role in ROLES:
            sub_agent.delay(role, 6, "gpt-4o", 0.4)
        _watch(coord, root, len(ROLES), out)
        snap = root.get_snapshot()
    print(f"  spent ${snap.cost_usd_accumulated:.6f} of ${snap.max_cost_usd:.2f} in "
          f"{snap.step_count} calls ({snap.tokens.total:,} tokens); reserved now: "
          f"${snap.cost_usd_reserved:.6f}", file=out)
    print("\n" + show_tree(coord, root.chain_id), file=out)


def scenario_abort(coord: Coordinator, sub_agent: Any, out: TextIO,
                   show_tree: ShowTree) -> None:
    print("\n== Scenario 2: abort the orchestrator while 6 sub-agents are mid-call "
          "(claude-sonnet-4, ~1.5 s per call)", file=out)
    with _orchestrator(coord, 5.00) as root:
        for role in ROLES[:6]:
            sub_agent.delay(role, 10, "claude-sonnet-4", 1.5)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            kids = _kids(coord, root)
            if len(kids) == 6 and all(int(k.get("h:usd") or 0) > 0 for k in kids):
                break
            time.sleep(0.05)
        time.sleep(0.8)
        abort_ms = coord.store.server_time_ms()
        root.abort("operator pressed stop")
        print("  >> abort sent: 'operator pressed stop'", file=out)
        kids = _watch(coord, root, 6, out, timeout_s=30)
        ended = [int(k.get("closed_ms") or k.get("stopped_ms") or 0) for k in kids]
        snap = root.get_snapshot()
    if ended and all(ended):
        print(f"  >> the abort reached all {len(kids)} running sub-agents on 2 workers; "
              f"the last one ended {max(ended) - abort_ms} ms after abort()", file=out)
    print(f"  spent ${snap.cost_usd_accumulated:.6f} (interrupted calls settled once, at "
          f"their estimate); reserved now: ${snap.cost_usd_reserved:.6f}", file=out)
    print("\n" + show_tree(coord, root.chain_id), file=out)
