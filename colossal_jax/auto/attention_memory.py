"""What a plan's attention keeps per token and layer for the backward, and holds while it runs:
which kernel runs (cuDNN's fused flash attention, the blockwise kernel, ring attention or XLA's
reference attention) decides whether the ``a·s`` score rows are stored (:func:`scores_per_token`).
A part of the planner's memory model (:mod:`colossal_jax.auto.memory`)."""

from __future__ import annotations

from colossal_jax.auto.per_device import blockwise_attention, ring_attention
from colossal_jax.config.plan import Plan


def flash_attention(plan: Plan) -> bool:
    """Whether the plan's attention runs cuDNN's fused (flash) kernel: on a GPU, in bf16/fp16,
    ``--attention`` not ``xla``, where token order is position order (no sequence split, or
    Ulysses; :func:`colossal_jax.sequence.fused.resolve`)."""
    from colossal_jax.config.seq_modes import seq_mode

    par = plan.config.parallel
    in_order = par.seq == 1 or seq_mode(par.seq_mode).position_order
    half = plan.precision in ("bf16", "fp16")
    return plan.devices.platform == "gpu" and half and plan.config.attention != "xla" and in_order


def scores_per_token(plan: Plan, *, kept: bool = True) -> float:
    """Attention score elements per token and layer (``a·s``: every head's row of scores) that
    the attention keeps for its backward (``kept``) or holds while it runs: none kept by
    cuDNN flash attention (it keeps the output and the log-sum-exp, and recomputes the scores
    in its backward), by the blockwise kernel and by ring attention (their custom backward
    keeps q, k, v, the output and the log-sum-exp, :mod:`colossal_jax.sequence.ring`); while
    running, the ring holds one block's, ``a·s/seq``, the blockwise kernel one key block's,
    ``a·B`` (:func:`colossal_jax.sequence.blockwise.block_size`), and flash attention none
    outside the kernel."""
    from colossal_jax.sequence.blockwise import block_size

    cfg, par = plan.config, plan.config.parallel
    a = plan.model.n_head
    if flash_attention(plan):
        return 0.0
    if blockwise_attention(plan):
        return 0.0 if kept else float(a * block_size(cfg.seq_len))
    if ring_attention(plan):
        return 0.0 if kept else a * cfg.seq_len / par.seq
    return float(a * cfg.seq_len)
