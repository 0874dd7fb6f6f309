"""The planner's cost model: predicted step time and memory per device of a :class:`Plan`.

Everything is derived from the model's dimensions and the plan, in closed form (no compile):

- **Compute.** The model's training FLOPs (``flops_per_token(seq_len)``: ``6·N + 12·L·s·h`` for a
  GPT), times the recompute of the remat policy (``full``/``offload``: the forward again, ×4/3;
  ``selective``: the attention core's forward again; ``none``/``dots``: ×1), split over the
  devices, at ``peak_flops · efficiency`` (:mod:`colossal_jax.auto.hardware`). Simulated CPU
  devices share the host's cores, so there the step costs every device's FLOPs at the host's
  measured rate.
- **Pipeline bubble.** ``(p − 1) / (M·V)`` of a stage's per-tick work for GPipe, 1F1B
  (PipeDream-Flush; the same bubble as GPipe, fewer microbatches in flight) and interleaved 1F1B
  (V chunks per stage, Narayanan et al. 2021), ``M`` counting the accumulation's microbatches
  too; a third of that for ZB-H1 and ZB-V (Qi et al. 2024; F, B and W taken as equal). The
  per-tick work is the compute plus the traffic inside the layers (the tensor and sequence
  axes, :data:`TICK_AXES`) and, on simulated CPU devices, the attention scores
  (:data:`TICK_CPU_TERMS`): an idle tick waits for all of a chunk's critical path, not only its
  matmuls (until 2026-11-29 the compute alone). On simulated devices sharing the host's cores
  the bubble is ``1/(M·V)`` of that work, not growing with ``p`` (:func:`bubble`).
- **Communication**, bytes received per device per step on each mesh axis, by the formulas of
  docs/formulas.md: tensor (:mod:`colossal_jax.tensor.cost`, every layer of the stage, every
  microbatch), sequence (:mod:`colossal_jax.sequence.cost`, as the kernels send it: only the
  key/value heads under grouped-query attention; inside a pipeline stage a ring hop is an
  all-to-all, :func:`~colossal_jax.sequence.cost.pipelined_hop_blocks`), pipeline (an
  activation on every tick whose message switch runs a ring, two where it runs both, from the
  schedule's table; the
  embeddings, final norm and head gathered over ``pipe`` and their gradient scattered back),
  the gradient's reduction over every replica of the parameters (``data × seq``: the
  all-reduce, or ZeRO's reduce-scatter + all-gather, stage 2 per microbatch, stage 3 with two
  gathers per microbatch; :func:`_gradient_traffic`), and what a remat policy's recomputed
  forward sends again (:func:`_recomputed_tensor`, :func:`_recomputes_sequence_forward`).
  Each axis's bytes cost ``α · collectives + bytes / β`` on its link.
- **Overlap (the assumption).** On a GPU the data axis's traffic (gradient reduction, ZeRO
  gathers) overlaps the backward pass, so only what exceeds 2/3 of the compute is exposed; the
  tensor, sequence and pipeline traffic is on the critical path of every layer and is not
  overlapped; host offload copies (as implemented, the offloaded tree is copied in at the step's
  start, docs/memory.md) are exposed. On the simulated CPU devices nothing overlaps.
- **Memory per device**: :mod:`colossal_jax.auto.memory`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from colossal_jax.auto.hardware import CPU_STEP, Hardware
from colossal_jax.auto.memory import (
    chunk_bytes,
    kept_elements,
    memory_terms,
    record_share,
)
from colossal_jax.auto.memory_weights import weight
from colossal_jax.auto.per_device import (
    act_bytes,
    act_split,
    blockwise_attention,
    dims,
    kv_heads,
    param_leaves,
    params_per_device,
    pipeline_messages,
    pipeline_shape,
    rest_params_per_device,
    ring_attention,
    stage_stack_params,
    stored_params_per_device,
    tokens_per_microbatch,
)
from colossal_jax.config.choices import MESH_ORDER
from colossal_jax.config.optimizers import optimizer
from colossal_jax.config.plan import Plan
from colossal_jax.sequence import cost as seq_cost
from colossal_jax.tensor.cost import Grid, layer_elements, linear_elements

RECOMPUTE = {"none": 0.0, "dots": 0.0, "selective": None, "full": 1 / 3, "offload": 1 / 3}
"""Extra FLOPs of each remat policy as a fraction of the step's (None: the attention core's
forward, computed per plan)."""


OVERLAP = 2 / 3
"""The fraction of the compute (the backward pass) that hides the data axis's traffic (GPU)."""


