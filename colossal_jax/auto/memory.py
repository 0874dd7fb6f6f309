"""The planner's memory model: predicted peak bytes per device of a :class:`Plan`, a sum of named
terms (:func:`memory_terms`), in closed form.

The training state (fp32 parameters, gradients and optimizer slots, split over the tensor and
pipeline axes and over ``data`` by the ZeRO stage, as
:func:`~colossal_jax.config.model_rules.state_bytes`; offloaded state still counts, since the
step copies it in whole), a 16-bit copy of the parameters under bf16/fp16, ZeRO-3's gathered
layer, the activations each remat policy keeps per layer and token (the model family's own
residuals, traced, and one layer's working set, compiled once: :mod:`colossal_jax.auto.
layer_memory`; split over the devices by the tensor and sequence modes) for the microbatches in
flight (1 without a pipeline, ``M`` for GPipe, ``p`` for 1F1B, ``p·(1 +
(p−1)/(p·V))`` interleaved and ZB-V (at most ``M``), ``p`` ZB-H1; a split backward's record,
the larger of the residuals and the linears' inputs and output gradients; with a pipeline,
the tick's body, a few chunks of them, a tick's chunk gradient and the output gradients
waiting in the schedule's slots), the logits and their gradient. Attention
keeps its ``a·s`` scores per token only where it runs XLA's reference kernel: cuDNN flash
attention (GPU, 16-bit) and ring attention keep none
(:func:`colossal_jax.auto.attention_memory.scores_per_token`). On a GPU the
offloaded state stays in host memory.
"""

from __future__ import annotations

from colossal_jax.auto import layer_memory, policy_memory
from colossal_jax.auto.attention_memory import scores_per_token
from colossal_jax.auto.memory_weights import weighted
from colossal_jax.auto.per_device import (
    act_bytes,
    act_split,
    blockwise_attention,
    dims,
    inner_width,
    params_per_device,
    pipeline_shape,
    rest_params_per_device,
    ring_attention,
    ring_self_attention,
    stage_stack_params,
    stored_params_per_device,
    tokens_per_microbatch,
)
from colossal_jax.auto.per_token_memo import per_token
from colossal_jax.auto.whole_share import whole_share
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
"""How the activations each remat policy keeps per token and layer divide between h-wide values
and inner-width ones, as counts of ``(h-wide values, inner-width values (Q, K, V and the MLP's
hidden values, :func:`~colossal_jax.auto.per_device.inner_width`; 3h + w for a GPT),
attention scores a·s)``, read off XLA's memory analysis of the 4-layer, 256-wide GPT
(docs/planner.md). Since 2026-11-27 only their proportion is used, :func:`h_share`: the share
1D tensor parallelism does not split. How much a layer keeps is the family's own
(:func:`colossal_jax.auto.layer_memory.kept`). ``none`` keeps every intermediate, ``dots`` the
matmul outputs, ``selective`` those without a batch dimension (not the scores), ``full`` the
layer input, ``offload`` nothing on the device."""


def _split_elements(
    plan: Plan, other: float, scores: float, *, h_share: float, kept: bool = True
) -> float:
    """Elements per token per layer on one device of ``other`` elements per token (of which
    the share ``h_share`` is h-wide values) and ``scores`` score rows (units of ``a·s``, as
    :func:`~colossal_jax.auto.attention_memory.scores_per_token` counts them; ``kept``: held
    to the backward, else one layer's
    working set): the grid modes cut every activation over the whole tensor group, 1D cuts all
    but the h-wide values, no tensor mode cuts nothing; Ulysses cuts the heads over ``seq``
    (its tokens are whole sequences of fewer heads)."""
    t = plan.config.parallel.tensor_size
    score_elements = scores * scores_per_token(plan, kept=kept)
    if act_split(plan) > 1:  # a grid: everything over the group
        return (other + score_elements) / t
    if t > 1:  # 1D: h-wide values whole on every device
        return other * h_share + (other * (1 - h_share) + score_elements) / t
    return other + score_elements


def h_share(plan: Plan, counts: tuple[float, float, float]) -> float:
    """The share of h-wide values among the non-score ones ``counts`` (:data:`PER_TOKEN`)
    keep: what 1D tensor parallelism does not split."""
    _, h, _, _, _ = dims(plan)
    nh, ni, _ = counts
    total = nh * h + ni * inner_width(plan)
    return nh * h / total if total > 0 else 1.0


