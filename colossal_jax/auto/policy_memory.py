"""What a remat policy's recomputed intermediates add to a training step's backward, per
model family: the compiled excess of its peak over ``none``'s, less the difference of what each
keeps (:func:`policy_working`). The memory model (:mod:`colossal_jax.auto.memory`) counts it
as ``working_policy`` in plans without a pipeline. Read off the family's own code like the rest
of a layer's figures (:mod:`colossal_jax.auto.layer_memory`), and kept on disk beside them."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from colossal_jax.analysis.compile_only import compile_for_layer_figures
from colossal_jax.auto.layer_memory import (
    STACK,
    Working,
    abstract_stack,
    figure_key,
    kept,
    on_cpu,
)

RECOMPUTING = ("selective", "dots", "full")
"""The policies :func:`policy_working` compiles: those that recompute on the device
(``offload`` keeps ``none``'s working set, its layer input on the host, for which the
one-device CPU compile has no memory space)."""

POLICY_SHAPES = ((2, 1), (4, 1), (8, 2))
"""``(sequences, divisor of the sequence length)`` of :func:`policy_working`'s three compiles:
``2S`` and ``4S`` tokens at ``S`` (their difference is per token), ``4S`` at ``S/2`` (the
score rows halve)."""


@functools.lru_cache(maxsize=64)
def policy_working(model: Any, seq_len: int, remat: str) -> Working:
    """What a training step's backward holds at its peak under ``remat`` beyond what it holds
    under ``none``, less what each keeps
    (:func:`~colossal_jax.auto.layer_memory.kept`): the intermediates the policy recomputes,
    live beside the gradients, as a :class:`Working` (fp32 elements, each part at least 0;
    ``none``, ``offload`` and other policies: nothing). From compiles of the gradient of
    :data:`STACK` layers *and the head's loss* (:func:`_step_temp_elements`) under each
    policy at the three :data:`POLICY_SHAPES`, solved like
    :func:`~colossal_jax.auto.layer_memory.working`. The head belongs in
    them: where the step's peak falls decides whether the recomputed values are live there.
    On the 4-layer, 256-wide GPT at 256 tokens the excess per token is about none under
    ``selective``, 903 elements under ``dots`` and 3,206 under ``full`` (the stack alone
    compiles to 1,346 / 2,430 / 6,022); on llama-tiny 4,232 under each (one score row: its
    softmax is recomputed in the backward), as the stack alone gives too. Read from the disk
    cache when it holds it."""
    from colossal_jax.auto.cache import Cache

    if remat not in RECOMPUTING:
        return Working(0.0, 0.0, 0.0)
    key = figure_key(model, seq_len, f"policy/{remat}")
    cache = Cache("layer")
    hit = cache.get(key)
    if hit is not None:
        return Working(**hit)
    a, s = model.n_head, seq_len
    k_p, k_n = kept(model, remat), kept(model, "none")

    def excess(batch: int, divisor: int) -> float:
        """The policy's temporaries beyond ``none``'s, less the difference of what they keep."""
        seq = max(1, s // divisor)
        keep = (k_p.other - k_n.other) + (k_p.scores - k_n.scores) * a * seq
        delta = _step_temp_elements(model, batch, seq, remat)
        delta -= _step_temp_elements(model, batch, seq, "none")
        return delta - STACK * batch * seq * keep

    (b1, _), (b2, _), (b3, d3) = POLICY_SHAPES
    e1, e2 = excess(b1, 1), excess(b2, 1)
    per_token = max(0.0, (e2 - e1) / ((b2 - b1) * s))  # other + scores·a·S
    fixed = max(0.0, e1 - per_token * b1 * s)
    scores = 0.0
    half = max(1, s // d3)
    if half < s and per_token > 0:
        per_token_half = (excess(b3, d3) - fixed) / (b3 * half)
        # the split, within the total at S: neither part below 0
        scores = min(max(0.0, (per_token - per_token_half) / (a * (s - half))), per_token / (a * s))
    result = Working(per_token - scores * a * s, scores, fixed)
    meta = {"model": repr(model), "seq_len": seq_len, "remat": remat}
    cache.put(key, dataclasses.asdict(result), meta)
    return result


@functools.lru_cache(maxsize=256)
def _step_temp_elements(model: Any, batch: int, seq: int, remat: str) -> float:
    """fp32 elements of the compiled temporaries of the gradient of :data:`STACK` layers of
    ``model`` and its head's loss (``head_loss`` of the stack's output: logits, cross-entropy)
    at ``batch × seq`` under ``remat``, compiled for one CPU device: the gradient of the
    parameters alone, as in a training step, where the input's gradient is consumed inside
    the step (by the embedding's backward) rather than returned. Taking the input's gradient
    out as a result moves llama-tiny's peak: its ``selective`` excess compiles to 8 elements a
    token so, 4,232 without, as the whole model (embedding included) compiles."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import SingleDeviceSharding

    from colossal_jax.layers.stack import StackOptions, use_stack_options
    from colossal_jax.parallel.remat import RematPolicy

    graphdef, params = abstract_stack(model, STACK)
    policy = RematPolicy(remat).policy()

    def loss(params, x, positions, targets):
        with use_stack_options(StackOptions(remat=policy)):
            m = nnx.merge(graphdef, params)
            total, count = m.head_loss(m.blocks(x, positions), targets, jnp.ones(targets.shape))
        return total / count

    on = SingleDeviceSharding(jax.devices("cpu")[0])
    x = jax.ShapeDtypeStruct((batch, seq, model.n_embd), jnp.float32, sharding=on)
    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=on)
    params = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=on), params)
    with on_cpu():
        lowered = jax.jit(jax.grad(loss)).lower(params, x, ids, ids)
    compiled = compile_for_layer_figures(lowered)
    return compiled.memory_analysis().temp_size_in_bytes / 4
