"""The planner's cost model: predicted step time and memory per device of a :class:`Plan`.

Everything is derived from the model's dimensions and the plan, in closed form (no compile):

- **Compute.** The model's training FLOPs (``flops_per_token(seq_len)``: ``6·N + 12·L·s·h`` for a
  GPT), times the recompute of the remat policy (``full``/``offload``: the forward again, ×4/3;
  ``selective``: the attention core's forward again; ``none``/``dots``: ×1), split over the
  devices, at ``peak_flops · efficiency`` (:mod:`colossal_jax.auto.hardware`). Simulated CPU
  devices share the host's cores, so there the step costs every device's FLOPs at the host's
  measured rate.
- **Pipeline bubble.** ``(p − 1) / (M·V)`` of the compute for GPipe, 1F1B (PipeDream-Flush; the
  same bubble as GPipe, fewer microbatches in flight) and interleaved 1F1B (V chunks per stage,
  Narayanan et al. 2021), ``M`` counting the accumulation's microbatches too; a third of that
  for ZB-H1 and ZB-V (Qi et al. 2024; F, B and W taken as equal).
- **Communication**, bytes received per device per step on each mesh axis, by the formulas of
  docs/formulas.md: tensor (:mod:`colossal_jax.tensor.cost`, every layer of the stage, every
  microbatch), sequence (:mod:`colossal_jax.sequence.cost`), pipeline (one activation forward
  and its gradient back per microbatch and chunk), data (the gradient all-reduce, or ZeRO's
  reduce-scatter + all-gather, stage 2 per microbatch, stage 3 with two gathers per microbatch).
  Each axis's bytes cost ``α · collectives + bytes / β`` on its link.
- **Overlap (the assumption).** On a GPU the data axis's traffic (gradient reduction, ZeRO
  gathers) overlaps the backward pass, so only what exceeds 2/3 of the compute is exposed; the
  tensor, sequence and pipeline traffic is on the critical path of every layer and is not
  overlapped; host offload copies (as implemented, the offloaded tree is copied in at the step's
  start, docs/memory.md) are exposed. On the simulated CPU devices nothing overlaps.
- **Memory per device.** The training state (fp32 parameters, gradients and optimizer slots,
  split over the tensor and pipeline axes and over ``data`` by the ZeRO stage, as
  :func:`~colossal_jax.config.model_rules.state_bytes`; offloaded state still counts, since the
  step copies it in whole), a 16-bit copy of the parameters under bf16/fp16, ZeRO-3's gathered
  layer, the activations each remat policy keeps (per layer and token, below) for the
  microbatches in flight (1 without a pipeline, ``M`` for GPipe, ``p`` for 1F1B, ``p·(1 +
  (p−1)/(p·V))`` interleaved and ZB-V, ``p`` ZB-H1; a split backward's record, the larger of
  the residuals and the linears' inputs and output gradients), the logits and their gradient,
  and a fixed per-device overhead. Attention keeps its ``a·s`` scores per token only where it
  runs XLA's reference kernel: cuDNN flash attention (GPU, 16-bit) and ring attention keep
  none (:func:`scores_per_token`). On a GPU the offloaded state stays in host memory.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from colossal_jax.auto.hardware import Hardware
from colossal_jax.config.choices import MESH_ORDER
from colossal_jax.config.optimizers import optimizer
from colossal_jax.config.plan import Plan
from colossal_jax.config.tensor_modes import tensor_mode
from colossal_jax.config.tensor_split import param_split
from colossal_jax.sequence import cost as seq_cost
from colossal_jax.tensor.cost import Grid, layer_elements

RECOMPUTE = {"none": 0.0, "dots": 0.0, "selective": None, "full": 1 / 3, "offload": 1 / 3}
"""Extra FLOPs of each remat policy as a fraction of the step's (None: the attention core's
forward, computed per plan)."""

OVERLAP = 2 / 3
"""The fraction of the compute (the backward pass) that hides the data axis's traffic (GPU)."""