def _whole_share(plan: Plan, remat: str) -> float:
    """The share of a layer's non-score kept values that 1D tensor parallelism leaves whole on
    every device: the family's layer traced per device on a 2-way 1D split
    (:func:`colossal_jax.auto.whole_share.whole_share`: under ``none`` 0.26 for the 4-layer GPT,
    where its 1D plans' compiled memory says 0.25; under ``selective`` 0.22 for the GPT, 0.30 for
    BERT, whose post-LayerNorm block keeps its MLP output whole as well). Where it cannot be
    traced (one CPU device): under ``none`` the traced residuals' ``h``-wide share
    (:attr:`colossal_jax.auto.layer_memory.Kept.whole`), under a policy :data:`PER_TOKEN`'s
    proportion."""
    share = whole_share(plan.model, remat)
    if share is not None:
        return share
    if remat != "none":
        return h_share(plan, PER_TOKEN[remat])
    k = layer_memory.kept(plan.model, "none")
    return k.whole / k.other if k.other > 0 else 1.0


def _gathered_inputs(plan: Plan) -> float:
    """Elements per token and layer a grid mode's matmuls hold beyond the local blocks: each
    linear's input gathered along one side of the grid (SUMMA-style 2D, 2.5D and 3D: ``q``
    times the ``1/t`` local block, ``q`` the grid's side), i.e. ``(3h + w)·(q − 1)/t`` for the
    Q/K/V, output, MLP-in and MLP-out inputs. Kept under ``remat=none`` (everything is) and part
    of every layer's working set; read off the buffer assignment of the 2.5D 2×2×2 GPT
    (docs/planner.md)."""
    par = plan.config.parallel
    if act_split(plan) <= 1:
        return 0.0
    _, h, _, w, _ = dims(plan)
    return (3 * h + w) * (par.tensor_row - 1) / par.tensor_size


def kept_elements(plan: Plan, remat: str | None = None, *, gathered: bool = True) -> float:
    """Elements per token and layer the remat policy keeps on one device: the family's own
    residuals (:func:`colossal_jax.auto.layer_memory.kept`), split as :func:`_split_elements`,
    and under ``none`` a grid's gathered linear inputs (``gathered``; :func:`_gathered_inputs`);
    ``offload`` keeps nothing on the device."""
    remat = remat or plan.remat
    if remat == "offload":
        return 0.0
    k = layer_memory.kept(plan.model, remat)
    share = _whole_share(plan, remat)
    extra = _gathered_inputs(plan) if remat == "none" and gathered else 0.0
    other = k.other * _partial_products(plan, remat)
    return _split_elements(plan, other, k.scores, h_share=share) + extra


DOT_KEEPING = ("dots", "selective")
"""The remat policies that keep matmul outputs (:data:`PER_TOKEN`)."""


def _partial_products(plan: Plan, remat: str) -> float:
    """How many times larger than its ``1/t`` block a kept matmul output is on one device: 3D's
    linears keep their partial product ``M·K/q²`` (the reduce-scatter over the third axis comes
    after the matmul, :mod:`colossal_jax.tensor.three_d`), ``q`` times the output block, under
    the policies that keep matmul outputs (the 2×2×2 GPT's ``selective`` compiles 30% over the
    prediction with ``1/t``); 1 elsewhere."""
    par = plan.config.parallel
    if remat in DOT_KEEPING and par.tensor_mode == "3d":
        return float(par.tensor_row)
    return 1.0


def whole_1d_bytes(plan: Plan) -> float:
    """The bytes of the kept activations that 1D tensor parallelism leaves whole, beyond the
    ``1/t`` share a split would leave, for every layer of a stage and microbatch in flight
    (with a fused backward; 0 elsewhere and without 1D): under a policy that keeps matmul
    outputs, its row-parallel linears keep their ``[tokens, h]`` outputs before the all-reduce,
    whose share of the kept values :data:`PER_TOKEN`'s proportion underestimated (weighted in
    :data:`~colossal_jax.auto.memory_weights.REMAT_COEF`, fitted before the share was traced per
    device, :func:`_whole_share`, and kept since: the stored lists' memory held with them; under
    ``none`` the traced share is exact, weight 0)."""
    par = plan.config.parallel
    if par.tensor_mode != "1d" or par.tensor_size == 1 or plan.remat == "offload":
        return 0.0
    if par.pipelined and pipeline_schedule(plan.pipeline).split_backward:
        return 0.0
    k = layer_memory.kept(plan.model, plan.remat)
    whole = k.other * _whole_share(plan, plan.remat) * (1 - 1 / par.tensor_size)
    layers = plan.model.n_layer // par.pipe
    return whole * act_bytes(plan) * tokens_per_microbatch(plan) * layers * _in_flight(plan)


