"""The rules that read the resolved model config (any family's): its dimensions, its task's data
and sequence, every divisibility the mesh and modes need of the batch, the sequence and the model,
gradient accumulation, and the training-state memory floor.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING, Any

from colossal_jax.config import optimizers
from colossal_jax.config.choices import DIGITS_SHAPE, IMAGE_DATA, MASKED_LM_MIN_SEQ, MAY_BE_ZERO
from colossal_jax.config.errors import ConfigError
from colossal_jax.config.optimizers import optimizer
from colossal_jax.config.parallel_rules import check_seq_split, check_ulysses_heads, uses_zigzag
from colossal_jax.config.seq_modes import seq_mode
from colossal_jax.config.tensor_modes import tensor_mode
from colossal_jax.config.tensor_split import (
    _near,
    batch_shards,
    check_kv_heads,
    check_split,
    kv_heads_of,
    param_split,
    split_of,
)

if TYPE_CHECKING:
    from colossal_jax.config.schema import TrainConfig


def param_count(m: Any) -> int:
    """Parameters of the module a model config ``m`` (any family's,
    :class:`colossal_jax_models.registry.ModelConfig`) builds: its own count (kept per config:
    the planner asks it for every candidate)."""
    try:
        return _counted(m)
    except TypeError:  # a config that cannot be hashed is counted every time
        return m.param_count()


@functools.lru_cache(maxsize=256)
def _counted(m: Any) -> int:
    return m.param_count()


def state_bytes(cfg: TrainConfig, m: Any) -> float:
    """A floor on the bytes of training state per device in device memory: fp32 parameters,
    gradients and optimizer moments split by the tensor mode (:func:`param_split`: 2.5D's depth
    layers hold the same blocks) and the pipeline, and over ``data``
    by the ZeRO stage (moments from 1, gradients from 2, parameters at 3); host-offloaded state
    does not count. No activations, so a model this refuses cannot fit whatever the
    activations."""
    par, n = cfg.parallel, param_count(m)
    slots = optimizer(cfg.optim.name).state_slots(cfg.optim.b1)
    split = param_split(par) * par.pipe

    def over_data(from_stage: int) -> int:
        return split * (par.data if par.zero >= from_stage else 1)

    params = 0.0 if cfg.offload == "params" else 4 * n / over_data(3)
    opt = 0.0 if cfg.offload in ("optimizer", "params") else 4 * n * slots / over_data(1)
    return params + 4 * n / over_data(2) + opt


def check_with_model(cfg: TrainConfig, model: Any, memory: tuple[int, int] | None = None) -> None:
    """The rules that need the resolved model, for a ``cfg`` that passed the others: its
    dimensions, the memory floor (given ``memory``), then the run's divisibilities."""
    check_model(model, _models()[cfg.model], cfg.model_overrides)
    check_task(cfg, model)
    if memory is not None:
        check_memory(cfg, model, *memory)
    check_run(cfg, model)