COLLECTIVES_PER_LAYER = {"none": 0, "1d": 4, "2d": 12, "2.5d": 12, "3d": 12}
"""Collectives per layer and microbatch, forward and backward, of each tensor mode (its α
count): 1D's two all-reduces forward and two backward; the grids gather X and W and scatter
back for each of four linears. A mode not listed counts 12."""

PARAM_LEAVES = 16
"""Parameter arrays a reduction over ``data`` runs one collective for (scanned layers are
stacked: about 16 leaves whatever the depth)."""


@dataclass(frozen=True)
class Prediction:
    """Predicted figures of one plan's step, per device.

    Attributes:
      step_s: the step time: compute + bubble + exposed communication + offload copies.
      compute_s, bubble_s, comm_s, offload_s: its parts (``comm_s``: exposed only).
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

    def mfu(self, hw: Hardware, n: int) -> float:
        """Model FLOPs utilisation: the model's FLOPs over ``n`` devices' peak for the step."""
        peak = hw.peak_flops if hw.shared else hw.peak_flops * n
        return self.model_flops / (peak * self.step_s)


def stack_params(model) -> int:
    """Parameters of the model's layer stack: ``n_layer`` times one layer's, one layer's read
    off the family's own count (``param_count`` with one layer more, minus it)."""
    deeper = dataclasses.replace(model, n_layer=model.n_layer + 1)
    return model.n_layer * (deeper.param_count() - model.param_count())


def params_per_device(plan: Plan) -> float:
    """Parameters one device computes with before ZeRO: the stack split by the tensor mode and
    over ``pipe``, the rest (embeddings, final norm, head) split by the tensor mode only, since
    every pipeline stage gathers it whole for the step (:mod:`colossal_jax.pipeline.step`)."""
    par = plan.config.parallel
    return stored_params_per_device(plan) + rest_params_per_device(plan) * (1 - 1 / par.pipe)


def rest_params_per_device(plan: Plan) -> float:
    """The embeddings, final norm and head one device computes with: split by the tensor mode."""
    return (plan.param_count - stack_params(plan.model)) / param_split(plan.config.parallel)


def stored_params_per_device(plan: Plan) -> float:
    """Parameters one device stores between steps before ZeRO: all of them split by the tensor
    mode and over ``pipe`` (a pipeline stores the rest split over ``pipe`` too)."""
    par = plan.config.parallel
    return plan.param_count / par.pipe / param_split(par)


def _act_bytes(plan: Plan) -> int:
    return 4 if plan.precision == "fp32" else 2


def _dims(plan: Plan) -> tuple[int, int, int, int, int]:
    m = plan.model
    return m.n_layer, m.n_embd, m.n_head, m.mlp_width, m.vocab_size


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

SPLIT_RECORD = (5, 1, 0)
"""What a split backward's record holds after its B, per token and layer, as :data:`PER_TOKEN`
counts (plus the MLP's ``w``-wide down-projection input, :func:`_record_elements`): the
linears' inputs (3 h-wide and the ``w``-wide one) and output gradients (Q/K/V and the MLP's
hidden values, the inner width, and 2 h-wide). Before its B it holds the remat policy's
residuals; a record costs the larger (docs/pipeline_parallel.md)."""


def bubble(plan: Plan) -> float:
    """The pipeline bubble as a fraction of the compute: ``(p − 1) / (M·V)``, a third of it for
    the zero-bubble schedules (:data:`ZERO_BUBBLE_SHARE`)."""
    p = plan.config.parallel.pipe
    if p == 1:
        return 0.0
    fused = (p - 1) / (plan.schedule_microbatches * plan.virtual_stages)
    return fused * ZERO_BUBBLE_SHARE.get(plan.pipeline, 1.0)


def _tokens_per_microbatch(plan: Plan) -> float:
    """Tokens of one microbatch of one data replica and sequence shard (the rows a tensor
    group's linears see)."""
    par = plan.config.parallel
    seqs = plan.config.batch_size / (par.data * plan.schedule_microbatches)
    return seqs * plan.config.seq_len / par.seq