COLLECTIVES_PER_LAYER = {"none": 0, "1d": 6, "2d": 30, "2.5d": 30, "3d": 30}
"""Collectives per layer and microbatch, forward and backward, of each tensor mode (its α
count), as XLA compiles them (the 4-layer GPT's and llama-tiny's plans on 8 CPU devices,
counted in their HLO with loop trips): 1D's all-reduces, about 6 (two forward, two backward,
the layer norms' and the embedding's share); the grids' all-gathers of X and W and
reduce-scatters back for every linear, forward and backward, about 30 (118–121 for 4 layers).
Until 2026-11-27 ``1d`` 4 and the grids 12, counted from the formulas. A mode not listed
counts 30."""


RING_COLLECTIVES_PER_HOP = 8
"""Ring attention's collective-permutes per layer, microbatch and hop: K and V forward, K, V
and their gradients backward, and the positions both ways, as compiled (95 for 4 layers at
``seq=4``, 211 at ``seq=8``; until 2026-11-27 6)."""


ZERO3_COLLECTIVES_PER_LAYER_LEAF = 2.25
"""ZeRO-3's collectives per parameter leaf of a layer, per layer and microbatch: a
reduce-scatter of its gradient and its gathers, forward and backward, of which XLA merges
some (the 4-layer GPT, 16 leaves a layer, 8 CPU devices: 162 reduce-scatters and all-gathers
at ``data=8``, 330 at ``data=4,pipe=2`` ZB-H1 M4, against ``2.25·16·layers·M + 2·21``'s 186
and 330)."""


PARAM_LEAVES = 3
"""Collectives a reduction over ``data`` runs as compiled: XLA's all-reduce combiner merges the
gradient's leaves into about 3 (``data=8`` of the 4-layer GPT and llama-tiny; until 2026-11-27
16, one per stacked leaf). Its all-gathers and reduce-scatters (ZeRO) it does not merge: one
per leaf (:func:`~colossal_jax.auto.per_device.param_leaves`; the GPT's 21 at ZeRO 1 and 2,
pipelined or not; until 2026-12-07 counted 3 too)."""


@dataclass(frozen=True)
class Prediction:
    """Predicted figures of one plan's step, per device.

    Attributes:
      step_s: the step time: compute + bubble + exposed communication + offload copies + the
        simulated CPU devices' own costs.
      compute_s, bubble_s, comm_s, offload_s, cpu_s: its parts (``comm_s``: exposed only;
        ``cpu_s``: :func:`cpu_terms`, 0 on a GPU).
      memory_bytes: peak bytes per device.
      axis_bytes: bytes received per device per step on each mesh axis (before overlap).
      axis_s: seconds of each axis's traffic (before overlap).
      flops: FLOPs per device per step (recompute included).
      model_flops: the model's FLOPs of the step, all devices (no recompute): the MFU numerator.
      state_bytes, activation_bytes: parts of ``memory_bytes``.
    """

    step_s: float
    compute_s: float
    bubble_s: float
    comm_s: float
    offload_s: float
    memory_bytes: float
    axis_bytes: dict[str, float] = field(hash=False)
    axis_s: dict[str, float] = field(hash=False)
    flops: float
    model_flops: float
    state_bytes: float
    activation_bytes: float
    cpu_s: float = 0.0

    def mfu(self, hw: Hardware, n: int) -> float:
        """Model FLOPs utilisation: the model's FLOPs over ``n`` devices' peak for the step."""
        peak = hw.peak_flops if hw.shared else hw.peak_flops * n
        return self.model_flops / (peak * self.step_s)