def recomputed_whole_1d_bytes(plan: Plan) -> float:
    """Under ``remat=full``, in a 1D pipeline of one-layer chunks: the bytes of the values 1D
    leaves whole (the residual stream, the row-parallel linears' all-reduced outputs, the norms'
    statistics: ``remat=none``'s kept values times its traced whole share,
    :func:`_whole_share`) that the tick's backward recomputes for one microbatch, beside what
    the working set and the chunk's record already count; 0 elsewhere. Where the chunk holds
    several layers the whole recomputed layer counts (:func:`recomputed_layer_counts`); in a
    one-layer chunk, fitted on the GPT's five such plans, the whole values alone do (weight in
    :data:`~colossal_jax.auto.memory_weights.MEMORY_COEF`; docs/planner.md)."""
    par = plan.config.parallel
    if plan.remat != "full" or not par.pipelined or par.tensor_mode != "1d":
        return 0.0
    if par.tensor_size == 1 or recomputed_layer_counts(plan):
        return 0.0
    k = layer_memory.kept(plan.model, "none")
    whole = k.other * _whole_share(plan, "none")
    return whole * act_bytes(plan) * tokens_per_microbatch(plan)


def _record_elements(plan: Plan) -> float:
    return per_token(plan, "record", lambda: _record_elements_of(plan))


def record_share(plan: Plan) -> float:
    """The share of ``remat=none``'s record that the plan's remat policy keeps: a microbatch's
    record per token and layer under the policy over the same under ``none`` (1 under
    ``none``; :func:`_record_elements_of`)."""
    if plan.remat == "none":
        return 1.0
    whole = per_token(plan, "record_none", lambda: _record_elements_of(plan, "none"))
    return _record_elements(plan) / whole if whole > 0 else 1.0


def _record_elements_of(plan: Plan, remat: str | None = None) -> float:
    """Elements per token and layer a microbatch keeps on a stage between its forward and its
    backward: the remat policy's (:func:`kept_elements`); with a split backward (ZB-H1, ZB-V)
    the larger of those, less a grid's gathered linear inputs, and what the record holds after
    the B (:data:`SPLIT_RECORD`). A split F runs the linears on the weights' ``stop_gradient``
    (:mod:`colossal_jax.layers.linear_tape`), so its residuals leave out what only the weight
    gradients need, the gathered inputs; W gathers them again from the record's local inputs
    (the 2D ZB-H1 GPT at M = 2 and 4 compiles 14% under the fused backward's residuals)."""
    if not (plan.config.parallel.pipelined and pipeline_schedule(plan.pipeline).split_backward):
        return kept_elements(plan, remat)
    kept = kept_elements(plan, remat, gathered=False)
    _, h, _, w, _ = dims(plan)
    nh, ni, ns = SPLIT_RECORD
    record = _split_elements(
        plan, nh * h + ni * inner_width(plan) + w, ns, h_share=h_share(plan, SPLIT_RECORD)
    )
    return max(kept, record)


def working_bytes(plan: Plan, *, floor: bool = False) -> float:
    """One layer's backward transients on one device, in bytes: the sum of
    :func:`working_parts`."""
    return sum(working_parts(plan, floor=floor).values())


