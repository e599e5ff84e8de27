"""Opening contexts alike many times (a @contained task's runs): what is computed once
per config must not blur contexts whose limits differ, nor let through invalid limits."""

from __future__ import annotations

import pytest

from coordinator import Coordinator, ExecutionConfig, ExecutionContext, TokenBudget
from coordinator.errors import InvalidConfigError


def test_children_opened_alike_each_get_their_own_limits(coord: Coordinator) -> None:
    cfg = ExecutionConfig(max_cost_usd=1.0, max_steps=40, max_retries_total=7)
    with ExecutionContext(cfg) as root:
        token = root.token
        first = [ExecutionContext.spawn_from_token(token, max_steps=3) for _ in range(2)]
        other = ExecutionContext.spawn_from_token(token, max_steps=5)
        inherited = ExecutionContext.spawn_from_token(token)
        assert [c.config.max_steps for c in first] == [3, 3]
        assert other.config.max_steps == 5
        assert (inherited.config.max_steps, inherited.config.max_retries_total) == (40, 7)
        assert len({c.chain_id for c in (*first, other, inherited)}) == 4
        for c in (*first, other, inherited):
            c.close()


def test_a_cached_valid_limit_does_not_admit_an_equal_invalid_one(coord: Coordinator) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=4,
                                          max_retries_total=1)) as root:
        root.spawn_child(max_steps=1).close()
        with pytest.raises(InvalidConfigError):
            root.spawn_child(max_steps=True)  # == 1, but not a step count


def test_unhashable_configs_still_open(coord: Coordinator) -> None:
    budget = TokenBudget(total=1000, provider_shares={"openai": TokenBudget(total=500)})
    cfg = ExecutionConfig(max_cost_usd=1.0, max_steps=4, max_retries_total=1,
                          token_budget=budget)
    with ExecutionContext(cfg) as root:
        child = root.spawn_child(token_budget=budget)
        assert child.get_snapshot().status == "running"
        child.close()
