"""A plan's sizes per device, shared by the planner's time and memory models
(:mod:`colossal_jax.auto.cost`, :mod:`colossal_jax.auto.memory`): parameters computed with and
stored, the model's dimensions, the bytes of an activation, the tokens of a microbatch, how a
tensor mode cuts activations, the inner width of a layer, a pipeline schedule's ticks and slots."""

from __future__ import annotations

import dataclasses
import functools

from colossal_jax.config.plan import Plan
from colossal_jax.config.tensor_modes import tensor_mode
from colossal_jax.config.tensor_split import param_split


def stack_params(model) -> int:
    """Parameters of the model's layer stack: ``n_layer`` times one layer's, one layer's read
    off the family's own count (``param_count`` with one layer more, minus it); kept per model
    (the planner asks it for every candidate)."""
    try:
        return _stack_params(model)
    except TypeError:  # a config that cannot be hashed is counted every time
        return _stack_params.__wrapped__(model)


@functools.lru_cache(maxsize=256)
def _stack_params(model) -> int:
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


def stage_stack_params(plan: Plan) -> float:
    """The layer stack's parameters one pipeline stage holds on a device: the stack over
    ``pipe``, split by the tensor mode (a chunk of it is this over the virtual stages)."""
    par = plan.config.parallel
    return stack_params(plan.model) / par.pipe / param_split(par)


def stored_params_per_device(plan: Plan) -> float:
    """Parameters one device stores between steps before ZeRO: all of them split by the tensor
    mode and over ``pipe`` (a pipeline stores the rest split over ``pipe`` too)."""
    par = plan.config.parallel
    return plan.param_count / par.pipe / param_split(par)


def act_bytes(plan: Plan) -> int:
    """Bytes of an activation element: 2 in bf16/fp16, but 4 on the CPU, whose XLA backend
    computes 16-bit element-wise work, reductions and collectives in fp32 (a bf16 6.7B pipeline
    compiled on CPU devices holds what the model predicts with 4 bytes, 113.2 against 110.6 GB,
    and 2.5× what it predicts with 2)."""
    return 4 if plan.precision == "fp32" or plan.devices.platform == "cpu" else 2


def dims(plan: Plan) -> tuple[int, int, int, int, int]:
    m = plan.model
    return m.n_layer, m.n_embd, m.n_head, m.mlp_width, m.vocab_size


def tokens_per_microbatch(plan: Plan) -> float:
    """Tokens of one microbatch of one data replica and sequence shard (the rows a tensor
    group's linears see)."""
    par = plan.config.parallel
    seqs = plan.config.batch_size / (par.data * plan.schedule_microbatches)
    return seqs * plan.config.seq_len / par.seq


def ring_attention(plan: Plan) -> bool:
    """Whether the plan's attention runs the ring kernel (a ``seq`` split in ring mode)."""
    return plan.config.parallel.seq > 1 and plan.seq_mode == "ring"


def blockwise_attention(plan: Plan) -> bool:
    """Whether the plan's attention runs the blockwise kernel (``--attention blockwise``, which
    the configuration allows only where token order is position order: no split, Ulysses)."""
    return plan.config.attention == "blockwise"


def ring_self_attention(plan: Plan) -> bool:
    """Whether the plan's attention runs ring self-attention (a ``seq`` split in that mode)."""
    return plan.config.parallel.seq > 1 and plan.seq_mode == "ring-self-attention"


def act_split(plan: Plan) -> int:
    """How many pieces the tensor mode cuts a ``[tokens, h]`` activation into (1D keeps it
    whole on every device; the grids cut rows and columns)."""
    par = plan.config.parallel
    if not tensor_mode(par.tensor_mode).splits_tensor or par.tensor_mode == "1d":
        return 1
    return par.tensor_size


def kv_heads(plan: Plan) -> int:
    """The model's key/value heads (grouped-query attention; every head when it states none)."""
    return getattr(plan.model, "n_kv_head", None) or plan.model.n_head


def inner_width(plan: Plan) -> float:
    """The width of a layer's values that every tensor mode splits: Q, K, V (``h + 2·kv``, K
    and V narrower under grouped-query attention) and the MLP's hidden values, one ``w`` per
    input matrix beyond the first (GPT: one; a gated MLP, SwiGLU: two), read off the model's
    matmul parameters where it states them, else ``3h + w``."""
    m = plan.model
    _, h, a, w, vocab = dims(plan)
    if not hasattr(m, "matmul_params"):
        return 3 * h + w
    kv = kv_heads(plan) * h / a
    per_layer = (m.matmul_params() - h * vocab) / m.n_layer
    mlp_inputs = max(1, round((per_layer - 2 * h * h - 2 * h * kv) / (h * w)) - 1)
    return h + 2 * kv + mlp_inputs * w


def pipeline_shape(plan: Plan) -> tuple[int, dict[str, int]]:
    """``(ticks, slots)`` of the plan's pipeline schedule: the ticks of one step and how many
    of each buffer (``residual``, ``activation``, ``gradient``, ``saved``, ``wgrad``) a stage
    holds (:func:`colossal_jax.pipeline.schedule.build`, cached per schedule); the plan must be
    pipelined."""
    par = plan.config.parallel
    ticks, slots = _pipeline_shape(
        plan.pipeline, par.pipe, plan.schedule_microbatches, plan.virtual_stages
    )
    return ticks, dict(slots)


@functools.cache
def _pipeline_shape(schedule: str, p: int, m: int, v: int) -> tuple[int, tuple]:
    from colossal_jax.pipeline.schedule import build

    built = build(schedule, p, m, v)
    return built.ticks, tuple(built.slots.items())


def pipeline_messages(plan: Plan) -> int:
    """The activation-sized messages one step's pipeline sends on ``pipe``: every tick whose
    message switch runs one ring (up or down) sends one, a tick running both two
    (:meth:`colossal_jax.pipeline.schedule.Schedule.ring_counts`); the plan must be
    pipelined."""
    par = plan.config.parallel
    return _pipeline_messages(
        plan.pipeline, par.pipe, plan.schedule_microbatches, plan.virtual_stages
    )


@functools.cache
def _pipeline_messages(schedule: str, p: int, m: int, v: int) -> int:
    from colossal_jax.pipeline.schedule import build

    _, up, down, both = build(schedule, p, m, v).ring_counts()
    return up + down + 2 * both


def param_leaves(plan: Plan) -> tuple[int, int]:
    """``(leaves of one layer of the stack, leaves of the rest)`` of the model's parameter
    tree (the 4-layer GPT: 16 and 5): XLA combines a step's all-reduces but not its
    all-gathers and reduce-scatters, which run one per leaf. Read off the family's abstract
    model, kept per model; a layer's leaves are those under a
    :class:`~colossal_jax.layers.stack.Stack`'s ``layers`` (every family's stack is one)."""
    try:
        return _param_leaves(plan.config.model, plan.model)
    except TypeError:  # a config that cannot be hashed is counted every time
        return _param_leaves.__wrapped__(plan.config.model, plan.model)


@functools.lru_cache(maxsize=64)
def _param_leaves(name: str, model) -> tuple[int, int]:
    import jax
    from flax import nnx

    from colossal_jax.config.families import family_of

    family = family_of(name)
    _, params = nnx.split(nnx.eval_shape(lambda: family.build(model, rngs=nnx.Rngs(0))))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    stack = sum(1 for p in paths if "['layers']" in p)
    return stack, len(paths) - stack