def _grid(plan: Plan) -> Grid:
    par = plan.config.parallel
    q = par.tensor_row if par.tensor_mode not in ("none", "1d") else 1
    return Grid(par.tensor_mode, par.tensor_size, q=q, d=par.tensor_depth)


def flops(plan: Plan) -> tuple[float, float]:
    """``(model FLOPs of the step, FLOPs per device with recompute)``."""
    cfg = plan.config
    tokens = cfg.batch_size * cfg.seq_len
    model = plan.model.flops_per_token(cfg.seq_len) * tokens
    extra = RECOMPUTE[plan.remat]
    if extra is None:  # selective: the attention core's forward (4·L·s·h of 12·L·s·h per token)
        L, h = plan.model.n_layer, plan.model.n_embd
        extra = 4 * L * cfg.seq_len * h * tokens / model
    return model, model * (1 + extra) / plan.n_devices


ZERO_BUBBLE_SHARE = {"zb-h1": 1 / 3, "zb-v": 1 / 3}
"""A zero-bubble schedule's bubble against the fused schedule with its chunks: ZB-H1 ``p − 1``
unit ticks against 1F1B's ``3(p − 1)``, ZB-V ``p − 1`` half-size ticks against interleaved
(``V = 2``)'s ``3(p − 1)`` (the tick tables with F, B and W one tick each, docs/
pipeline_parallel.md; B and W cost about the same when the linears dominate)."""


TICK_AXES = ("tensor_row", "tensor_col", "tensor_depth", "seq")
"""The axes whose traffic runs inside every layer of a chunk, on its critical path: a stage idle
for a bubble tick idles for that traffic too (``pipe``'s sends are per microbatch, not per
tick; ``data``'s reduction runs once a step)."""

TICK_CPU_TERMS = ("xla_score_s", "ring_score_s")
"""The simulated CPU devices' costs (:data:`~colossal_jax.auto.hardware.CPU_STEP`) that a
chunk's forward and backward run, so a bubble tick idles for them as for the matmuls."""


def bubble(plan: Plan, shared: bool = False) -> float:
    """The pipeline bubble as a fraction of a stage's per-tick work: ``(p − 1) / (M·V)``, a third
    of it for the zero-bubble schedules (:data:`ZERO_BUBBLE_SHARE`). ``shared`` (simulated
    devices on the host's cores): ``1 / (M·V)``, whatever ``p`` — the stages idle in the fill
    and the drain leave their cores to the working ones, and what the sweeps measure falls with
    the microbatches but does not grow with the stages (docs/planner_log.md, "The bubble costs a
    whole tick's work")."""
    p = plan.config.parallel.pipe
    if p == 1:
        return 0.0
    idle = 1 if shared else p - 1
    fused = idle / (plan.schedule_microbatches * plan.virtual_stages)
    return fused * ZERO_BUBBLE_SHARE.get(plan.pipeline, 1.0)


