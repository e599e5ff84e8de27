"""Budget warnings as the stop listener hears them (no Redis): the message lib/warnings.lua
publishes reaches the handles under its level, each callback hears a warning once
(whether it came by message, by the read-back at resubscription or at registration), a
callback that raises does not keep the others from it, and the fraction ctx.limits()
tells."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from coordinator import BudgetWarning
from coordinator.context.budget_warnings import WarningHub
from coordinator.core.amounts import remaining_usd_fraction
from coordinator.core.paths import Path
from coordinator.runtime.stop_listener import StopListener

HALF = BudgetWarning(chain_id="r", threshold=0.5, dimension="usd", remaining_usd=0.05,
                     remaining_steps=7)


@dataclass(eq=False)
class Handle:
    """A listener target that hears warnings as a ContextState does."""

    tree_path: Path
    warnings: WarningHub | None = field(default_factory=WarningHub)
    stops: list[str] = field(default_factory=list)

    def handle_stop(self, reason: str) -> None:
        self.stops.append(reason)

    def handle_warning(self, warning: BudgetWarning) -> None:
        if self.warnings is not None:
            self.warnings.hear(warning)

    def callback(self) -> list[BudgetWarning]:
        heard: list[BudgetWarning] = []
        assert self.warnings is not None
        self.warnings.add(heard.append)
        return heard


def _listener(*handles: Handle, recorded: list[BudgetWarning] | None = None) -> StopListener:
    listener = StopListener(lambda: None,  # type: ignore[arg-type, return-value]
                            lambda paths: [[] for _ in paths],
                            lambda paths: [list(recorded or []) for _ in paths])
    for h in handles:
        listener.add(h)
    return listener


def _message(level: str, warning: float = 0.5, dim: str = "usd") -> str:
    return json.dumps({"root": "r", "id": level, "warning": warning, "dim": dim,
                       "remaining": {"usd": 0.05, "steps": 7}})


def test_a_warning_reaches_the_handles_under_its_level_once_each() -> None:
    root, child, other = Handle(Path("r", ("r",))), Handle(Path("r", ("r", "c"))), \
        Handle(Path("x", ("x",)))
    at_root, at_child, at_other = root.callback(), child.callback(), other.callback()
    listener = _listener(root, child, other)
    for _ in range(2):  # the same warning twice: heard once
        listener.on_message(_message("r"))
    listener.on_message(_message("c", 0.8, "steps"))  # the child's level: not the root's
    assert at_root == [HALF]
    assert at_child == [HALF, HALF.model_copy(
        update={"chain_id": "c", "threshold": 0.8, "dimension": "steps"})]
    assert at_other == [] and root.stops == child.stops == []


def test_a_bad_message_is_ignored_and_a_raising_callback_spares_the_others() -> None:
    h = Handle(Path("r", ("r",)))

    def boom(_: BudgetWarning) -> None:
        raise RuntimeError("the agent's callback failed")

    assert h.warnings is not None
    h.warnings.add(boom)
    heard = h.callback()
    listener = _listener(h)
    for bad in ('{"root": "r", "id": "r", "warning": "half", "dim": "usd"}',
                '{"root": "r", "id": "r", "warning": 0.5, "dim": "tokens"}',
                '{"root": "r", "id": "r", "warning": 0.5, "dim": "usd", "remaining": 3}'):
        listener.on_message(bad)
    listener.on_message(_message("r"))
    assert heard == [HALF]


def test_warnings_read_back_are_heard_once_by_every_callback() -> None:
    h = Handle(Path("r", ("r",)))
    first = h.callback()
    eighty = HALF.model_copy(update={"threshold": 0.8})
    _listener(h, recorded=[HALF])._resync()  # resubscribed: what Redis recorded meanwhile
    assert first == [HALF]
    later: list[BudgetWarning] = []
    assert h.warnings is not None
    h.warnings.add(later.append, [HALF, eighty])  # registered: what the path recorded
    assert first == [HALF, eighty] and later == [HALF, eighty]
    h.handle_warning(eighty)  # its message, late: heard already
    assert first == later == [HALF, eighty]
    unhearing = Handle(Path("r", ("r",)), warnings=None)
    _listener(unhearing, recorded=[HALF])._resync()  # no callback: nothing read for it


def test_the_fraction_left_is_that_of_the_tightest_usd_ceiling() -> None:
    root = {"l:usd": "100000", "u:usd": "50000", "h:usd": "10000"}  # $0.04 of $0.10 left
    child = {"l:usd": "40000", "u:usd": "10000"}  # $0.03 of $0.04 left: the tightest
    assert remaining_usd_fraction([root, child]) == pytest.approx(0.75)
    assert remaining_usd_fraction([root]) == pytest.approx(0.40)
    assert remaining_usd_fraction([{"l:steps": "10"}]) is None
    assert remaining_usd_fraction([{"l:usd": "0"}]) == 0.0