def working_parts(plan: Plan, *, floor: bool = False) -> dict[str, float]:
    """One layer's backward transients on one device, in bytes, in four parts (each a term of
    :func:`memory_terms`): ``working``, the family's measured working set under ``remat=none``
    (:func:`colossal_jax.auto.layer_memory.working`: per token, its scores split like the kept
    ones, and one layer's weight gradient split by the tensor mode, a grid's gathered along one
    side, :func:`_gathered_weights`; under ring attention the ring kernel's own score blocks,
    :func:`colossal_jax.auto.layer_memory.ring_blocks`) and the
    grid's gathered linear inputs; ``working_rsa``, under ring self-attention the rows its
    kernel holds beyond XLA's attention (:func:`colossal_jax.auto.layer_memory.rsa_rows`);
    ``working_recomputed``, under a policy that recomputes, in a pipeline of multi-layer
    chunks, the intermediates it recomputes (what ``none`` keeps beyond what the policy does;
    :func:`recomputed_layer_counts`); ``working_policy``, without a pipeline, what the
    layer's backward holds under the plan's remat policy beyond ``none``'s working set, the
    intermediates it recomputes (:func:`colossal_jax.auto.policy_memory.policy_working`, split
    like ``working``; score rows only where XLA's attention computes them: ring attention,
    flash and the blockwise kernel recompute their blocks under every policy alike). In a
    pipeline a tick's body holds its chunk's residual sets (``pipe_body``), in whose place the
    recomputed values stand (:func:`recomputed_layer_counts`): no term. ``floor``: the ring
    kernel's blocks (and ring self-attention's extra rows) taken as none, which compiles no
    ring and can only be less (:func:`memory_bytes`)."""
    w = layer_memory.working(plan.model, plan.config.seq_len)
    scores, extra = w.scores, 0.0
    if ring_attention(plan):  # the ring's own kernel, not XLA's attention, holds the blocks
        blocks = 0.0 if floor else layer_memory.ring_blocks(plan.model, plan.config.parallel.seq)
        scores = scores if blocks is None else blocks
    elif ring_self_attention(plan) and not floor:  # its score blocks apart, then concatenated
        rows = layer_memory.rsa_rows(plan.model, plan.config.seq_len, plan.config.parallel.seq)
        extra = rows or 0.0

    pw = layer_memory.Working(0.0, 0.0, 0.0)
    if not plan.config.parallel.pipelined:  # a tick's body holds its chunk's (pipe_body)
        pw = policy_memory.policy_working(plan.model, plan.config.seq_len, plan.remat)
    # the policy recomputes XLA's score rows; a kernel that keeps no scores (ring attention's
    # custom backward, flash, blockwise) recomputes its blocks under every policy alike
    pw_scores = pw.scores if scores_per_token(plan) > 0 else 0.0

    def elements() -> tuple[float, float, float, float]:
        share = _whole_share(plan, "none")
        base = _split_elements(plan, w.other, scores, h_share=share, kept=False)
        base += _gathered_inputs(plan)
        rsa = _split_elements(plan, 0.0, extra, h_share=share, kept=False)
        recomputed = 0.0
        if plan.remat != "none" and recomputed_layer_counts(plan):
            recomputed = max(0.0, kept_elements(plan, "none") - kept_elements(plan))
        policy = _split_elements(plan, pw.other, pw_scores, h_share=share, kept=False)
        return base, rsa, recomputed, policy

    base, rsa, recomputed, policy = per_token(plan, f"working/floor={floor}", elements)
    ab, tok = act_bytes(plan), tokens_per_microbatch(plan)
    split = param_split(plan.config.parallel)
    return {
        "working": ab * (base * tok + w.fixed * _gathered_weights(plan) / split),
        "working_rsa": ab * rsa * tok,
        "working_recomputed": ab * recomputed * tok,
        "working_policy": ab * (policy * tok + pw.fixed / split),
    }


def _gathered_weights(plan: Plan) -> float:
    """How many times its stored block a layer's weight is in the layer's backward on one
    device: a grid mode's linear all-gathers its weight along one side of the grid (SUMMA-style
    2D and 2.5D: ``W[N/q, K/q]`` to ``[N, K/q]``; 3D: ``[N/q, K/q]`` of its ``q³`` split), and
    its gradient is that size before the reduce-scatter, ``q`` times the block
    (:mod:`colossal_jax.tensor.two_d`); 1 without a grid. With the one-device weight gradient
    split by the mode alone, the 2D 2×2 plans of bert-tiny widened (held out) compiled up to
    13.2% over the prediction, the GPT's up to 8.6%; with it, 9.9% and 5.8%."""
    if act_split(plan) <= 1:
        return 1.0
    return float(plan.config.parallel.tensor_row)