def axis_traffic(plan: Plan) -> dict[str, tuple[float, float]]:
    """``axis -> (bytes received per device per step, collectives)`` for every axis above 1;
    the tensor group's bytes are split evenly over its axes."""
    par, cfg = plan.config.parallel, plan.config
    L, h, a, w, _ = dims(plan)
    ab, mt = act_bytes(plan), plan.schedule_microbatches
    layers = L // par.pipe
    psi = params_per_device(plan)
    out: dict[str, tuple[float, float]] = {}
    tok = tokens_per_microbatch(plan)
    if par.tensor_size > 1:
        per_layer = layer_elements(_grid(plan), int(tok), h, w) * ab
        t = par.tensor_size
        embed = 4 * (t - 1) / t * tok * h * ab  # embedding out + logits stats, fwd + bwd
        total = (per_layer * layers + embed) * mt
        count = COLLECTIVES_PER_LAYER.get(par.tensor_mode, 30) * layers * mt
        re_el, re_count = _recomputed_tensor(plan, int(tok), h, w)
        total += re_el * ab * layers * mt
        count += re_count * layers * mt
        axes = [x for x in ("tensor_row", "tensor_col", "tensor_depth") if getattr(par, x) > 1]
        for x in axes:
            out[x] = (total / len(axes), count / len(axes))
    if par.seq > 1:
        p, s = par.seq, cfg.seq_len
        b = tok * p / s / plan.tensor_split.batch  # sequences of the microbatch on a device
        hh = h / plan.tensor_split.divisor("heads")
        kv = hh * kv_heads(plan) / a  # grouped-query attention: only the K/V heads travel
        name = plan.seq_mode
        again = _recomputes_sequence_forward(plan)
        if name == "ulysses":
            local_kv = kv_heads(plan) // plan.tensor_split.divisor("heads")
            kv *= seq_cost.ulysses_kv_repeat(local_kv, p)
            fwd = seq_cost.ulysses_forward_elements(b, s, hh, p, kv)
            el, count = (2 + again) * fwd, 8 + 4 * again
        elif name == "ring":
            fwd = seq_cost.ring_forward_elements(b, s, kv, p)
            el = (1 + again) * fwd + seq_cost.ring_kernel_backward_elements(b, s, kv, p)
            count = (RING_COLLECTIVES_PER_HOP + 3 * again) * (p - 1)
        else:  # ring self-attention: RingQK and RingAV forward, dK and dV back the same way
            fwd = seq_cost.ring_self_attention_forward_elements(b, s, kv, p)
            el, count = (2 + again) * fwd, (6 + 3 * again) * (p - 1)
        if name != "ulysses" and par.pipelined:
            el *= seq_cost.pipelined_hop_blocks(p)
        out["seq"] = (el * ab * layers * mt, count * layers * mt)
    if par.pipe > 1:
        act = tok * h * ab / act_split(plan)
        n = pipeline_messages(plan)
        # the embeddings, final norm and head, stored split over ``pipe``: gathered whole for
        # the step and their fp32 gradient reduce-scattered back (pipeline/step.py), each of
        # ZeRO's ``data`` shard where ZeRO shards it (the parameters at 3, the gradient from
        # 2), as compiled (GPipe, 1F1B, interleaved and ZB-H1 at ZeRO 0–3, since 2026-12-07)
        one = (par.pipe - 1) / par.pipe * 4 * rest_params_per_device(plan)
        gather = one / (par.data if plan.zero >= 3 else 1)
        scatter = one / (par.data if plan.zero >= 2 else 1)
        out["pipe"] = (n * act + gather + scatter, n + 2 * param_leaves(plan)[1])
    out.update(_gradient_traffic(plan, psi, mt, out.get("seq")))
    return out


def _recomputed_tensor(plan: Plan, m: int, h: int, w: int) -> tuple[float, float]:
    """``(elements, collectives)`` per layer and microbatch that a remat policy's recomputed
    forward sends again on the tensor axes, as compiled (the 4-layer GPT at batch 16 × seq 64
    on 8 CPU devices, compiled ``dots``/``selective``/``full`` against ``none``, the same for
    the three): 1D re-issues one row-parallel all-reduce, the attention output's
    (:func:`~colossal_jax.tensor.cost.linear_elements` ``h → h``: 0.25, 1.75 and 0.75 MiB
    exactly at ``data=4,tensor_row=2``, ``tensor_row=8`` and GPipe ``pipe=2,tensor_row=4``
    M4; the MLP's output all-reduce XLA keeps); the grids re-gather the forward's operands,
    about half the layer's forward-and-backward elements (2D 1.08 MiB predicted against 1.078
    compiled, 2.5D 1.17 against 1.08, 3D 2.11 against 1.98) and half its collectives."""
    if plan.remat == "none":
        return 0.0, 0.0
    grid = _grid(plan)
    if plan.config.parallel.tensor_mode == "1d":
        return linear_elements(grid, m, h, h, row_parallel=True), 1.0
    half = COLLECTIVES_PER_LAYER.get(plan.config.parallel.tensor_mode, 30) / 2
    return layer_elements(grid, m, h, w) / 2, half


