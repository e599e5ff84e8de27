"""What a context does at the edge of its budget instead of stopping (docs/degrade.md):
model ladders (:class:`Degrade`), and the checks of ``ExecutionConfig.final_reserve_usd``
and ``ExecutionConfig.warn_at``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import field_validator

from .models_base import MAX_LABEL, _Frozen, in_range

MAX_RUNGS = 8
"""The most models one ladder names besides the requested one."""
MAX_WARNINGS = 8
"""The most thresholds ``warn_at`` takes."""


class Degrade(_Frozen):
    """Model ladders: a call naming a key of ``ladder`` runs on the first model of
    ``[key] + ladder[key]`` whose worst case fits at every level of its path, while at
    least ``below`` of every ceiling on the path remains; below that, on the cheapest
    that fits. reserve.lua chooses atomically with the reservation."""

    ladder: Mapping[str, tuple[str, ...]]
    """Requested model -> the models to fall back to, most capable first."""
    below: float = 0.2
    """The fraction of a ceiling (remaining before the call: the ceiling minus spend
    and holds) under which calls take the cheapest rung that fits."""

    @field_validator("ladder", mode="before")
    @classmethod
    def _ladder(cls, v: Any) -> dict[str, tuple[str, ...]]:
        if not isinstance(v, Mapping) or not v:
            raise ValueError(f"ladder must be a non-empty mapping of model -> fallback "
                             f"models; got {v!r}")
        out: dict[str, tuple[str, ...]] = {}
        for model, rungs in v.items():
            _check_model(model)
            if isinstance(rungs, str) or not isinstance(rungs, Sequence) or not rungs:
                raise ValueError(f"ladder[{model!r}] must be a non-empty list of models; "
                                 f"got {rungs!r}")
            if len(rungs) > MAX_RUNGS:
                raise ValueError(f"ladder[{model!r}] names {len(rungs)} models; at most "
                                 f"{MAX_RUNGS}")
            for rung in rungs:
                _check_model(rung)
            if len({model, *rungs}) != len(rungs) + 1:
                raise ValueError(f"ladder[{model!r}] names a model twice")
            out[model] = tuple(rungs)
        return out

    @field_validator("below", mode="before")
    @classmethod
    def _below(cls, v: Any) -> float:
        if not in_range(v, 0.0, 1.0) or v == 1:
            raise ValueError(f"below must be a fraction from 0 to less than 1; got {v!r}")
        return float(v)

    def __hash__(self) -> int:
        return hash((tuple(self.ladder.items()), self.below))

    def rungs(self, model: str | None) -> tuple[str, ...]:
        """The models a call naming ``model`` may run on, requested first (empty when
        ``model`` heads no ladder)."""
        fallbacks = self.ladder.get(model) if model is not None else None
        return (model, *fallbacks) if fallbacks and model is not None else ()


def _check_model(model: object) -> None:
    if not isinstance(model, str) or not model or len(model) > MAX_LABEL \
            or not model.isprintable():
        raise ValueError(f"a model must be a printable name of 1 to {MAX_LABEL} "
                         f"characters; got {model!r}")


def check_warn_at(v: Any) -> tuple[float, ...]:
    """``warn_at``: distinct fractions from 0 to less than 1, kept in ascending order."""
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
        raise ValueError(f"warn_at must be a sequence of fractions; got {v!r}")
    if len(v) > MAX_WARNINGS:
        raise ValueError(f"warn_at takes at most {MAX_WARNINGS} thresholds; got {len(v)}")
    for t in v:
        if not in_range(t, 0.0, 1.0) or t == 1:
            raise ValueError(f"warn_at thresholds must be fractions from 0 to less than 1; "
                             f"got {t!r}")
    if len(set(v)) != len(v):
        raise ValueError(f"warn_at names a threshold twice; got {tuple(v)!r}")
    return tuple(sorted(float(t) for t in v))


def to_ppm(fraction: float) -> int:
    """A fraction in parts per million (how the scripts compare it): rounded down."""
    return math.floor(fraction * 1_000_000)
