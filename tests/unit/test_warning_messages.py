"""Budget warnings as the stop listener hears them (no Redis): the message lib/warnings.lua
publishes reaches the handles under its level, each hears a warning once, a callback that
raises does not keep the others from it, and the fraction ctx.limits() tells."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from coordinator import BudgetWarning
from coordinator.context.budget_warnings import WarningHub, on_warning
from coordinator.core.amounts import remaining_usd_fraction
from coordinator.core.paths import Path
from coordinator.runtime.stop_listener import StopListener


@dataclass(eq=False)
class Handle:
    """A listener target that hears warnings as a ContextState does."""

    tree_path: Path
    warnings: WarningHub | None = None
    stops: list[str] = field(default_factory=list)

    def handle_stop(self, reason: str) -> None:
        self.stops.append(reason)

    def handle_warning(self, warning: BudgetWarning) -> None:
        if self.warnings is not None:
            self.warnings.hear(warning)


def _listener(*handles: Handle) -> StopListener:
    listener = StopListener(lambda: None, lambda paths: [[] for _ in paths])  # type: ignore[arg-type, return-value]
    for h in handles:
        listener.add(h)
    return listener


def _message(level: str, warning: float = 0.5, dim: str = "usd") -> str:
    return json.dumps({"root": "r", "id": level, "warning": warning, "dim": dim,
                       "remaining": {"usd": 0.05, "steps": 7}})


def test_a_warning_reaches_the_handles_under_its_level_once_each() -> None:
    root, child, other = Handle(Path("r", ("r",))), Handle(Path("r", ("r", "c"))), \
        Handle(Path("x", ("x",)))
    heard: dict[str, list[BudgetWarning]] = {"root": [], "child": [], "other": []}
    for name, h in (("root", root), ("child", child), ("other", other)):
        on_warning(h, heard[name].append)
    listener = _listener(root, child, other)
    for _ in range(2):  # the same warning twice: heard once
        listener.on_message(_message("r"))
    listener.on_message(_message("c", 0.8, "steps"))  # the child's level: not the root's
    expected = BudgetWarning(chain_id="r", threshold=0.5, dimension="usd",
                             remaining_usd=0.05, remaining_steps=7)
    assert heard["root"] == [expected]
    assert heard["child"] == [expected, expected.model_copy(
        update={"chain_id": "c", "threshold": 0.8, "dimension": "steps"})]
    assert heard["other"] == [] and root.stops == child.stops == []


def test_a_bad_message_is_ignored_and_a_raising_callback_spares_the_others() -> None:
    h = Handle(Path("r", ("r",)))
    heard: list[BudgetWarning] = []

    def boom(_: BudgetWarning) -> None:
        raise RuntimeError("the agent's callback failed")

    on_warning(h, boom)
    on_warning(h, heard.append)
    listener = _listener(h)
    for bad in ('{"root": "r", "id": "r", "warning": "half", "dim": "usd"}',
                '{"root": "r", "id": "r", "warning": 0.5, "dim": "tokens"}',
                '{"root": "r", "id": "r", "warning": 0.5, "dim": "usd", "remaining": 3}'):
        listener.on_message(bad)
    listener.on_message(_message("r"))
    assert [w.threshold for w in heard] == [0.5]
    with pytest.raises(TypeError):
        on_warning(h, "not a callable")  # type: ignore[arg-type]


def test_the_fraction_left_is_that_of_the_tightest_usd_ceiling() -> None:
    root = {"l:usd": "100000", "u:usd": "50000", "h:usd": "10000"}  # $0.04 of $0.10 left
    child = {"l:usd": "40000", "u:usd": "10000"}  # $0.03 of $0.04 left: the tightest
    assert remaining_usd_fraction([root, child]) == pytest.approx(0.75)
    assert remaining_usd_fraction([root]) == pytest.approx(0.40)
    assert remaining_usd_fraction([{"l:steps": "10"}]) is None
    assert remaining_usd_fraction([{"l:usd": "0"}]) == 0.0