def _recomputes_sequence_forward(plan: Plan) -> int:
    """1 where the remat policy's recomputed forward runs the sequence kernel's forward traffic
    again, else 0, as compiled (the 4-layer GPT, ``dots``/``selective``/``full`` against
    ``none``): Ulysses' four all-to-alls and ring self-attention's RingQK and RingAV under
    every policy (+50% of the axis's attention bytes, exactly); ring attention saves its own
    residuals, so under ``dots`` and ``selective`` nothing more, under ``full`` and ``offload``
    its forward hops again where ``p > 2`` (at ``p = 2`` XLA keeps the one hop's blocks)."""
    if plan.remat == "none":
        return 0
    if plan.seq_mode == "ring":
        return int(plan.remat in ("full", "offload") and plan.config.parallel.seq > 2)
    return 1


def _gradient_traffic(
    plan: Plan, psi: float, mt: int, seq: tuple[float, float] | None
) -> dict[str, tuple[float, float]]:
    """The gradient reduction's ``axis -> (bytes, collectives)`` (``seq``: that axis's attention
    traffic, to which a reduction over it adds). The parameters are replicated over ``data``
    and ``seq``; as compiled (the 4-layer GPT at ``data=4,seq=2``, every ZeRO stage): ZeRO 0
    and 1 reduce over ``data × seq`` as one group (counted on ``data``); ZeRO 2 all-reduces the
    gradient over ``seq`` for each accumulated microbatch, then reduce-scatters over ``data``;
    ZeRO 3's reduce-scatter and gathers cover ``seq`` within the ``data`` figure — in a
    pipeline two gathers and a reduce-scatter of the stage's stack per microbatch and one
    gather and one reduce-scatter of the rest (embeddings, final norm, head) a step (compiled,
    ``data=4,pipe=2`` GPipe at M = 2 and 4: 1.92 and 3.63 MiB; until 2026-12-07 every parameter
    three times per microbatch, 2.35 and 4.70); with no ``data`` axis, an all-reduce over
    ``seq``."""
    par = plan.config.parallel
    out: dict[str, tuple[float, float]] = {}
    r, z, accum = par.seq, plan.zero, plan.grad_accum
    layers = plan.model.n_layer // par.pipe
    if r > 1 and (par.data == 1 or z == 2):
        nbytes, count = seq or (0.0, 0.0)
        times = accum if par.data > 1 else 1
        out["seq"] = (nbytes + times * 2 * (r - 1) / r * 4 * psi, count + times * PARAM_LEAVES)
    if par.data > 1:
        d = par.data
        f = (d - 1) / d
        if z in (0, 1):
            f = (d * r - 1) / (d * r)
        per_layer, rest_leaves = param_leaves(plan)
        leaves = per_layer + rest_leaves
        if z == 0:
            nbytes, count = 2 * f * 4 * psi, PARAM_LEAVES
        elif z == 1:
            nbytes, count = 3 * f * 4 * psi, PARAM_LEAVES + leaves
        elif z == 2:
            nbytes, count = (accum + 1) * f * 4 * psi, PARAM_LEAVES + (accum + 1) * leaves
        else:
            layer_gathers = ZERO3_COLLECTIVES_PER_LAYER_LEAF * per_layer * layers * mt
            count = PARAM_LEAVES + layer_gathers + 2 * leaves
            if par.pipelined:  # the stage's stack per microbatch, the rest once a step
                stack, rest = stage_stack_params(plan), rest_params_per_device(plan)
                nbytes = f * 4 * (3 * stack * mt + 2 * rest)
            else:
                nbytes = 3 * f * 4 * psi * mt
        out["data"] = (nbytes, count)
    return out


