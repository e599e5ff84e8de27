"""Bad input to context data gets a typed error and changes nothing already recorded."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from coordinator.data import (
    CheckpointNotFoundError,
    ContextDataError,
    DataKeyError,
    DataKeys,
    DataLimits,
    DataTooLargeError,
    DataValueError,
    InvalidCheckpointError,
    IsolationLevelError,
    MergePolicyError,
)
from coordinator.data.context_data import set_data_limits
from coordinator.errors import BudgetCoordinatorError

CONFIG = ExecutionConfig(max_cost_usd=5.0, max_steps=100, max_retries_total=5)


class _Obj:
    pass


@pytest.fixture
def root(coord: Coordinator) -> Iterator[ExecutionContext]:
    with ExecutionContext(CONFIG) as ctx:
        ctx.data.update({"keep": {"a": [1, 2]}, "n": 1})
        yield ctx


def _state(coord: Coordinator, ctx: ExecutionContext) -> tuple[Any, ...]:
    dk = DataKeys(coord.keyspace)
    return (coord.client.hgetall(dk.data(ctx.root_id, ctx.chain_id)),
            coord.client.hgetall(dk.meta(ctx.root_id, ctx.chain_id)))


@pytest.mark.parametrize("value,reason", [
    ({1, 2}, "set"), ((1, 2), "tuple"), (_Obj(), "_Obj"), (math.nan, "nan"),
    (math.inf, "inf"), ({"a": {1: "x"}}, "map key 1"), ([b"bytes"], "bytes"),
    ("\ud800", "surrogate"), ({"ok": [float("-inf")]}, "-inf"),
])
def test_values_that_are_not_json_are_refused(coord: Coordinator, root: ExecutionContext,
                                              value: Any, reason: str) -> None:
    before = _state(coord, root)
    with pytest.raises(DataValueError) as err:
        root.data.set("k", value)
    assert reason in str(err.value) and err.value.key == "k"
    with pytest.raises(DataValueError):  # all or nothing: the good key is not written
        root.data.update({"good": 1, "bad": value})
    assert _state(coord, root) == before


def test_too_deep_is_refused(coord: Coordinator, root: ExecutionContext) -> None:
    value: Any = 1
    for _ in range(150):
        value = [value]
    with pytest.raises(DataValueError, match="deeper"):
        root.data.set("deep", value)


@pytest.mark.parametrize("key", ["", "x" * 257, 7, None, ("a",), "\udcff"])
def test_bad_keys_are_refused(coord: Coordinator, root: ExecutionContext, key: Any) -> None:
    before = _state(coord, root)
    for op in (lambda: root.data.set(key, 1), lambda: root.data.get(key),
               lambda: root.data.delete(key), lambda: root.merge_into_parent(keys=[key])):
        with pytest.raises(DataKeyError) as err:
            op()
        assert err.value.limit == 256
    assert _state(coord, root) == before
    root.data.set("x" * 256, 1)  # the longest key is fine


def test_oversized_value_and_context(coord: Coordinator, root: ExecutionContext) -> None:
    before = _state(coord, root)
    with pytest.raises(DataTooLargeError) as err:
        root.data.set("big", "x" * (1 << 20))  # two quotes more than 1 MiB
    assert err.value.limit == 1 << 20 and err.value.size == (1 << 20) + 2
    assert _state(coord, root) == before
    set_data_limits(coord, DataLimits(max_context_bytes=1000))
    with pytest.raises(DataTooLargeError) as err2:
        root.data.update({"a": "y" * 500, "b": "z" * 500})
    assert err2.value.limit == 1000 and err2.value.size > 1000
    assert _state(coord, root) == before
    root.data.set("a", "y" * 500)  # what fits is written
    root.data.set("a", "y" * 10)  # replacing a value counts its new size only
    root.data.set("b", "z" * 500)
    # a merge that would overflow the parent changes nothing
    child = root.spawn_child()
    child.data.set("c", "w" * 600)
    parent_before = _state(coord, root)
    with pytest.raises(DataTooLargeError):
        child.merge_into_parent()
    assert _state(coord, root) == parent_before
    child.close()


def test_merged_value_over_the_value_limit(coord: Coordinator, root: ExecutionContext
                                           ) -> None:
    set_data_limits(coord, DataLimits(max_value_bytes=100))
    root.data.set("l", ["a" * 60])
    child = root.spawn_child()
    child.data.set("l", ["b" * 60])
    child.data.set("other", 1)
    before = _state(coord, root)
    with pytest.raises(DataTooLargeError) as err:
        child.merge_into_parent("merge")
    assert err.value.key == "l"
    assert _state(coord, root) == before  # not even "other" was added
    child.close()


def test_bad_policy_isolation_and_names(coord: Coordinator, root: ExecutionContext) -> None:
    kids = coord.client.smembers(coord.keyspace.kids(root.root_id, root.chain_id))
    with pytest.raises(IsolationLevelError) as iso_err:
        root.spawn_child(isolation="private")
    assert iso_err.value.allowed == ("inherit", "isolated", "sandboxed")
    with pytest.raises(TypeError):
        root.spawn_child(step_name=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        root.spawn_child(step_name="")
    with pytest.raises(TypeError):
        root.parallel("AB")  # type: ignore[arg-type]
    # nothing was opened
    assert coord.client.smembers(coord.keyspace.kids(root.root_id, root.chain_id)) == kids
    child = root.spawn_child()
    child.data.set("k", 1)
    before = _state(coord, root)
    with pytest.raises(MergePolicyError) as err:
        child.merge_into_parent("union")
    assert err.value.allowed == ("keep_existing", "overwrite", "merge")
    with pytest.raises(TypeError):
        child.merge_into_parent(keys="k")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        root.data.update([("k", 1)])  # type: ignore[arg-type]
    assert _state(coord, root) == before
    child.close()


def test_bad_checkpoints(coord: Coordinator, root: ExecutionContext) -> None:
    for bad in ("", "a b", "x" * 129, "{x}", 5):
        with pytest.raises(InvalidCheckpointError):
            root.checkpoint(bad)  # type: ignore[arg-type]
    with pytest.raises(CheckpointNotFoundError):
        ExecutionContext.resume("never-taken", CONFIG)
    for doc in ("not json", "{}", '{"format": 1, "stack": []}',
                '{"format": 1, "stack": [{"metadata": {}}]}', [1]):
        with pytest.raises(InvalidCheckpointError):
            ExecutionContext.deserialize(doc, CONFIG)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        root.with_checkpointing(0)
    assert issubclass(ContextDataError, BudgetCoordinatorError)


def test_redis_away_is_a_typed_error() -> None:
    """Reads and writes of context data fail closed, with BackendUnavailableError."""
    from coordinator.embedded import RedisServer
    from coordinator.errors import BackendUnavailableError
    from tests.support.procs import TEST_KEYS

    server = RedisServer().start()
    coord = Coordinator.from_url(server.url, token_keys=TEST_KEYS)
    try:
        ctx = ExecutionContext(CONFIG, coordinator=coord)
        ctx.data.set("k", 1)
        server.kill()
        for op in (lambda: ctx.data.get("k"), lambda: ctx.data.set("k", 2),
                   lambda: ctx.checkpoint("away"), lambda: ctx.data.to_dict()):
            with pytest.raises(BackendUnavailableError):
                op()
    finally:
        server.stop()
        coord.close()


def test_bad_capability_tags_and_plan_linkage() -> None:
    from coordinator import ChainMetadata, WrapOptions
    from coordinator.errors import InvalidConfigError

    assert WrapOptions(tags=["needs-context"]).tags == ("needs-context",)
    for bad in (["x" * 257], [f"t{i}" for i in range(65)], [3]):
        with pytest.raises(InvalidConfigError):
            WrapOptions(tags=bad)
    with pytest.raises(InvalidConfigError):
        ChainMetadata(request_id="r", chain_id="c", intent_ids=("x" * 257,))
    with pytest.raises(InvalidConfigError):
        ChainMetadata(request_id="r", chain_id="c", plan_id="p" * 257)