def recomputed_layer_counts(plan: Plan) -> bool:
    """Whether one layer's recomputed intermediates (what ``none`` keeps beyond the remat
    policy) add to the working set: only in a pipeline whose chunks hold two layers or more.
    Fitted to the compiled memory of the 4-layer GPT's remat plans (103 of them,
    ``docs/planner_sweep_gpt_remat.json`` and ``docs/planner_sweep_gpt_keptbytes_all89.json``)
    by least squares per case, the layer's weight came out 0.09 without a pipeline (40 plans),
    0.05 with one-layer chunks (28) and 0.88 with two-layer chunks (35): taken as 0, 0 and 1.
    Held out: the 8-layer GPT without a pipeline (``selective``, +1.8%) and with two stages of
    four layers under 1D (−4.6%), llama-tiny in four one-layer stages (+2.5%) and in
    interleaved two-layer chunks (−8.6%). A reading, not traced buffer by buffer: without a
    pipeline and in a one-layer chunk the recomputed values take the place of the stored
    residuals that the ``none`` working set reads back, so the peak does not grow; a chunk of
    several layers holds them in the tick beside the chunk's record. Until 2026-11-28 the layer
    counted everywhere (remat plans 10–69% over)."""
    par = plan.config.parallel
    if not par.pipelined:
        return False
    return plan.model.n_layer // (par.pipe * plan.virtual_stages) >= 2


