"""The planner's memory model: predicted peak bytes per device of a :class:`Plan`, a sum of named
terms (:func:`memory_terms`), in closed form.

The training state (fp32 parameters, gradients and optimizer slots, split over the tensor and
pipeline axes and over ``data`` by the ZeRO stage, as
:func:`~colossal_jax.config.model_rules.state_bytes`; offloaded state still counts, since the
step copies it in whole), a 16-bit copy of the parameters under bf16/fp16, ZeRO-3's gathered
layer, the activations each remat policy keeps (per layer and token, :data:`PER_TOKEN`) for the
microbatches in flight (1 without a pipeline, ``M`` for GPipe, ``p`` for 1F1B, ``p·(1 +
(p−1)/(p·V))`` interleaved and ZB-V, ``p`` ZB-H1; a split backward's record, the larger of the
residuals and the linears' inputs and output gradients), the logits and their gradient. Attention
keeps its ``a·s`` scores per token only where it runs XLA's reference kernel: cuDNN flash
attention (GPU, 16-bit) and ring attention keep none (:func:`scores_per_token`). On a GPU the
offloaded state stays in host memory.
"""

from __future__ import annotations

from colossal_jax.auto.per_device import (
    act_bytes,
    act_split,
    dims,
    inner_width,
    params_per_device,
    rest_params_per_device,
    stored_params_per_device,
    tokens_per_microbatch,
)
from colossal_jax.config.optimizers import optimizer
from colossal_jax.config.pipelines import pipeline_schedule
from colossal_jax.config.plan import Plan
from colossal_jax.config.tensor_split import param_split

SPLIT_RECORD = (5, 1, 0)
"""What a split backward's record holds after its B, per token and layer, as :data:`PER_TOKEN`
counts (plus the MLP's ``w``-wide down-projection input, :func:`_record_elements`): the
linears' inputs (3 h-wide and the ``w``-wide one) and output gradients (Q/K/V and the MLP's
hidden values, the inner width, and 2 h-wide). Before its B it holds the remat policy's
residuals; a record costs the larger (docs/pipeline_parallel.md)."""


PER_TOKEN = {
    "none": (12, 3.33, 1.92),
    "dots": (2, 1, 1),
    "selective": (2, 1, 0),
    "full": (1, 0, 0),
    "offload": (0, 0, 0),
}
"""Activation elements each remat policy keeps per token and layer, as counts of
``(h-wide values, inner-width values (Q, K, V and the MLP's hidden values,
:func:`_inner_width`; 3h + w for a GPT), attention scores a·s)``: ``none`` keeps every
intermediate (LayerNorm inputs, outputs and statistics, the residuals, Q/K/V, the MLP's hidden
layer before and after its activation, the scores, their mask and probabilities), ``dots`` the
matmul outputs, ``selective`` those without a batch dimension (not the scores), ``full`` the
layer input, ``offload`` nothing on the device. The counts are read off XLA's memory analysis
of ``--mesh data=8`` for each policy (4-layer, 256-wide GPT, docs/planner.md); ``none``'s from
two compiles of that GPT, ``data=8`` (which keeps the scores) and ``seq=8`` ring attention
(which keeps none), which separate the scores' count (1.92) from the inner-width values' (3.33:
GELU's tanh-form intermediates on the MLP's hidden layer among them), the h-wide count held at
12 (until 2026-11-27 ``(12, 2, 3)``, read off ``data=8`` alone)."""


MEMORY_COEF = {
    "state": 1.0,
    "grads": 1.0,
    "kept": 1.0,
    "working": 1.0,
    "pipe_kept": 1.66,
    "logits": 1.0,
}
"""The weight of each memory term (:func:`memory_terms`) in the predicted peak: the terms are
structural estimates; their weights are fitted by least squares to the compiled memory analysis
of the 4-layer, 256-wide GPT's plans on 8 CPU devices (docs/planner.md, "Memory")."""


def _split_elements(plan: Plan, counts: tuple[int, int, int], *, kept: bool = True) -> float:
    """Elements per token per layer on one device for ``counts`` (:data:`PER_TOKEN`): the grid
    modes cut every activation over the whole tensor group, 1D cuts the (3h + width)-wide ones
    and the heads, no tensor mode cuts nothing; Ulysses cuts the heads over ``seq``. The scores
    are :func:`scores_per_token`'s (``kept``: held to the backward, else one layer's working
    set)."""
    par = plan.config.parallel
    _, h, _, _, _ = dims(plan)
    nh, ni, ns = counts
    t = par.tensor_size
    scores = scores_per_token(plan, kept=kept)
    inner = inner_width(plan)
    if act_split(plan) > 1:  # a grid: everything over the group
        return (nh * h + ni * inner + ns * scores) / t
    if t > 1:  # 1D: h-wide values whole on every device
        return nh * h + (ni * inner + ns * scores) / t
    return nh * h + ni * inner + ns * scores


