"""Activation checkpointing (rematerialisation) of the layer stack: ``--remat``.

Each layer of the scanned stack (:func:`colossal_jax.layers.stack.apply_layers`) runs under
``jax.checkpoint`` with one of these policies (Chen et al. 2016, "Training Deep Nets with
Sublinear Memory Cost", arXiv 1604.06174; the selective policy is Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", arXiv 2205.05198):

- ``none``: no checkpoint; the backward pass keeps every intermediate of every layer.
- ``dots`` (the default): keep the output of every matmul (the projections and the attention
  scores and outputs) and recompute the element-wise ops between them (layer norm, GeLU,
  softmax, the mask) from those in the backward pass. No matmul runs twice; what it saves over
  ``none`` is the element-wise intermediates, which in the scanned stack are otherwise written
  to per-layer buffers and read back (``none`` keeps 7.9 MB per layer per device at gpt2-tiny's
  width, batch 2 × 128 tokens per device, ``dots`` 2.4 MB; an unrolled program gets the same
  effect from XLA's fusion, which recomputes element-wise producers inside their consumers).
  The step is ~30% faster than ``none`` at 8 layers on 8 simulated CPU devices
  (docs/performance.md).
- ``full``: keep only each layer's input (the scan carry); the backward pass recomputes the
  layer: one extra forward per step (≈ +33% FLOPs), activation memory ``L·b·s·h`` plus one
  layer's intermediates.
- ``selective``: also keep the outputs of matmuls without batch dimensions (the projections
  ``x @ W``) and any value named in ``saved_names``; the attention core (softmax, its ``s²``
  scores) and the element-wise ops are recomputed.
- ``dots`` and ``selective`` also keep the ring attention kernel's own residuals (its output and
  log-sum-exp, :data:`colossal_jax.sequence.ring.RING_RESIDUAL`): without them ``dots`` kept
  every hop's score block and ``selective`` re-ran the whole ring forward in the backward.
- ``offload``: like ``full``, but each layer's input (named :data:`LAYER_INPUT`) is copied to
  the host's ``pinned_host`` memory in the forward pass and back in the backward pass
  (``jax.checkpoint_policies.save_and_offload_only_these_names``). What this saves depends on
  the backend: see docs/memory.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax

from colossal_jax.layers.stack import LAYER_INPUT
from colossal_jax.sequence.ring import RING_RESIDUAL

KERNEL_RESIDUALS = (RING_RESIDUAL,)
"""Values the sequence kernels name (``checkpoint_name``) as their custom backward's residuals:
``dots`` and ``selective`` keep them (``full`` and ``offload`` recompute the whole layer)."""

REMAT_MODES = ("none", "dots", "full", "selective", "offload")


@dataclass(frozen=True)
class RematPolicy:
    """What one layer of the stack keeps for its backward pass.

    Attributes:
      mode: ``none | dots | full | selective | offload`` (see the module docstring).
      saved_names: ``checkpoint_name``-d values ``selective`` keeps besides matmul outputs.
      offloaded_names: values ``offload`` moves to host memory.
    """

    mode: str = "dots"
    saved_names: tuple[str, ...] = ()
    offloaded_names: tuple[str, ...] = (LAYER_INPUT,)

    def policy(self) -> Callable[..., bool] | None:
        """The ``jax.checkpoint`` policy, or ``None`` for ``none`` (no checkpoint at all)."""
        cp = jax.checkpoint_policies
        if self.mode == "none":
            return None
        # the ring kernel's own residuals (its output and log-sum-exp): recomputing them
        # would re-run the whole ring forward, every hop, inside the backward
        kernel = cp.save_only_these_names(*KERNEL_RESIDUALS)
        if self.mode == "dots":
            return cp.save_from_both_policies(cp.dots_saveable, kernel)
        if self.mode == "full":
            return cp.nothing_saveable
        if self.mode == "selective":
            names = cp.save_only_these_names(*KERNEL_RESIDUALS, *self.saved_names)
            return cp.save_from_both_policies(cp.dots_with_no_batch_dims_saveable, names)
        if self.mode == "offload":
            return cp.save_and_offload_only_these_names(
                names_which_can_be_saved=list(self.saved_names),
                names_which_can_be_offloaded=list(self.offloaded_names),
                offload_src="device",
                offload_dst="pinned_host",
            )
        raise ValueError(f"--remat {self.mode!r} is not one of {', '.join(REMAT_MODES)}")
