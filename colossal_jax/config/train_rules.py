"""The rules of the training fields: steps, batch, precision, the memory modes (remat,
accumulation, offload), the optimizer, checkpoints, evaluation, the XLA preset, the profiler,
multi-process timeouts, and the flags of the benchmark and sampling tools.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from colossal_jax.config.choices import (
    ATTENTION_IMPLS,
    BASELINES,
    HOST_OVERLAP,
    MAX_PEER_TIMEOUT,
    OFFLOADS,
    PRECISIONS,
    REMATS,
)
from colossal_jax.config.errors import ConfigError, choice
from colossal_jax.config.optimizers import check_recipe, optimizer
from colossal_jax.config.parallel_rules import check_axes_for_modes
from colossal_jax.config.seq_modes import seq_mode
from colossal_jax.config.xla_presets import PRESETS

if TYPE_CHECKING:
    from colossal_jax.config.schema import OptimConfig, TrainConfig

MAX_STEPS = 2**31 - 1
"""The most steps a run can take: optax counts steps in an int32 (its schedules stop there)."""

# ---- training and optimizer fields --------------------------------------------------------------


def check_train(cfg: TrainConfig) -> None:
    """The TrainConfig fields (the optimizer's too) and the modes that need an axis."""
    if cfg.steps < 1:
        raise ConfigError(f"--steps {cfg.steps} must be at least 1 (e.g. --steps 100)")
    if cfg.steps > MAX_STEPS:
        raise ConfigError(
            f"--steps {cfg.steps} is more than the optimizer's 32-bit step counter holds "
            f"({MAX_STEPS:_}); e.g. --steps 100000"
        )
    if cfg.batch_size < 1:
        raise ConfigError(
            f"--batch-size {cfg.batch_size} must be at least 1 (e.g. --batch-size 16)"
        )
    if cfg.seq_len < 2:
        raise ConfigError(f"--seq-len {cfg.seq_len} must be at least 2 (e.g. --seq-len 128)")
    if cfg.precision not in PRECISIONS:
        raise ConfigError(choice("--precision", cfg.precision, PRECISIONS))
    check_memory_modes(cfg)
    if cfg.attention not in ATTENTION_IMPLS:
        raise ConfigError(choice("--attention", cfg.attention, ATTENTION_IMPLS))
    par = cfg.parallel
    fused = cfg.attention in ("cudnn", "blockwise")
    if fused and par.seq > 1 and not seq_mode(par.seq_mode).position_order:
        raise ConfigError(
            f"--attention {cfg.attention} cannot run inside --seq-mode {par.seq_mode} (its "
            "blocks are masked by position and combined by log-sum-exp); use --attention auto "
            "or --seq-mode ulysses"
        )
    optimizer(cfg.optim.name)  # a registered one, or ConfigError naming them
    if not (math.isfinite(cfg.optim.lr) and cfg.optim.lr > 0):
        raise ConfigError(f"--lr {cfg.optim.lr} must be positive and finite (e.g. --lr 3e-3)")
    check_optim(cfg.optim)
    if cfg.checkpoint_every < 1:
        raise ConfigError(
            f"--checkpoint-every {cfg.checkpoint_every} must be at least 1 "
            "(e.g. --checkpoint-every 50)"
        )
    check_keep_checkpoints(cfg.keep_checkpoints)
    if cfg.xla_preset is not None:
        check_xla_preset(cfg.xla_preset)
    check_profile(cfg.profile_dir, cfg.profile_steps, cfg.steps)
    _check_run_fields(cfg)
    check_axes_for_modes(par)


def check_keep_checkpoints(keep: int) -> None:
    """``--keep-checkpoints K``: at least the latest one (2 or more leave one to fall back on when
    the latest is damaged)."""
    if not isinstance(keep, int) or keep < 1:
        raise ConfigError(
            f"--keep-checkpoints {keep} must be at least 1 (the latest is what a re-run resumes "
            "from; 2 or more leave one to fall back on); e.g. --keep-checkpoints 3"
        )


def check_peer_timeout(seconds: float) -> None:
    """``--peer-timeout S``: how long a multi-process run waits on a silent peer (its missed
    heartbeats, or a step that does not finish) before it exits; 5 s to an hour. Shorter than a
    step or a compilation would kill healthy runs; very long ones look like a hang."""
    if not isinstance(seconds, int | float) or not 5 <= seconds <= MAX_PEER_TIMEOUT:
        raise ConfigError(
            f"--peer-timeout {seconds} must be between 5 and {MAX_PEER_TIMEOUT} seconds (longer "
            "than the slowest step); e.g. --peer-timeout 120"
        )


def check_memory_modes(cfg: TrainConfig) -> None:
    """``--remat``, ``--grad-accum``, ``--offload`` and how they combine with ZeRO and the
    pipeline."""
    if cfg.remat not in REMATS:
        raise ConfigError(choice("--remat", cfg.remat, REMATS))
    if cfg.offload not in OFFLOADS:
        raise ConfigError(choice("--offload", cfg.offload, OFFLOADS))
    if not isinstance(cfg.grad_accum, int) or cfg.grad_accum < 1:
        raise ConfigError(
            f"--grad-accum {cfg.grad_accum} must be at least 1 (1: no accumulation; e.g. "
            "--grad-accum 4)"
        )
    if cfg.device_batch is not None and (
        not isinstance(cfg.device_batch, int) or cfg.device_batch < 1
    ):
        raise ConfigError(
            f"--device-batch {cfg.device_batch} must be at least 1 (sequences per batch shard "
            "per microbatch; e.g. --device-batch 2), or omit it"
        )
    par = cfg.parallel
    if cfg.remat == "offload" and par.pipe > 1:
        # the tick's switch writes the residuals into the record buffers in device memory;
        # the offloaded ones are in host memory, and the branches' types then differ
        raise ConfigError(
            f"--remat offload keeps each layer's residuals in host memory, which a pipeline's "
            f"record buffers (--pipe {par.pipe}) cannot hold; use --remat full (the least "
            "device memory under a pipeline) or no pipeline"
        )
    if cfg.offload == "params" and par.zero != 3:
        raise ConfigError(
            f"--offload params keeps ZeRO-3's parameter shards in host memory, but --zero is "
            f"{par.zero}; add --zero 3, or use --offload optimizer"
        )


def check_optim(o: OptimConfig) -> None:
    """Values no optimizer can use: negative decay or clipping, moments outside [0, 1)."""
    if o.warmup_steps < 0:
        raise ConfigError(
            f"--warmup-steps {o.warmup_steps} must be 0 or more (e.g. --warmup-steps 20)"
        )
    for flag, value, example, what in (
        ("--weight-decay", o.weight_decay, "0.01", "0 turns it off"),
        ("--clip-norm", o.clip_norm, "1.0", "0 turns clipping off"),
        ("--set optim.eps=", o.eps, "1e-8", "added to the denominator"),
        ("--set optim.min_lr_ratio=", o.min_lr_ratio, "0.1", "final lr / peak lr"),
    ):
        if not (math.isfinite(value) and value >= 0):
            sep = "" if flag.endswith("=") else " "
            raise ConfigError(
                f"{flag}{sep}{value} must be a finite number ≥ 0 ({what}); e.g. "
                f"{flag}{sep}{example}"
            )
    for key, value, example in (("b1", o.b1, 0.9), ("b2", o.b2, 0.95)):
        if not 0 <= value < 1:
            raise ConfigError(
                f"--set optim.{key}={value} must be in [0, 1); e.g. --set optim.{key}={example}"
            )
    check_recipe(o)
    if not (math.isfinite(o.lars_trust) and o.lars_trust > 0):
        raise ConfigError(
            f"--set optim.lars_trust={o.lars_trust} must be positive; e.g. "
            "--set optim.lars_trust=0.001"
        )


def host_overlap(setting: str, platform: str) -> bool:
    """Whether the training loop overlaps its host work with the step in flight: ``on``,
    ``off``, or ``auto`` — on unless ``platform`` (``jax.default_backend()``) is ``cpu``,
    whose "devices" are threads on the host's own cores."""
    if setting == "auto":
        return platform != "cpu"
    return setting == "on"


def _check_run_fields(cfg: TrainConfig) -> None:
    if not 0 <= cfg.seed < 2**63:
        raise ConfigError(f"--seed {cfg.seed} must be in [0, 2**63) (e.g. --seed 0)")
    if cfg.host_overlap not in HOST_OVERLAP:
        raise ConfigError(choice("--set host_overlap", cfg.host_overlap, HOST_OVERLAP))
    if cfg.log_every < 1:
        raise ConfigError(
            f"--set log_every={cfg.log_every} must be at least 1 (e.g. --set log_every=10)"
        )
    if cfg.eval_every < 0:
        raise ConfigError(
            f"--eval-every {cfg.eval_every} must be 0 (off) or more (e.g. --eval-every 50)"
        )
    if cfg.eval_batches < 1:
        raise ConfigError(
            f"--set eval_batches={cfg.eval_batches} must be at least 1 (e.g. --set eval_batches=4)"
        )
    if cfg.peak_tflops is not None and not (math.isfinite(cfg.peak_tflops) and cfg.peak_tflops > 0):
        raise ConfigError(
            f"--peak-tflops {cfg.peak_tflops} must be a positive number of dense bf16 "
            "TFLOP/s per device (e.g. --peak-tflops 989 for an H100)"
        )


def check_bench(baseline: str, timed_steps: int, warmup: int, loop_repeats: int = 1) -> None:
    """The harness's own flags: a known baseline, at least 2 timed steps, no negative warm-up,
    at least one loop window."""
    if loop_repeats < 1:
        raise ConfigError(
            f"--loop-repeats {loop_repeats} measures no loop; use at least 1 (e.g. "
            "--loop-repeats 5)"
        )
    if baseline not in BASELINES:
        raise ConfigError(choice("--baseline", baseline, BASELINES))
    if timed_steps < 2:
        raise ConfigError(
            f"--timed-steps {timed_steps} gives no median worth the name; use at least 2 (e.g. "
            "--timed-steps 20)"
        )
    if warmup < 0:
        raise ConfigError(f"--bench-warmup {warmup} must be 0 or more (e.g. --bench-warmup 3)")


# ---- performance settings (--xla-preset, --profile-dir/--profile-steps) -------------------------


def _presets() -> tuple[str, ...]:
    return tuple(PRESETS)


def check_xla_preset(name: str) -> None:
    if name not in _presets():
        raise ConfigError(choice("--xla-preset", name, _presets()))


def check_profile(directory: str | None, steps: str | None, total_steps: int) -> None:
    """``--profile-steps A:B`` needs ``--profile-dir`` and ``1 <= A <= B <= --steps``."""
    if steps is None:
        return
    example = f"--profile-steps {min(3, total_steps)}:{min(5, total_steps)}"
    if directory is None:
        raise ConfigError(f"--profile-steps {steps} needs --profile-dir DIR (where the trace goes)")
    first, sep, last = str(steps).partition(":")
    try:
        a, b = int(first), int(last)
    except ValueError:
        a, b = 0, -1
    if not sep or not 1 <= a <= b <= total_steps:
        raise ConfigError(
            f"--profile-steps {steps} must be A:B with 1 <= A <= B <= --steps {total_steps} "
            f"(the steps traced, inclusive); e.g. {example}"
        )


# ---- sampling (scripts/generate.py) -------------------------------------------------------------


def check_sampling(
    *,
    prompt_tokens: int,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    num_samples: int,
    vocab_size: int,
    prompt_vocab: int,
) -> None:
    """The sampling flags of ``scripts/generate.py`` against the model's vocabulary."""
    if prompt_tokens < 1:
        raise ConfigError("--prompt is empty; give at least one character, e.g. --prompt 'def '")
    if max_new_tokens < 1:
        raise ConfigError(
            f"--max-new-tokens {max_new_tokens} must be at least 1 (e.g. --max-new-tokens 200)"
        )
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(
            f"--temperature {temperature} must be a finite number ≥ 0 (0: greedy); e.g. "
            "--temperature 0.8"
        )
    if top_k is not None and not 1 <= top_k <= vocab_size:
        raise ConfigError(
            f"--top-k {top_k} must be between 1 and the vocabulary size {vocab_size}; e.g. "
            "--top-k 40, or omit it"
        )
    if num_samples < 1:
        raise ConfigError(f"--num-samples {num_samples} must be at least 1 (e.g. --num-samples 1)")
    if prompt_vocab > vocab_size:
        raise ConfigError(
            f"--prompt encodes to byte ids up to {prompt_vocab - 1}, beyond the model's "
            f"vocabulary of {vocab_size}; use a prompt of characters the model was trained on"
        )