def _record_elements(plan: Plan) -> float:
    """Elements per token and layer a microbatch keeps on a stage between its forward and its
    backward: the remat policy's (:data:`PER_TOKEN`); with a split backward (ZB-H1, ZB-V) the
    larger of those and what the record holds after the B (:data:`SPLIT_RECORD`)."""
    kept = _split_elements(plan, PER_TOKEN[plan.remat])
    if not (plan.config.parallel.pipelined and pipeline_schedule(plan.pipeline).split_backward):
        return kept
    _, _, _, w, _ = dims(plan)
    t = plan.config.parallel.tensor_size
    return max(kept, _split_elements(plan, SPLIT_RECORD) + w / t)


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
    in its backward) and by ring attention (its custom backward keeps q, k, v, the output and
    the log-sum-exp, :mod:`colossal_jax.sequence.ring`); while running, the ring holds one
    block's, ``a·s/seq``, and flash attention none outside the kernel."""
    cfg, par = plan.config, plan.config.parallel
    a = plan.model.n_head
    if flash_attention(plan):
        return 0.0
    if par.seq > 1 and plan.seq_mode == "ring":
        return 0.0 if kept else a * cfg.seq_len / par.seq
    return float(a * cfg.seq_len)


def memory_terms(plan: Plan) -> dict[str, float]:
    """The terms of the predicted peak per device, in bytes (weights :data:`MEMORY_COEF`):

    - ``state``: parameters and optimizer slots as stored (split by tensor, pipeline and ZeRO;
      the step donates them, so its outputs alias them); offloaded state counts on the
      simulated CPU devices, whose host memory is their memory, and not on a GPU;
    - ``grads``: the fp32 gradient (split by ZeRO from stage 2), the accumulator beside it with
      accumulation below stage 2, under bf16/fp16 a 16-bit parameter copy and the 16-bit
      gradient before its cast to fp32, ZeRO-3's gathered layer, a pipeline's gathered rest;
    - ``kept``: the activations the remat policy keeps (:data:`PER_TOKEN`) for every layer,
      without a pipeline; ``pipe_kept`` the same for every layer of a stage and every
      microbatch in flight, with one;
    - ``working``: one layer's full intermediates while it is recomputed (``full``,
      ``offload``) or run;
    - ``logits``: the logits, their softmax and gradient in fp32.
    """
    par = plan.config.parallel
    L, h, _, w, vocab = dims(plan)
    n = params_per_device(plan)
    stored = stored_params_per_device(plan)
    slots = optimizer(plan.config.optim.name).state_slots(plan.config.optim.b1)

    def over(stage: int) -> int:
        return par.data if plan.zero >= stage else 1

    params, moments = 4 * stored / over(3), 4 * stored * slots / over(1)
    if plan.devices.platform != "cpu":  # on an accelerator the offloaded tree stays in host
        # memory: the update streams it leaf by leaf (compiled peaks of docs/gpu/ show no copy)
        moments *= plan.offload == "none"
        params *= plan.offload != "params"
    state = params + moments
    grads = 4 * n / over(2)
    if par.pipelined:  # the rest gathered whole over pipe for the step, in the compute dtype
        grads += act_bytes(plan) * rest_params_per_device(plan)
    if plan.grad_accum > 1 and plan.zero < 2:
        grads += 4 * n / over(2)
    if plan.precision != "fp32":  # the 16-bit parameter copy, the 16-bit gradient before its cast
        # (ZeRO-3 reduce-scatters each layer's gradient inside the backward pass: one layer's)
        grads += 2 * n / over(3) + (2 * n if plan.zero < 3 else 2 * n / L)
    if plan.zero == 3:
        grads += 2 * 4 * (4 * h * h + 2 * h * w) / param_split(par)
    ab = act_bytes(plan)
    tok = tokens_per_microbatch(plan)
    layers = L // par.pipe
    inflight = _in_flight(plan)
    kept = _record_elements(plan) * ab * tok * layers * inflight
    working = _split_elements(plan, PER_TOKEN["none"], kept=False) * ab * tok
    logits = 3 * tok * vocab / plan.tensor_split.divisor("vocab size") * 4
    return {
        "state": state,
        "grads": grads,
        "kept": 0.0 if par.pipelined else kept,
        "pipe_kept": kept if par.pipelined else 0.0,
        "working": working,
        "logits": logits,
    }


def memory_bytes(plan: Plan) -> float:
    """The predicted peak bytes per device: :func:`memory_terms` weighted by
    :data:`MEMORY_COEF`."""
    return sum(MEMORY_COEF[k] * v for k, v in memory_terms(plan).items())


def _in_flight(plan: Plan) -> float:
    """Microbatches whose activations a stage holds at once."""
    p = plan.config.parallel.pipe
    if p == 1:
        return 1.0
    m = plan.schedule_microbatches
    if plan.pipeline == "gpipe":
        return float(m)
    if plan.pipeline == "zb-h1":  # F to W: at most p records on a stage, 1F1B's peak
        return float(min(p, m))
    if plan.virtual_stages > 1:
        return min(m * plan.virtual_stages, p * (1 + (p - 1) / (p * plan.virtual_stages)))
    return float(min(p, m))
