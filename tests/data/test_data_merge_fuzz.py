"""The deep merge done in Lua (lib/data.lua's JSON reader, merge and writer) against the
pure-Python model, on generated JSON values: nesting, escapes, Unicode, big integers,
floats that need all their digits, empty lists and maps."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from tests.support.data_model import apply_merge

CONFIG = ExecutionConfig(max_cost_usd=5.0, max_steps=100, max_retries_total=5)

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
           | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8))
# Few map keys, so that the parent's and the child's maps share keys and merge deeply.
map_keys = st.sampled_from(["x", "y", 'q"\\', "\u00e9\u2028"])
values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(map_keys, kids, max_size=3),
    max_leaves=12)
containers = (st.lists(values, min_size=1, max_size=3)
              | st.dictionaries(map_keys, values, min_size=1, max_size=3))
# Both sides always hold both keys: every policy meets a conflict on each.
documents = st.fixed_dictionaries({"a": containers | scalars, "b": containers})


@settings(max_examples=100, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parent=documents, child=documents,
       policy=st.sampled_from(["keep_existing", "overwrite", "merge"]))
def test_merge_matches_the_model(coord: Coordinator, parent: dict[str, Any],
                                 child: dict[str, Any], policy: str) -> None:
    with ExecutionContext(CONFIG) as root:
        root.data.update(parent)
        kid = root.spawn_child()
        kid.data.update(child)
        res = kid.merge_into_parent(policy)
        expected, changes = apply_merge(parent, child, policy)
        got = root.data.to_dict()
        kid.close()
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)
    for k in expected:  # key order inside merged maps: the parent's first
        assert json.dumps(got[k]) == json.dumps(expected[k])
    assert {"added": list(res.added), "overwritten": list(res.overwritten),
            "merged": list(res.merged)} == changes
