"""The memory model's per-layer figures computed once per layout, remat policy and model inside
a search (:func:`per_token_kept`), rather than for each of the tens of thousands of knob
combinations :func:`colossal_jax.auto.search.search` prices (:mod:`colossal_jax.auto.memory`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from colossal_jax.config.plan import Plan

_T = TypeVar("_T")

_PER_TOKEN: dict[tuple, tuple[object, Any]] | None = None
"""Per-token figures already computed inside :func:`per_token_kept` (:func:`per_token`)."""


@contextlib.contextmanager
def per_token_kept() -> Iterator[None]:
    """Inside the block, a layer's elements per token (the record's, the working set's) are
    computed once per layout, remat policy and model rather than for every knob combination
    (:func:`colossal_jax.auto.search.search` prices tens of thousands): the block must not
    change the figures they are read from (:mod:`colossal_jax.auto.layer_memory`'s)."""
    global _PER_TOKEN
    outer = _PER_TOKEN
    _PER_TOKEN = {} if outer is None else outer
    try:
        yield
    finally:
        _PER_TOKEN = outer


def _shape_key(plan: Plan, what: str) -> tuple:
    """What a layer's elements per token on one device depend on: the model (by identity: a
    search's variants share one), the layout (every parallel field but ZeRO's stage, which
    splits state, not activations), the remat policy, sequence, precision, platform and
    attention kernel."""
    c = plan.config
    layout = dict(vars(c.parallel), zero=0)  # a dict's copy: cheaper than reading each field
    fields = tuple(layout.values())
    return (
        what,
        id(plan.model),
        fields,
        c.remat,
        c.seq_len,
        c.precision,
        c.attention,
        plan.devices.platform,
    )


def per_token(plan: Plan, what: str, compute: Callable[[], _T]) -> _T:
    """``compute()``, kept by :func:`_shape_key` inside :func:`per_token_kept` (these figures
    change with the layout and remat policy alone). The model is kept beside the figure so
    that its ``id`` is not reused."""
    memo = _PER_TOKEN
    if memo is None:
        return compute()
    key = _shape_key(plan, what)
    hit = memo.get(key)
    if hit is not None and hit[0] is plan.model:
        return hit[1]
    value = compute()
    memo[key] = (plan.model, value)
    return value