def _inner_sizes(plan: Plan) -> dict[str, int]:
    """For each axis, the product of the axis sizes inside it in the physical mesh order."""
    sizes = dict(zip(MESH_ORDER, plan.mesh_shape, strict=True))
    out, inner = {}, 1
    for axis in reversed(MESH_ORDER):
        out[axis] = inner
        inner *= sizes[axis]
    return out


def predict(plan: Plan, hw: Hardware, terms: dict[str, float] | None = None) -> Prediction:
    """The predicted step time, memory and traffic of ``plan`` on ``hw``
    (this module's docstring says how); ``terms``: its :func:`memory_terms` when the caller
    has them."""
    model_flops, dev_flops = flops(plan)
    n = plan.n_devices
    rate = hw.peak_flops * hw.efficiency
    compute = dev_flops * (n if hw.shared else 1) / rate
    traffic = axis_traffic(plan)
    inner = _inner_sizes(plan)
    sizes = dict(zip(MESH_ORDER, plan.mesh_shape, strict=True))
    axis_s = {x: hw.link_of(x, inner[x], sizes[x]).seconds(b, c) for x, (b, c) in traffic.items()}
    exposed = sum(s for x, s in axis_s.items() if x != "data")
    if "data" in axis_s:
        hidden = 0.0 if hw.shared else OVERLAP * compute
        exposed += max(0.0, axis_s["data"] - hidden)
    offload = _offload_seconds(plan, hw)
    cpu_parts = {k: CPU_STEP[k] * v for k, v in cpu_terms(plan).items()} if hw.shared else {}
    cpu = sum(cpu_parts.values())
    # A bubble tick idles a stage for a whole chunk's work: its matmuls, the tensor and sequence
    # traffic inside its layers and (simulated CPU) its attention scores, not the matmuls alone.
    chunk_work = compute + sum(s for x, s in axis_s.items() if x in TICK_AXES)
    chunk_work += sum(cpu_parts.get(k, 0.0) for k in TICK_CPU_TERMS)
    bub = chunk_work * bubble(plan, hw.shared)
    if hw.shared:  # a bubble tick on shared cores costs the record traffic every device runs
        bub *= record_share(plan)
    terms = terms if terms is not None else memory_terms(plan)
    r = plan.remat
    state = weight("state", r) * terms["state"] + weight("grads", r) * terms["grads"]
    act = sum(weight(k, r) * v for k, v in terms.items() if k not in ("state", "grads"))
    return Prediction(
        step_s=compute + bub + exposed + offload + cpu,
        compute_s=compute,
        bubble_s=bub,
        comm_s=exposed,
        offload_s=offload,
        memory_bytes=state + act,
        axis_bytes={x: b for x, (b, _) in traffic.items()},
        axis_s=axis_s,
        flops=dev_flops,
        model_flops=model_flops,
        state_bytes=state,
        activation_bytes=act,
        cpu_s=cpu,
    )


GRID_MODES = ("2d", "2.5d", "3d")
"""The tensor modes whose linears run on a grid's blocks (SUMMA-style gathers of both operands,
:mod:`colossal_jax.tensor.two_d`): on simulated CPU devices their FLOPs cost more than 1D's or
a single device's (``grid_flop_s``, :func:`cpu_terms`)."""