def memory_terms(plan: Plan, *, floor: bool = False) -> dict[str, float]:
    """The terms of the predicted peak per device, in bytes (weighted by the remat policy's
    weights, :func:`colossal_jax.auto.memory_weights.weight`; ``floor``: as
    :func:`working_parts`, and without a pipeline's gradient slots, which need its schedule
    built):

    - ``state``: parameters and optimizer slots as stored (split by tensor, pipeline and ZeRO;
      the step donates them, so its outputs alias them); offloaded state counts on the
      simulated CPU devices, whose host memory is their memory, and not on a GPU;
    - ``grads``: the fp32 gradient the backward produces (whole below ZeRO-3: ZeRO-2
      reduce-scatters it after the backward, so its compiled peak equals ZeRO-1's; ZeRO-3
      inside it, layer by layer), with accumulation the accumulator beside it (whole below
      stage 2, a shard from it), under bf16/fp16 a 16-bit parameter copy and the 16-bit
      gradient before its cast to fp32 (ZeRO-3 keeps no gathered layer under any remat
      policy: the backward gathers each again, :func:`colossal_jax.parallel.zero.
      keep_all_but_gathered`), a pipeline's gathered rest;
    - ``kept``: the activations the remat policy keeps (:func:`kept_elements`) for every
      layer, without a pipeline; ``pipe_kept`` the same for every layer of a stage and every
      microbatch in flight, with one; ``pipe_body`` (fused backward) or ``pipe_body_split``
      one chunk's worth, which the tick's body holds a few times over; ``pipe_ring``, under
      ring attention, one score block (``a·s/seq`` per token) for every layer of the chunk,
      which the tick's ring loops hold beside it; ``pipe_chunk_grad`` the fp32 gradient of
      one chunk's parameters that a tick's backward (or W) returns from the schedule's switch
      before it is added into the stage's gradient sum; ``pipe_grad_slots`` the gradient slots
      of the schedule (an activation's size each: ``M`` under GPipe, 1 under 1F1B and ZB-H1),
      where output gradients wait for their chunk's backward;
    - ``working``, ``working_rsa`` (``pipe_working_rsa`` in a pipeline),
      ``working_recomputed`` and ``working_policy``: one layer's backward transients, ring
      self-attention's extra rows, a recomputed layer in a pipeline's chunk and, without a
      pipeline, the remat policy's recomputed intermediates (:func:`working_parts`);
    - ``kept_1d_whole``: the kept values 1D leaves whole beyond a ``1/t`` share
      (:func:`whole_1d_bytes`); ``pipe_recomputed_1d_whole``: under ``full``, in a 1D pipeline
      of one-layer chunks, the whole values a tick's backward recomputes
      (:func:`recomputed_whole_1d_bytes`);
    - ``logits``: the logits, their softmax and gradient in fp32, split over the tensor group.
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
    # the whole fp32 gradient is at the peak below ZeRO-3: ZeRO-2 reduce-scatters it after the
    # backward (its compiled temp equals ZeRO-1's under every remat policy, docs/memory.md);
    # ZeRO-3 inside it
    grads = 4 * n / over(3)
    if par.pipelined:  # the rest gathered whole over pipe for the step, in the compute dtype
        grads += act_bytes(plan) * rest_params_per_device(plan)
    if plan.grad_accum > 1:  # the accumulator beside it: whole below ZeRO-2, else a shard
        grads += 4 * n / over(2)
    if plan.precision != "fp32":  # the 16-bit parameter copy, the 16-bit gradient before its cast
        # (ZeRO-3 reduce-scatters each layer's gradient inside the backward pass: one layer's)
        grads += 2 * n / over(3) + (2 * n if plan.zero < 3 else 2 * n / L)
    ab = act_bytes(plan)
    tok = tokens_per_microbatch(plan)
    layers = L // par.pipe
    inflight = _in_flight(plan)
    kept = _record_elements(plan) * ab * tok * layers * inflight
    chunk = chunk_bytes(plan)
    split = par.pipelined and pipeline_schedule(plan.pipeline).split_backward
    ring_chunk = 0.0
    if par.pipelined and (ring_attention(plan) or blockwise_attention(plan)):
        # one score block per layer of the chunk (the ring's, or the blockwise kernel's)
        ring_chunk = ab * tok * scores_per_token(plan, kept=False) * layers / plan.virtual_stages
    working = working_parts(plan, floor=floor)
    chunk_grad = grad_slots = 0.0
    if par.pipelined:  # a tick's chunk gradient (fp32), and the output gradients waiting
        chunk_grad = 4 * stage_stack_params(plan) / plan.virtual_stages
    if par.pipelined and not floor:  # (the floor builds no schedule: none of its slots)
        _, slots = pipeline_shape(plan)
        grad_slots = slots["gradient"] * ab * tok * h / act_split(plan)
    # the vocabulary split by the tensor mode, and under a grid the rows by the rest of the
    # group: the whole group divides the logits (2.5D at depth 2, 4, 8 compiles alike)
    logits = 3 * tok * vocab / par.tensor_size * 4
    return {
        "state": state,
        "grads": grads,
        "kept": 0.0 if par.pipelined else kept,
        "pipe_kept": kept if par.pipelined else 0.0,
        "pipe_body": chunk if par.pipelined and not split else 0.0,
        "pipe_body_split": chunk if split else 0.0,
        "pipe_ring": ring_chunk,
        "pipe_chunk_grad": chunk_grad,
        "pipe_grad_slots": grad_slots,
        "working": working["working"],
        "working_rsa": 0.0 if par.pipelined else working["working_rsa"],
        "pipe_working_rsa": working["working_rsa"] if par.pipelined else 0.0,
        "working_recomputed": working["working_recomputed"],
        "working_policy": working["working_policy"],
        "kept_1d_whole": whole_1d_bytes(plan),
        "pipe_recomputed_1d_whole": recomputed_whole_1d_bytes(plan),
        "logits": logits,
    }


def chunk_bytes(plan: Plan) -> float:
    """Bytes of one microbatch's record for one model chunk on a stage (its layers' residuals,
    :func:`_record_elements`): what one slot of a pipeline's record buffers holds."""
    layers = plan.model.n_layer // plan.config.parallel.pipe
    tok = tokens_per_microbatch(plan)
    return _record_elements(plan) * act_bytes(plan) * tok * layers / plan.virtual_stages


def memory_bytes(plan: Plan, *, floor: bool = False) -> float:
    """The predicted peak bytes per device: :func:`memory_terms` weighted by
    :func:`~colossal_jax.auto.memory_weights.weighted`. With ``floor``, a lower bound of it that
    compiles no ring attention and builds no pipeline schedule (the ring kernel's score blocks
    and the schedule's gradient slots taken as none; every term and weight is non-negative and
    grows with them): the planner prices a plan only when its floor fits, and finds the least
    memory of a request nothing fits by pricing plans in order of their floors."""
    return weighted(memory_terms(plan, floor=floor), plan.remat)


def floor_is_exact(plan: Plan) -> bool:
    """Whether :func:`memory_bytes` with ``floor`` is the prediction itself: no ring kernel's
    compiled blocks (ring attention, ring self-attention) and no schedule's gradient slots
    (a pipeline) are left out of it."""
    pipelined = plan.config.parallel.pipelined
    return not (ring_attention(plan) or ring_self_attention(plan) or pipelined)


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
    if plan.virtual_stages > 1:  # in units of a stage's microbatch: at most the M there are
        return min(float(m), p * (1 + (p - 1) / (p * plan.virtual_stages)))
    return float(min(p, m))
