"""The weights of the memory model's terms (:func:`colossal_jax.auto.memory.memory_terms`) in
the predicted peak: one set for ``none``, ``full`` and ``offload`` (:data:`MEMORY_COEF`), and
sets of their own for the policies that keep matmul outputs (:data:`REMAT_COEF`), fitted to
compiled peaks (docs/planner.md)."""

from __future__ import annotations

MEMORY_COEF = {
    "state": 1.0,
    "grads": 1.0,
    "kept": 1.0,
    "working": 1.0,
    "working_rsa": 1.0,
    "pipe_working_rsa": 1.0,
    "working_recomputed": 1.0,
    "working_policy": 1.0,
    "kept_1d_whole": 0.0,
    "pipe_recomputed_1d_whole": 0.86,
    "pipe_kept": 1.0,
    "pipe_body": 2.48,
    "pipe_body_split": 1.38,
    "pipe_ring": 0.75,
    "pipe_chunk_grad": 0.59,
    "pipe_grad_slots": 0.59,
    "logits": 1.0,
}
"""The weight of each memory term (:func:`memory_terms`) in the predicted peak (under ``none``,
``full`` and ``offload``; :data:`REMAT_COEF` has the policies that keep matmul outputs). All are
1 but ``kept_1d_whole`` (0: under ``none`` the traced share is exact) and a pipeline's: a
tick's body, which holds a few of its chunk's residual sets at once (made, copied out of the
record buffers, their gradients): 2.48 chunks with a fused backward, 1.38 with a
split one (its B and W each run half the backward); under ring attention 0.75 of the ring's
score blocks for each layer of the chunk (beside the ring kernel's own working set); a tick's
chunk gradient and the schedule's gradient slots, 0.59 each (fitted below 1: the compiled peak
does not hold all of either at once). The ring's weight is non-negative least squares on the
compiled memory of the 4-layer, 256-wide GPT's pipelined plans on 8 CPU devices (two sweeps, 32
plans, 2026-11-27); the other four on all 280 pipelined plans of its 320 (2026-11-29; that fit
alone sets the ring's to 0, which leaves llama-tiny's pipelined ring plans up to 12.9% under).
llama-tiny is held out (docs/planner_log.md, "Memory"). ``pipe_recomputed_1d_whole``, 0.86: least
squares on the compiled memory of the GPT's five 1D pipelined ``full`` plans with one-layer
chunks in the stored sweeps (2026-12-08; they were 6–26% under without it, 4.7% over to 4.8% under
with it); held out, the 8-layer GPT in eight interleaved one-layer chunks, 10.8% under without
it, 0.3% over with it."""


REMAT_COEF: dict[str, dict[str, float]] = {
    "dots": {
        "kept": 0.97,
        "kept_1d_whole": 0.68,
        "pipe_kept": 0.90,
        "pipe_body": 1.91,
        "pipe_body_split": 1.37,
        "pipe_ring": 0.02,
        "pipe_chunk_grad": 0.67,
        "pipe_grad_slots": 1.51,
        "working": 1.06,
        "working_rsa": 1.14,
        "pipe_working_rsa": 1.57,
        "working_recomputed": 1.11,
    },
    "selective": {
        "kept": 0.96,
        "kept_1d_whole": 1.09,
        "pipe_kept": 0.88,
        "pipe_body": 1.79,
        "pipe_body_split": 1.05,
        "pipe_ring": 1.35,
        "pipe_chunk_grad": 0.83,
        "pipe_grad_slots": 0.78,
        "working": 0.99,
        "working_rsa": 0.09,
        "pipe_working_rsa": 0.94,
        "working_recomputed": 0.80,
    },
}
"""The weights of :func:`memory_terms`' terms under the policies that keep matmul outputs,
where they differ from :data:`MEMORY_COEF`'s (``none``'s, fitted on ``none`` plans): a
compiled peak is the largest of the program's live sets, not the sum of the terms, and which
buffers meet at it differs by policy. Least squares on the relative error against the compiled
memory of the 4-layer, 256-wide GPT's ZeRO-0 plans on 8 CPU devices, every stored sweep's
(2026-11-29 on; 248 ``selective`` plans, 153 ``dots``), one set per policy (2026-12-07): the
misses over 10% fall from 56 to 1 (``selective``) and from 7 to 0 (``dots``); five-fold
cross-validated, 2 and 3. llama-tiny is held out (docs/planner_log.md). Read: under
``selective`` the flat ring self-attention's rows (``working_rsa``, 0.09) are not at its
peak — the policy recomputes them in the backward, and the peak falls where they are not —
and a recomputed layer (``working_recomputed``) counts 0.8; 1D's whole ``[tokens, h]``
outputs (``kept_1d_whole``) count about once more under ``selective``, two-thirds more under
``dots``. Like :data:`MEMORY_COEF`'s, fitted on CPU compiles and applied on every platform
(the GPU's own peak differs in what the CPU holds in fp32; ``plan.py --verify`` compiles)."""


def weight(term: str, remat: str) -> float:
    """The weight of a memory term in the predicted peak under a remat policy:
    :data:`REMAT_COEF`'s where it has one, else :data:`MEMORY_COEF`'s."""
    return REMAT_COEF.get(remat, {}).get(term, MEMORY_COEF[term])


def weighted(terms: dict[str, float], remat: str) -> float:
    """The peak of ``terms`` (:func:`colossal_jax.auto.memory.memory_terms`): their sum
    weighted by :func:`weight`."""
    return sum(weight(k, remat) * v for k, v in terms.items())
