"""Fused attention for the local block: cuDNN flash attention on GPUs, XLA elsewhere, or the
plain-JAX blockwise kernel anywhere (``--attention blockwise``,
:mod:`colossal_jax.sequence.blockwise`).

``jax.nn.dot_product_attention`` (layout ``[b, s, heads, head_dim]``) dispatches to cuDNN's fused
flash-attention kernel (Dao et al. 2022, arXiv 2205.14135) with ``implementation="cudnn"``: the
``[s, s]`` score matrix lives in on-chip memory only, so activation memory is ``O(b·s·h)``.
cuDNN needs fp16/bf16 inputs on an NVIDIA GPU; in every other case this module falls back to the
position-masked reference :func:`colossal_jax.sequence.local.dot_product_attention`.

The fused kernel masks by *index* (``is_causal``), so it is only used where token order equals
position order: no sequence split (``seq_mode none``) and Ulysses (whose all-to-all rebuilds the
whole sequence in order). Ring attention's zigzag blocks are masked by positions and keep the
reference block computation.

Padding (keys with negative positions, :mod:`colossal_jax.sequence.local`) reaches cuDNN as
per-row key lengths (``key_value_seq_lengths`` = the number of non-negative key positions), which
is exact when each row's padding is *trailing* (right padding, the usual batch layout). cuDNN
takes an arbitrary mask only as a dense ``[b, 1, s, s]`` bias, which would give back the memory
the fused kernel saves, so left or interleaved padding needs ``--attention xla``.

Communication: none. Memory: cuDNN ``O(b·s·h)``; blockwise ``O(b·s·h)`` plus one
``[b, a, s, 128]`` score block while it runs; fallback ``O(b·a·s²)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from colossal_jax.sequence.blockwise import blockwise_attention
from colossal_jax.sequence.local import dot_product_attention

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "blockwise")
_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def resolve(implementation: str, dtype, backend: str | None = None) -> str:
    """``"cudnn"``, ``"blockwise"`` or ``"xla"`` for a requested ``implementation`` and input
    ``dtype``.

    ``auto`` picks cuDNN on a GPU backend for half-precision inputs. ``cudnn`` asked for where it
    cannot run raises ``ValueError`` naming why.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"attention implementation {implementation!r} is not one of "
            f"{', '.join(IMPLEMENTATIONS)}"
        )
    backend = backend or jax.default_backend()
    half = jnp.dtype(dtype) in _HALF
    if implementation in ("xla", "blockwise"):
        return implementation
    if implementation == "cudnn":
        if backend != "gpu":
            raise ValueError(
                f"--attention cudnn needs a GPU, this backend is {backend!r}; use auto"
            )
        if not half:
            raise ValueError(
                f"--attention cudnn needs bf16 or fp16 inputs, got {jnp.dtype(dtype).name}; "
                "use --precision bf16 or --attention auto"
            )
        return "cudnn"
    return "cudnn" if backend == "gpu" and half else "xla"


def fused_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_pos: jax.Array,
    k_pos: jax.Array,
    *,
    causal: bool = True,
    implementation: str = "auto",
) -> jax.Array:
    """Attention on ``[b, s, a, d]`` blocks whose positions are in index order, any padding
    trailing (see module)."""
    kernel = resolve(implementation, q.dtype)
    if kernel == "blockwise":
        return blockwise_attention(q, k, v, q_pos, k_pos, causal=causal)
    if kernel == "cudnn":
        kv_lengths = jnp.sum(k_pos >= 0, axis=1, dtype=jnp.int32)  # trailing padding: exact
        return jax.nn.dot_product_attention(
            q, k, v, is_causal=causal, key_value_seq_lengths=kv_lengths, implementation="cudnn"
        )
    return dot_product_attention(q, k, v, q_pos, k_pos, causal=causal)