def check_model(model: Any, base: Any, overrides: dict[str, Any]) -> None:
    """Model dimensions no mesh can fix. ``model`` and ``base`` (the named model) are configs of
    one family (:class:`colossal_jax_models.registry.ModelConfig`); ``overrides`` the ``--set
    model.*``
    values, so the message names the flag that was given."""
    for f in dataclasses.fields(model):
        example = getattr(base, f.name)
        value = getattr(model, f.name)
        if isinstance(example, bool) or not isinstance(example, int | float):
            continue
        if isinstance(example, int):
            least = 0 if f.name in MAY_BE_ZERO else 1
            if not isinstance(value, int) or value < least:
                what = "a positive integer" if least else "an integer ≥ 0"
                raise ConfigError(
                    f"--set model.{f.name}={value} must be {what}; e.g. "
                    f"--set model.{f.name}={example}"
                )
            continue
        least = 1.0 if f.name == "rope_theta" else 0.0
        if not (math.isfinite(value) and value >= least):
            raise ConfigError(
                f"--set model.{f.name}={value} must be a finite number ≥ {least:g}; e.g. "
                f"--set model.{f.name}={example}"
            )
    h, heads = model.n_embd, model.n_head
    if h % heads:
        if "n_head" in overrides and "n_embd" not in overrides:
            near = _near(heads, [d for d in range(1, h + 1) if h % d == 0])
            raise ConfigError(
                f"--set model.n_head={heads} does not divide model.n_embd={h}; use "
                f"--set model.n_head={' or '.join(map(str, near))}"
            )
        lo = max(heads, h // heads * heads)
        near = sorted({lo, h // heads * heads + heads} - {h})
        raise ConfigError(
            f"--set model.n_embd={h} is not divisible by model.n_head={heads}; use "
            f"--set model.n_embd={' or '.join(map(str, near))}"
        )
    if model.position == "rope" and (h // heads) % 2:
        raise ConfigError(
            f"--set model.position=rope needs an even head size, but n_embd/n_head = {h}/{heads} "
            f"= {h // heads}; use --set model.n_embd={h + heads} or --set model.position=learned"
        )
    patch = getattr(model, "patch_size", None)
    if patch is not None and model.image_size % patch:
        fits = [p for p in range(1, model.image_size + 1) if model.image_size % p == 0]
        near = " or ".join(map(str, _near(patch, fits)))
        raise ConfigError(
            f"--set model.patch_size={patch} does not divide model.image_size="
            f"{model.image_size}; use --set model.patch_size={near}"
        )


def _models() -> dict[str, Any]:
    from colossal_jax.config.families import MODELS

    return MODELS


def _fields(model: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(model)}


def check_task(cfg: TrainConfig, model: Any) -> None:
    """The data and the sequence fit the family's task
    (:data:`colossal_jax_models.registry.TASKS`)."""
    from colossal_jax.config.families import task_of

    task = task_of(cfg.model)
    if task == "image_classification":
        _check_images(cfg, model)
        return
    if cfg.data in IMAGE_DATA:
        raise ConfigError(
            f"--data {cfg.data} is an image set, but --model {cfg.model} trains on text ({task}); "
            "use --data stdlib, synthetic, a text file or a .npy file (./"
            f"{cfg.data} for a file of that name), or an image model, e.g. --model vit-tiny"
        )
    if task == "masked_lm":
        if cfg.seq_len < MASKED_LM_MIN_SEQ:
            raise ConfigError(
                f"--seq-len {cfg.seq_len} is too short for masked LM sequences [CLS] A [SEP] B "
                f"[SEP]; use --seq-len {MASKED_LM_MIN_SEQ} or more (e.g. 128)"
            )
        types, seq = getattr(model, "type_vocab_size", 0), cfg.parallel.seq
        if types and seq > 1:
            raise ConfigError(
                f"model.type_vocab_size={types}: a token's segment is counted from the [SEP] "
                f"tokens before it, which the sequence split seq={seq} hides from a device; use "
                "--set model.type_vocab_size=0 or a mesh without seq"
            )


def _check_images(cfg: TrainConfig, model: Any) -> None:
    if cfg.data not in IMAGE_DATA:
        raise ConfigError(
            f"--data {cfg.data}: --model {cfg.model} classifies images; use --data digits "
            "(scikit-learn's 8×8 handwritten digits) or shapes (generated at the model's size); "
            f"in Python, TrainConfig.for_model({cfg.model!r}) starts from the family's defaults"
        )
    side, channels, classes = DIGITS_SHAPE
    if cfg.data == "digits" and (
        model.image_size != side or model.channels != channels or model.num_classes < classes
    ):
        raise ConfigError(
            f"--data digits are {side}×{side}×{channels} images of {classes} classes, but "
            f"--model {cfg.model} takes {model.image_size}×{model.image_size}×{model.channels} "
            f"images of {model.num_classes}; use --data shapes (generated at the model's size) "
            "or --model vit-tiny"
        )
    if cfg.seq_len != model.seq_len:
        g = model.image_size // model.patch_size
        raise ConfigError(
            f"--seq-len {cfg.seq_len} does not fit --model {cfg.model}: an image is "
            f"{model.seq_len} tokens ({g}×{g} patches of {model.patch_size}×{model.patch_size} "
            f"pixels and the class token); use --seq-len {model.seq_len}"
        )


# ---- the run: the config against the model -----------------------------------------------------


def check_run(cfg: TrainConfig, model: Any) -> None:
    """Every divisibility the mesh and modes need of the batch, the sequence and the model."""
    par = cfg.parallel
    if cfg.seq_len > model.block_size:
        fix = (
            f"(n_positions of --init-from-hf {cfg.init_from_hf})"
            if cfg.init_from_hf is not None
            else f"or --set model.block_size={cfg.seq_len}"
        )
        raise ConfigError(
            f"--seq-len {cfg.seq_len} exceeds the model's block_size {model.block_size}; use "
            f"--seq-len {model.block_size} {fix}"
        )
    split = batch_shards(par)
    if cfg.batch_size % split:
        good = split * max(1, round(cfg.batch_size / split))
        raise ConfigError(
            f"--batch-size {cfg.batch_size} is not divisible by the {split} batch shards of the "
            f"mesh ({par.short()}, tensor_mode={par.tensor_mode}); use --batch-size {good}"
        )
    check_device_batch(cfg)
    accum = grad_accum_of(cfg)
    if accum > 1 and not par.pipelined and cfg.batch_size % (split * accum):
        n = split * accum
        raise ConfigError(
            f"--batch-size {cfg.batch_size} does not divide into --grad-accum {accum} "
            f"microbatches over the {split} batch shards ({split}·{accum} = {n}); use "
            f"--batch-size {n * max(1, round(cfg.batch_size / n))} or a smaller --grad-accum"
        )
    if par.seq > 1:
        check_seq_split(cfg.seq_len, par.seq, zigzag=uses_zigzag(par, model))
    if par.pipelined:
        _check_pipeline_split(cfg, model, split)
    tensor = split_of(par)
    if seq_mode(par.seq_mode).splits_heads and par.seq > 1:
        check_ulysses_heads(model.n_head, par.seq, tensor.divisor("heads"))
    try:
        check_split(
            tensor,
            hidden=model.n_embd,
            mlp=model.mlp_width,
            heads=model.n_head,
            vocab=model.vocab_size,
        )
        check_kv_heads(
            par.tensor_mode,
            model.n_head,
            kv_heads_of(model),
            tensor.divisor("heads"),
            par.tensor_depth,
        )
        embedding = tensor.divisor("vocab size")
        if model.position == "learned" and model.block_size % embedding:
            raise ConfigError(
                f"block_size {model.block_size} is not divisible by the embedding split {embedding}"
            )
    except ConfigError as e:
        raise ConfigError(f"{e} (model {cfg.model}, tensor_mode={par.tensor_mode})") from None


def grad_accum_of(cfg: TrainConfig) -> int:
    """Microbatches accumulated per optimizer step, the one place the step count of the
    accumulation is derived: ``--grad-accum``, or with ``--device-batch D`` the count that makes
    each microbatch ``D`` sequences per batch shard, ``batch_size / (batch_shards · M · D)``
    (M: the pipeline's microbatches, 1 without a pipeline). The global batch, and so the loss
    sequence, is then the same on any mesh. A batch that does not divide is refused by
    :func:`check_device_batch`; here the count is floored (at least 1)."""
    if cfg.device_batch is None:
        return cfg.grad_accum
    per_step = batch_shards(cfg.parallel) * cfg.parallel.num_microbatches * cfg.device_batch
    return max(1, cfg.batch_size // per_step)


def check_device_batch(cfg: TrainConfig) -> None:
    """``--device-batch D`` divides the sequences each batch shard gets per pipeline microbatch
    (``batch_size / (batch_shards · M)``), and agrees with an explicit ``--grad-accum`` > 1."""
    d = cfg.device_batch
    if d is None:
        return
    par = cfg.parallel
    shards, m = batch_shards(par), par.num_microbatches
    pieces = shards * m
    where = f"the {shards} batch shards of the mesh ({par.short()}, tensor_mode={par.tensor_mode})"
    if m > 1:
        where += f" × {m} pipeline microbatches"
    if cfg.batch_size % pieces:
        good = pieces * d * max(1, round(cfg.batch_size / (pieces * d)))
        raise ConfigError(
            f"--batch-size {cfg.batch_size} does not split over {where} ({pieces} pieces); use "
            f"--batch-size {good} (--device-batch {d} accumulates {good // (pieces * d)} "
            "microbatches)"
        )
    per = cfg.batch_size // pieces
    if per % d:
        fits = [k for k in range(1, per + 1) if per % k == 0]
        near = _near(d, fits) if d <= per else [per]
        good = pieces * d * max(1, round(cfg.batch_size / (pieces * d)))
        raise ConfigError(
            f"--device-batch {d} does not divide the {per} sequences per shard of --batch-size "
            f"{cfg.batch_size} over {where}; use --device-batch {' or '.join(map(str, near))}, "
            f"or --batch-size {good}"
        )
    if cfg.grad_accum > 1 and cfg.grad_accum != per // d:
        raise ConfigError(
            f"--grad-accum {cfg.grad_accum} contradicts --device-batch {d}: --batch-size "
            f"{cfg.batch_size} over {where} is {per // d} microbatches of {d} sequences per "
            f"shard; omit --grad-accum (--device-batch derives it) or use --grad-accum {per // d}"
        )


def _check_pipeline_split(cfg: TrainConfig, model: Any, split: int) -> None:
    # gradient accumulation composes with a pipeline as more microbatches per step
    par, accum = cfg.parallel, grad_accum_of(cfg)
    m = par.num_microbatches * accum
    chunks = par.pipe * par.virtual_stages
    if model.n_layer % chunks:
        good = chunks * max(1, round(model.n_layer / chunks))
        what = f"pipe={par.pipe}" + (
            f" × virtual_stages={par.virtual_stages}" if par.virtual_stages > 1 else ""
        )
        raise ConfigError(
            f"n_layer={model.n_layer} does not split into {chunks} equal pipeline chunks "
            f"({what}); use --set model.n_layer={good} or another pipe size"
        )
    if cfg.batch_size % (split * m):
        good = split * m * max(1, round(cfg.batch_size / (split * m)))
        raise ConfigError(
            f"--batch-size {cfg.batch_size} does not divide into {m} microbatches over the "
            f"{split} batch shards ({split}·{m} = {split * m}); use --batch-size {good} or "
            "fewer --microbatches" + (" / --grad-accum" if accum > 1 else "")
        )


# ---- memory -------------------------------------------------------------------------------------


def check_memory(cfg: TrainConfig, model: Any, capacity: int, sharing: int = 1) -> None:
    """Refuse a model whose training state alone exceeds the memory: ``capacity`` bytes shared by
    ``sharing`` devices (simulated CPU devices share the host's memory). The caller measures the
    capacity (``checks.resolve`` reads it from the plan's devices)."""
    need = state_bytes(cfg, model)
    if need * sharing <= capacity:
        return
    from colossal_jax.config.families import family_of

    sized = {
        name: (
            dataclasses.replace(b, vocab_size=model.vocab_size) if "vocab_size" in _fields(b) else b
        )
        for name, b in family_of(cfg.model).sizes.items()
    }
    fits = sorted(
        (param_count(b), name)
        for name, b in sized.items()
        if state_bytes(cfg, b) * sharing <= capacity
    )
    where = (
        f"the {sharing} devices of this host share {capacity / 1e9:.1f} GB"
        if sharing > 1
        else f"a device has {capacity / 1e9:.1f} GB"
    )
    alternative = f"e.g. --model {fits[-1][1]}" if fits else "a smaller --model"
    raise ConfigError(
        f"--model {cfg.model} ({param_count(model) / 1e9:.2f}B parameters) needs at least "
        f"{need / 1e9:.1f} GB per device for fp32 parameters, gradients and {cfg.optim.name} "
        f"state on the mesh {cfg.parallel.short()}, but {where}; use {alternative}, more tensor "
        "parallelism, or --zero 3"
    )


def check_baseline(cfg: TrainConfig, baseline: str) -> None:
    """What each baseline can mirror. ``plain-jax`` (benchmarks/plain_jax_gpt.py) shards over
    ``data`` and tensor modes none, 1d and 2d, with learned positions, fp32 or bf16, no ZeRO,
    offload, accumulation, pipeline or sequence split, and no remat that recomputes a matmul
    (``none`` or ``dots``): its step must do the library's work and nothing else. ``torch``
    runs on one device with AdamW and learned positions."""
    if baseline == "none":
        return
    model = _models()[cfg.model]
    if type(model).__name__ != "GPTConfig":
        raise ConfigError(
            f"--baseline {baseline} is the GPT family's model, not --model {cfg.model}'s; use a "
            "GPT model (e.g. --model gpt2-tiny) or --baseline none"
        )
    position = cfg.model_overrides.get("position", model.position)
    if position != "learned":
        raise ConfigError(
            f"--baseline {baseline} has learned positions only, not model.position={position}; "
            "drop --set model.position or use --baseline none"
        )
    if baseline == "torch":
        if not optimizer(cfg.optim.name).torch_baseline:
            torch = "|".join(optimizers.TABLE.names(lambda o: o.torch_baseline))
            raise ConfigError(
                f"--baseline torch trains with AdamW only, not --optimizer {cfg.optim.name}; "
                f"use --optimizer {torch} or --baseline plain-jax"
            )
        return
    par = cfg.parallel
    unmirrored = [
        (par.pipe > 1, f"pipe={par.pipe}"),
        (par.seq > 1, f"seq={par.seq}"),
        (
            not tensor_mode(par.tensor_mode).plain_jax_baseline,
            f"--tensor-mode {par.tensor_mode}",
        ),
        (par.zero != 0, f"--zero {par.zero}"),
        (cfg.remat not in ("none", "dots"), f"--remat {cfg.remat}"),
        (cfg.offload != "none", f"--offload {cfg.offload}"),
        (grad_accum_of(cfg) != 1, "gradient accumulation"),
        (cfg.precision == "fp16", "--precision fp16 (loss scaling)"),
    ]
    for bad, what in unmirrored:
        if bad:
            raise ConfigError(
                f"--baseline plain-jax mirrors data parallelism and 1d/2d tensor parallelism "
                f"only, not {what}; e.g. --mesh data=2,tensor=4 --tensor-mode 2d, or "
                "--baseline none"
            )