def cpu_terms(plan: Plan) -> dict[str, float]:
    """The units of a step's costs on simulated CPU devices that its FLOPs and link bytes do not
    carry, summed over the devices (they share the host's cores), each priced by
    :data:`~colossal_jax.auto.hardware.CPU_STEP`: ``xla_score_s`` and ``ring_score_s``, the
    attention score elements of the step by kernel (``batch · heads · s² · layers``, a third
    more where the remat policy recomputes the attention forward); ``residual_tick_byte_s``,
    for a pipeline, its ticks times the bytes of a stage's record buffers (its residual slots
    times one chunk's record, :func:`~colossal_jax.auto.memory.chunk_bytes`), over every
    device: measured, a tick costs time in proportion to the size of the buffers the loop
    carries, not only to the slot it reads or writes (GPipe against 1F1B at M = 4, 8, 16,
    docs/planner.md); ``stack_tick_byte_s``, for a pipeline, its ticks times the bytes of one
    chunk's stacked parameters on a device (the stage's over ``V``), over every device: every
    tick adds its chunk's gradient into that chunk's rows of the stage's gradient sums (zeros on
    forward and idle ticks) and slices the chunk out of the stack, so a tick costs in proportion
    to the chunk's parameters too (``add_chunk_grad`` and ``chunk_params`` in
    :mod:`colossal_jax.pipeline.executor`; fitted on microbatch count 8 alone, it ranks the
    unfiltered sweep's ``M = 2 / 4 / 16`` variants, docs/planner.md; until 2026-11-29 the whole
    stage's parameters whatever ``V``); ``kept_byte_s``, the bytes the remat policy keeps over
    the step (written in the forward, read in the backward), over every device; and
    ``grid_flop_s``, every FLOP of a 2D, 2.5D or 3D plan, over every device (:data:`GRID_MODES`).
    (Each collective's cost is its link's α, at least ``collective_s``.)"""
    cfg, par, m = plan.config, plan.config.parallel, plan.model
    scores = cfg.batch_size * m.n_head * cfg.seq_len**2 * m.n_layer
    if plan.remat != "none":
        scores *= 4 / 3
    ring = ring_attention(plan) or blockwise_attention(plan)  # the blockwise kernels
    residual = stack = 0.0
    if par.pipelined:
        ticks, slots = pipeline_shape(plan)
        residual = ticks * slots["residual"] * chunk_bytes(plan) * plan.n_devices
        chunk_params = stage_stack_params(plan) / plan.virtual_stages
        stack = ticks * chunk_params * 4 * plan.n_devices  # fp32 gradient sums
    tok = tokens_per_microbatch(plan)
    layers = m.n_layer // par.pipe
    kept = kept_elements(plan) * act_bytes(plan) * tok * layers * plan.schedule_microbatches
    grid = par.tensor_mode in GRID_MODES
    return {
        "xla_score_s": 0.0 if ring else float(scores),
        "ring_score_s": float(scores) if ring else 0.0,
        "residual_tick_byte_s": residual,
        "stack_tick_byte_s": stack,
        "kept_byte_s": kept * plan.n_devices,
        "grid_flop_s": flops(plan)[1] * plan.n_devices if grid else 0.0,
    }


def _offload_seconds(plan: Plan, hw: Hardware) -> float:
    """Host ↔ device copies of a step: the offloaded state both ways, remat ``offload``'s layer
    inputs both ways."""
    par = plan.config.parallel
    n = stored_params_per_device(plan)
    nbytes = 0.0
    slots = optimizer(plan.config.optim.name).state_slots(plan.config.optim.b1)
    if plan.offload in ("optimizer", "params"):
        nbytes += 2 * 4 * n * slots / (par.data if plan.zero >= 1 else 1)
    if plan.offload == "params":
        nbytes += 2 * 4 * n / par.data
    if plan.remat == "offload":
        tok = tokens_per_microbatch(plan)
        L, h = plan.model.n_layer, plan.model.n_embd
        nbytes += 2 * tok * h * act_bytes(plan) * (L // par.pipe) * plan.schedule_microbatches
    if nbytes == 0:
        return 0.0
    return hw.host.seconds(nbytes * (plan.n_devices if hw.shared else 1), 2)


def flops_per_step(plan: Plan) -> float:
    """The model's FLOPs of one step (all devices, no recompute)."""
    return flops(plan)[0]


def fits(pred: Prediction, budget: float) -> bool:
    return math.isfinite(pred.memory_bytes) and pred.memory_bytes <= budget
