"""Compiling a program only to read its figures (HLO, buffer sizes, cost analysis), never to
run it: the planner's layer and plan compiles (:mod:`colossal_jax.auto.layer_memory`,
:mod:`colossal_jax.auto.measure` without steps)."""

from __future__ import annotations

from typing import Any

ANALYSIS_ONLY: dict[str, int] = {"xla_backend_optimization_level": 0}
"""XLA options for such a compile (``Lowered.compile(compiler_options=ANALYSIS_ONLY)``): LLVM's
optimisation level 0. It changes only the machine code of the kernels, which the figures do
not read: on six 8-device plans of the 4-layer, 128-wide GPT the optimised HLO text, the memory
analysis (argument, output, alias and temporary bytes) and the cost analysis came out identical
to the default compile's, in 25–35% less time on a 2-core host (and 2.52 → 1.46 s for the
4-layer stack of ``gpt3-175b`` with the same temporary bytes)."""

LAYER_ANALYSIS: dict[str, int | bool] = {**ANALYSIS_ONLY, "xla_cpu_use_fusion_emitters": False}
""":data:`ANALYSIS_ONLY` with XLA's CPU fusion emitters off (the older emitters generate the
fused kernels): for the one-device layer-stack compiles of
:func:`colossal_jax.auto.layer_memory.working`. On 45 such compiles (the 4-layer 256-wide GPT,
llama-tiny, gpt2-small, gpt3-6.7b and gpt3-175b; remat ``none``, ``dots`` and ``full``; batch
× sequence 2 × 256, 1 × 2048, 4 × 1024; jax 0.10.2) the memory analysis (temporary, argument,
output and alias bytes) and the FLOPs came out identical and the compile took 28.1 s against
64.9 s. Not used for whole plans (:mod:`colossal_jax.auto.measure`): there a pipeline's
temporaries moved by up to 1.9% (the interleaved 1D GPT, 27.47 → 28.00 MB) and the stored
sweeps were compiled without it. An XLA that no longer knows the option compiles with
:data:`ANALYSIS_ONLY` (:func:`compile_for_layer_figures`)."""


def compile_for_layer_figures(lowered: Any) -> Any:
    """``lowered`` compiled with :data:`LAYER_ANALYSIS`, or with :data:`ANALYSIS_ONLY` where
    this XLA does not know one of its options."""
    import jax

    try:
        return lowered.compile(compiler_options=LAYER_ANALYSIS)
    except jax.errors.JaxRuntimeError as e:
        if "No such compile option" not in str(e):
            raise
        return lowered.compile(compiler_options=ANALYSIS_ONLY)