def axis_traffic(plan: Plan) -> dict[str, tuple[float, float]]:
    """``axis -> (bytes received per device per step, collectives)`` for every axis above 1;
    the tensor group's bytes are split evenly over its axes."""
    par, cfg = plan.config.parallel, plan.config
    L, h, a, w, _ = _dims(plan)
    ab, mt = _act_bytes(plan), plan.schedule_microbatches
    layers = L // par.pipe
    psi = params_per_device(plan)
    out: dict[str, tuple[float, float]] = {}
    tok = _tokens_per_microbatch(plan)
    if par.tensor_size > 1:
        per_layer = layer_elements(_grid(plan), int(tok), h, w) * ab
        t = par.tensor_size
        embed = 4 * (t - 1) / t * tok * h * ab  # embedding out + logits stats, fwd + bwd
        total = (per_layer * layers + embed) * mt
        count = COLLECTIVES_PER_LAYER.get(par.tensor_mode, 12) * layers * mt
        axes = [x for x in ("tensor_row", "tensor_col", "tensor_depth") if getattr(par, x) > 1]
        for x in axes:
            out[x] = (total / len(axes), count / len(axes))
    if par.seq > 1:
        p, s = par.seq, cfg.seq_len
        b = tok * p / s  # sequences of the microbatch
        hh = h / plan.tensor_split.divisor("heads")
        name = plan.seq_mode
        if name == "ulysses":
            el, count = 2 * seq_cost.ulysses_forward_elements(b, s, hh, p), 8
        elif name == "ring":
            el = seq_cost.ring_forward_elements(b, s, hh, p) + seq_cost.ring_backward_elements(
                b, s, hh, p
            )
            count = 6 * (p - 1)
        else:  # ring self-attention: RingQK and RingAV forward, twice that backward
            el, count = 3 * seq_cost.ring_self_attention_forward_elements(b, s, hh, p), 6 * (p - 1)
        out["seq"] = (el * ab * layers * mt, count * layers * mt)
    if par.pipe > 1:
        act = tok * h * ab / _act_split(plan)
        n = 2 * mt * plan.virtual_stages
        out["pipe"] = (n * act, n)
    if par.data > 1:
        d = par.data
        f = (d - 1) / d
        z = plan.zero
        accum = plan.grad_accum
        if z == 0:
            nbytes, count = 2 * f * 4 * psi, PARAM_LEAVES
        elif z == 1:
            nbytes, count = 3 * f * 4 * psi, 2 * PARAM_LEAVES
        elif z == 2:
            nbytes, count = (accum + 1) * f * 4 * psi, (accum + 1) * PARAM_LEAVES
        else:
            nbytes, count = 3 * f * 4 * psi * mt, 3 * PARAM_LEAVES * mt
        out["data"] = (nbytes, count)
    return out


def _act_split(plan: Plan) -> int:
    """How many pieces the tensor mode cuts a ``[tokens, h]`` activation into (1D keeps it
    whole on every device; the grids cut rows and columns)."""
    par = plan.config.parallel
    if not tensor_mode(par.tensor_mode).splits_tensor or par.tensor_mode == "1d":
        return 1
    return par.tensor_size


def _inner_sizes(plan: Plan) -> dict[str, int]:
    """For each axis, the product of the axis sizes inside it in the physical mesh order."""
    sizes = dict(zip(MESH_ORDER, plan.mesh_shape, strict=True))
    out, inner = {}, 1
    for axis in reversed(MESH_ORDER):
        out[axis] = inner
        inner *= sizes[axis]
    return out


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
    _, h, _, _, _ = _dims(plan)
    nh, ni, ns = counts
    t = par.tensor_size
    scores = scores_per_token(plan, kept=kept)
    inner = _inner_width(plan)
    if _act_split(plan) > 1:  # a grid: everything over the group
        return (nh * h + ni * inner + ns * scores) / t
    if t > 1:  # 1D: h-wide values whole on every device
        return nh * h + (ni * inner + ns * scores) / t
    return nh * h + ni * inner + ns * scores


