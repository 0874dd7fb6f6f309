"""Dynamic loss scaling for fp16 mixed precision (Micikevicius et al. 2018, arXiv 1710.03740).

"Mixed Precision Training": keep fp32 master weights, compute in fp16, and multiply the loss by
a scale ``S`` before differentiating so that small gradients do not flush to zero in fp16 (whose
normal range ends at about 6e-5 and whose largest value is 65504). The gradients are divided by
``S`` in fp32 before the optimizer sees them. ``S`` is chosen dynamically: when any gradient is
inf/NaN the step is skipped (parameters and optimizer state stay as they were) and ``S`` is halved;
after ``growth_interval`` finite steps in a row ``S`` is doubled.

A step is::

    scaled = scale_loss(ls, loss)                       # differentiate this, not ``loss``
    grads, finite = unscale_and_check(ls, grads_of_scaled)
    updates, new_opt = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    params, opt_state = select_if_finite(finite, (new_params, new_opt), (params, opt_state))
    ls = update_scale(ls, finite)

Costs: one extra multiply of the loss; one fp32 divide and one ``isfinite`` reduction over all
gradients; one element-wise select over parameters and optimizer state (it reads the new and old
copy of every leaf: for Adam six parameter-sized reads and three writes per step); a skipped step
still pays for the full forward, backward and optimizer update and makes no progress. With
``growth_interval=2000`` and factor 2 the scale probes upward once per 2000 steps, so in steady
state at most about one step in 2000 is skipped.

Why not ``optax.apply_if_finite``: it is usable as the skip mechanism (with
``max_consecutive_errors`` set high), but it wraps the optimizer state in its own
``ApplyIfFiniteState`` (changing the checkpointed layout of every existing optimizer), keeps a
second not-finite counter next to ``DynamicScale.skipped``, repeats the finiteness check, and after
``max_consecutive_errors`` skips it *applies* the non-finite update, which loss scaling must never
do. ``select_if_finite`` leaves the optimizer untouched and also guards any other step state.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

MAX_SCALE = 2.0**32
"""Upper cap on the scale: the scale is fp32, the cap only keeps it finite and meaningful."""


class DynamicScale(NamedTuple):
    """Loss-scale state; a pytree of arrays (jit-able, checkpointable with orbax)."""

    scale: jax.Array  # float32 scalar: the current loss scale S
    good_steps: jax.Array  # int32 scalar: finite steps since the last change of S
    skipped: jax.Array  # int32 scalar: total steps skipped for non-finite gradients


def init_scale(initial: float = 2.0**15) -> DynamicScale:
    """A fresh state with ``scale = initial`` and zero counters."""
    return DynamicScale(
        scale=jnp.asarray(initial, jnp.float32),
        good_steps=jnp.zeros((), jnp.int32),
        skipped=jnp.zeros((), jnp.int32),
    )


def scale_loss(state: DynamicScale, loss: jax.Array) -> jax.Array:
    """``loss · S`` in float32 (differentiate this instead of the loss)."""
    return jnp.asarray(loss, jnp.float32) * state.scale


def unscale_and_check(state: DynamicScale, grads: Any) -> tuple[Any, jax.Array]:
    """Gradients of the scaled loss divided by ``S`` in float32, and whether all are finite."""
    unscaled = jax.tree.map(lambda g: jnp.asarray(g, jnp.float32) / state.scale, grads)
    finite = jnp.asarray(True)
    for g in jax.tree.leaves(grads):
        finite = finite & jnp.all(jnp.isfinite(g))
    return unscaled, finite


def update_scale(
    state: DynamicScale,
    finite: jax.Array,
    *,
    growth_interval: int = 2000,
    factor: float = 2.0,
    min_scale: float = 1.0,
) -> DynamicScale:
    """The state after a step whose gradients were ``finite`` (or not).

    Not finite: ``S ← max(S / factor, min_scale)``, ``good_steps ← 0``, ``skipped += 1``.
    Finite: ``good_steps += 1``; on reaching ``growth_interval``, ``S ← min(S · factor, 2**32)``
    and ``good_steps ← 0``. Branch-free (``jnp.where``), so it traces once under ``jit``.
    """
    good = state.good_steps + 1
    grow = finite & (good >= growth_interval)
    scale = jnp.where(
        finite,
        jnp.where(grow, jnp.minimum(state.scale * factor, MAX_SCALE), state.scale),
        jnp.maximum(state.scale / factor, min_scale),
    ).astype(jnp.float32)
    return DynamicScale(
        scale=scale,
        good_steps=jnp.where(finite & ~grow, good, 0).astype(jnp.int32),
        skipped=(state.skipped + jnp.where(finite, 0, 1)).astype(jnp.int32),
    )


def select_if_finite(finite: jax.Array, new_tree: Any, old_tree: Any) -> Any:
    """Leaf-wise ``where(finite, new, old)``: keeps params / optimizer state on a skipped step."""
    return jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_tree, old_tree)


class ScaledState(NamedTuple):
    """Optimizer state of :func:`with_dynamic_scale`: the loss scale next to the inner state."""

    loss_scale: DynamicScale
    inner: Any


def with_dynamic_scale(tx, initial: float = 2.0**15):
    """``tx`` whose state also carries the :class:`DynamicScale` (so checkpoints, restores and
    shardings of the optimizer state include it). ``update`` is ``tx``'s; the training step reads
    ``state.loss_scale`` before the backward pass and replaces it after (:func:`update_scale`)."""
    import optax

    def init(params):
        return ScaledState(init_scale(initial), tx.init(params))

    def update(updates, state, params=None):
        updates, inner = tx.update(updates, state.inner, params)
        return updates, ScaledState(state.loss_scale, inner)

    return optax.GradientTransformation(init, update)
