"""Compiling a program only to read its figures (HLO, buffer sizes, cost analysis), never to
run it: the planner's layer and plan compiles (:mod:`colossal_jax.auto.layer_memory`,
:mod:`colossal_jax.auto.measure` without steps)."""

from __future__ import annotations

ANALYSIS_ONLY: dict[str, int] = {"xla_backend_optimization_level": 0}
"""XLA options for such a compile (``Lowered.compile(compiler_options=ANALYSIS_ONLY)``): LLVM's
optimisation level 0. It changes only the machine code of the kernels, which the figures do
not read: on six 8-device plans of the 4-layer, 128-wide GPT the optimised HLO text, the memory
analysis (argument, output, alias and temporary bytes) and the cost analysis came out identical
to the default compile's, in 25–35% less time on a 2-core host (and 2.52 → 1.46 s for the
4-layer stack of ``gpt3-175b`` with the same temporary bytes)."""