def _record_elements(plan: Plan) -> float:
    """Elements per token and layer a microbatch keeps on a stage between its forward and its
    backward: the remat policy's (:data:`PER_TOKEN`); with a split backward (ZB-H1, ZB-V) the
    larger of those and what the record holds after the B (:data:`SPLIT_RECORD`)."""
    kept = _split_elements(plan, PER_TOKEN[plan.remat])
    if plan.pipeline not in ZERO_BUBBLE_SHARE:
        return kept
    _, _, _, w, _ = _dims(plan)
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


def _inner_width(plan: Plan) -> float:
    """The width of a layer's values that every tensor mode splits: Q, K, V (``h + 2·kv``, K
    and V narrower under grouped-query attention) and the MLP's hidden values, one ``w`` per
    input matrix beyond the first (GPT: one; a gated MLP, SwiGLU: two), read off the model's
    matmul parameters where it states them, else ``3h + w``."""
    m = plan.model
    _, h, a, w, vocab = _dims(plan)
    if not hasattr(m, "matmul_params"):
        return 3 * h + w
    kv = getattr(m, "n_kv_head", a) * h / a
    per_layer = (m.matmul_params() - h * vocab) / m.n_layer
    mlp_inputs = max(1, round((per_layer - 2 * h * h - 2 * h * kv) / (h * w)) - 1)
    return h + 2 * kv + mlp_inputs * w


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
    L, h, _, w, vocab = _dims(plan)
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
        grads += _act_bytes(plan) * rest_params_per_device(plan)
    if plan.grad_accum > 1 and plan.zero < 2:
        grads += 4 * n / over(2)
    if plan.precision != "fp32":  # the 16-bit parameter copy, the 16-bit gradient before its cast
        # (ZeRO-3 reduce-scatters each layer's gradient inside the backward pass: one layer's)
        grads += 2 * n / over(3) + (2 * n if plan.zero < 3 else 2 * n / L)
    if plan.zero == 3:
        grads += 2 * 4 * (4 * h * h + 2 * h * w) / param_split(par)
    ab = _act_bytes(plan)
    tok = _tokens_per_microbatch(plan)
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


def predict(plan: Plan, hw: Hardware) -> Prediction:
    """The predicted step time, memory and traffic of ``plan`` on ``hw``
    (this module's docstring says how)."""
    model_flops, dev_flops = flops(plan)
    n = plan.n_devices
    rate = hw.peak_flops * hw.efficiency
    compute = dev_flops * (n if hw.shared else 1) / rate
    bub = compute * bubble(plan)
    traffic = axis_traffic(plan)
    inner = _inner_sizes(plan)
    sizes = dict(zip(MESH_ORDER, plan.mesh_shape, strict=True))
    axis_s = {x: hw.link_of(x, inner[x], sizes[x]).seconds(b, c) for x, (b, c) in traffic.items()}
    exposed = sum(s for x, s in axis_s.items() if x != "data")
    if "data" in axis_s:
        hidden = 0.0 if hw.shared else OVERLAP * compute
        exposed += max(0.0, axis_s["data"] - hidden)
    offload = _offload_seconds(plan, hw)
    terms = memory_terms(plan)
    state = MEMORY_COEF["state"] * terms["state"] + MEMORY_COEF["grads"] * terms["grads"]
    act = sum(MEMORY_COEF[k] * v for k, v in terms.items() if k not in ("state", "grads"))
    return Prediction(
        step_s=compute + bub + exposed + offload,
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
    )


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
        tok = _tokens_per_microbatch(plan)
        L, h = plan.model.n_layer, plan.model.n_embd
        nbytes += 2 * tok * h * _act_bytes(plan) * (L // par.pipe) * plan.schedule_microbatches
    if nbytes == 0:
        return 0.0
    return hw.host.seconds(nbytes * (plan.n_devices if hw.shared else 1), 2)


def flops_per_step(plan: Plan) -> float:
    """The model's FLOPs of one step (all devices, no recompute)."""
    return flops(plan)[0]


def fits(pred: Prediction, budget: float) -> bool:
    return math.isfinite(pred.memory_bytes) and pred.memory_bytes <= budget
