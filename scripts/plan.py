#!/usr/bin/env python
"""Plan a run: the mesh, modes, pipeline, ZeRO, remat, offload and accumulation that the
planner predicts fastest within the memory per device (docs/planner.md).

Examples:
  python scripts/plan.py --model gpt2-tiny --set model.n_layer=4 --set model.n_embd=256 \\
      --devices 8 --batch-size 16 --seq-len 256 --out /tmp/plan.toml
  python scripts/train.py --mesh /tmp/plan.toml --set model.n_layer=4 --set model.n_embd=256 \\
      --batch-size 16 --seq-len 256
  python scripts/plan.py --model gpt3-175b --devices 512 --device h100 --batch-size 1536 \\
      --seq-len 2048

Prints a ranked table (plan, predicted step time, memory per device, MFU, bytes per mesh axis,
why each plan lost to the best); ``--out`` writes the best as a ``meshes/`` TOML preset.
``--verify K`` compiles the plans in rank order on N simulated CPU devices (cached on disk)
until K fit the memory budget, and replaces the kept plans' predicted memory by the compiled
peak. For a GPU target the CPU compile is a conservative stand-in, not the GPU's figure: flash
attention compiles as the blockwise kernel, but bf16 activations are held in fp32 and
offloaded state in device memory. A plan compiled within the budget is kept; one compiled over
it is dropped where its prediction for the CPU was within it, and skipped (the CPU cannot
confirm it) where that prediction was over it too (see :func:`verify`). A request no plan
fits exits 2 with one line naming the memory per device that would fit and the plan.
On ``--device cpu`` (this machine's simulated devices are the target) it then builds and times
the 3 best-predicted plans (``--measure K`` for another count, 0 for none; a warm-up step, the
median of 3, paired with the first as the reference; cached on disk), and the first's layout
under its best-predicted other remat policy, and chooses the fastest measured: the model
decides which plans lead, a measurement which of them wins (the model's error on these devices
is larger than the gaps between its leading plans, and largest on remat, docs/planner.md).
``--time-budget`` covers the search and the timing together; without it the timing has 80 s
of its own: a plan is timed only while the slowest timed so far would end within it, so a slow
host times fewer, and a plan read from the cache counts the time its timing took, so a second
run chooses as the first did.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

from colossal_jax.auto import attention_memory, hardware, memory
from colossal_jax.auto.choose import budget_of, preset_text, summary
from colossal_jax.auto.hardware import DEVICES
from colossal_jax.auto.search import (
    GB,
    LEADING,
    Ranked,
    SearchResult,
    other_remat,
    plan_for,
    why_lost,
)
from colossal_jax.auto.timed import MEASURE_TIME_BUDGET, Timed, time_best
from colossal_jax.checks.preflight import check_writable_file
from colossal_jax.cli.configure import model_overrides
from colossal_jax.config import ConfigError, TrainConfig


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt2-tiny", help="model name (as scripts/train.py)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="[model.]FIELD=VALUE",
        help="override a model field, e.g. --set n_layer=4 (or --set model.n_layer=4)",
    )
    p.add_argument("--devices", type=int, default=8, help="devices to plan for (default 8)")
    p.add_argument(
        "--device",
        default="cpu",
        choices=DEVICES,
        help="device kind: its peak FLOP/s, memory and links (cpu: calibrated)",
    )
    p.add_argument(
        "--memory-gb",
        type=float,
        default=None,
        help="memory per device in GB (default: the device's; cpu: host RAM / devices)",
    )
    p.add_argument("--batch-size", type=int, default=None, help="global batch in sequences")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence")
    p.add_argument(
        "--precision",
        default=None,
        choices=("fp32", "bf16", "fp16"),
        help="compute precision (default: bf16 on a GPU, fp32 on the CPU)",
    )
    p.add_argument("--top", type=int, default=10, help="rows of the table (default 10)")
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="stop searching after S seconds with the best plan found so far; with --measure "
        "it covers the timing too (default: no limit on the search, and "
        f"{MEASURE_TIME_BUDGET:.0f} s for the timing: as many leading plans as fit)",
    )
    p.add_argument(
        "--verify",
        type=int,
        default=0,
        metavar="K",
        help="compile plans in rank order until K fit the budget (compiled memory, "
        "on N simulated CPU devices); drop those over it",
    )
    p.add_argument(
        "--measure",
        type=int,
        default=None,
        metavar="K",
        help="--device cpu: time the K best-predicted plans, and with K ≥ 2 the first's layout "
        "under its best-predicted other remat policy, on the simulated devices (cached); "
        f"choose the fastest measured (default {LEADING}; 0: the model alone)",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="PRESET.toml",
        help="write the best plan as a mesh preset for scripts/train.py --mesh",
    )
    return p.parse_args(argv)


def config_of(args: argparse.Namespace) -> TrainConfig:
    """The run to plan: the model's training defaults, the batch, sequence and precision."""
    fields: dict = {"model_overrides": model_overrides(args.model, args.set)}
    if args.batch_size is not None:
        fields["batch_size"] = args.batch_size
    if args.seq_len is not None:
        fields["seq_len"] = args.seq_len
    fields["precision"] = args.precision or ("fp32" if args.device == "cpu" else "bf16")
    return TrainConfig.for_model(args.model, **fields)


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f}{unit}"
    return f"{nbytes:.0f}B"


def table(result: SearchResult, hw: hardware.Hardware, n: int, top: int) -> list[str]:
    """The ranked table's lines."""
    best = result.best
    rows = [f"{'#':>3} {'plan':64} {'step':>10} {'mem/dev':>8} {'MFU':>5}  bytes/axis/step"]
    for i, r in enumerate(result.ranked[:top], 1):
        p = r.prediction
        axes = " ".join(f"{a}={_size(b)}" for a, b in p.axis_bytes.items()) or "-"
        rows.append(
            f"{i:>3} {r.name:64} {p.step_s * 1e3:>8.1f}ms {p.memory_bytes / GB:>6.2f}GB "
            f"{p.mfu(hw, n):>5.2f}  {axes}"
        )
        if i > 1:
            rows.append(f"{'':>4}lost: {why_lost(best, r)}")
    return rows


def _on_cpu(plan):
    """``plan`` as the simulated CPU devices compile it (offloaded state in their memory), and
    what ``--verify`` compiles there: where the GPU would run cuDNN flash attention, the
    blockwise kernel (``--attention blockwise``, :mod:`colossal_jax.sequence.blockwise`), which
    like cuDNN keeps no score matrix, so the CPU compile holds what the GPU's would."""
    if plan.devices.platform == "cpu":
        return plan
    flash = attention_memory.flash_attention(plan)
    plan = dataclasses.replace(plan, devices=dataclasses.replace(plan.devices, platform="cpu"))
    if flash:
        plan = dataclasses.replace(
            plan, config=dataclasses.replace(plan.config, attention="blockwise")
        )
    return plan


def verify(result: SearchResult, k: int, n: int, budget: float) -> list[str]:
    """Compile the plans in rank order (on ``n`` simulated CPU devices) until ``k`` of them fit
    ``budget``, at most ``3k`` compiles that decide (and ``10k`` in all); those kept carry their
    compiled memory. Each compile is
    read against the plan's prediction *as the CPU compiles it* (:func:`_on_cpu`: the blockwise
    kernel in place of cuDNN's, so the scores are not the difference, but the CPU's XLA holds
    16-bit activations in fp32, :func:`colossal_jax.auto.per_device.act_bytes`, and offloaded
    state in the devices' memory):

    - compiled within the budget: confirmed, kept (whatever the CPU prediction said);
    - compiled over it, predicted within it: the prediction was wrong, the plan is dropped;
    - compiled over it, predicted over it as the CPU compiles it: the CPU cannot confirm the
      plan either way, it is skipped (not dropped: the GPU's prediction stands untested).

    A plan that offloads state to the host and is over the budget as the CPU compiles it is
    skipped without compiling: the CPU compile holds the offloaded state in device memory, so it
    could only be over. Reports the compiled memory against the prediction as the CPU compiles
    the plan (and the GPU's beside it)."""
    from colossal_jax.auto.measure import compile_cached

    lines, kept, tried, compiles, skipped, over = [], [], 0, 0, [], []
    ranked = list(result.ranked)
    at = 0
    while at < len(ranked) and len(kept) < k and tried < 3 * k and compiles < 10 * k:
        r = ranked[at]
        at += 1
        cpu_plan = _on_cpu(r.plan)
        on_cpu = memory.memory_bytes(cpu_plan)
        on_gpu = r.plan.devices.platform != "cpu"
        if on_cpu > budget and on_gpu and r.plan.offload != "none":  # held on the CPU's devices
            skipped.append(f"{r.name} ({on_cpu / GB:.1f} GB, offload={r.plan.offload})")
            continue
        compiles += 1
        compiled, _ = compile_cached(cpu_plan)
        pred = r.prediction.memory_bytes
        err = (on_cpu - compiled.peak_bytes) / compiled.peak_bytes
        fits = compiled.peak_bytes <= budget
        unconfirmed = not fits and on_cpu > budget and on_gpu
        gpu = f"; on the GPU {pred / GB:.3f}" if on_gpu else ""
        verdict = ""
        if unconfirmed:
            verdict = (
                f"; over the budget {budget / GB:.2f} GB as predicted for the CPU, which "
                "cannot confirm it: skipped"
            )
            skipped.append(f"{r.name} (compiled {compiled.peak_bytes / GB:.1f} GB)")
        else:
            tried += 1
        if not unconfirmed and not fits:
            verdict = f"; over the budget {budget / GB:.2f} GB, dropped"
            over.append(f"{r.name} {compiled.peak_bytes / GB:.1f} GB (predicted {pred / GB:.1f})")
        lines.append(
            f"compiled {r.name}: {compiled.peak_bytes / GB:.3f} GB per device (predicted "
            f"{on_cpu / GB:.3f} as the CPU compiles it, {err:+.0%}{gpu}), compile "
            f"{compiled.compile_s:.1f}s" + verdict
        )
        if fits:
            kept.append(
                dataclasses.replace(
                    r,
                    prediction=dataclasses.replace(r.prediction, memory_bytes=compiled.peak_bytes),
                )
            )
    if skipped:
        first = "; ".join(skipped[:3]) + ("; …" if len(skipped) > 3 else "")
        lines.append(
            f"skipped {len(skipped)} plans predicted to fit on the GPU that the CPU could not "
            "confirm (its XLA holds 16-bit activations in fp32 and offloaded state in device "
            f"memory), in rank order: {first}"
        )
    result.ranked[:] = kept + ranked[at:]
    if not kept:
        if skipped and not over:
            raise ConfigError(
                f"none of the best {len(skipped)} plans could be confirmed by compiling on the "
                f"CPU within {budget / GB:.2f} GB per device ({first}): plan with --verify 0 to "
                "keep the GPU's predictions, or give more --memory-gb"
            )
        raise ConfigError(
            f"the best {tried} plans compiled over the budget {budget / GB:.2f} GB per device "
            f"({'; '.join(over)}); give more --memory-gb or more --devices"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        cfg = config_of(args)
        hw = hardware.hardware(args.device, args.memory_gb)
        n = args.devices
        if n < 1:
            raise ConfigError(f"--devices {n} must be at least 1 (e.g. --devices 8)")
        if args.verify < 0:
            raise ConfigError(f"--verify {args.verify} must be 0 or more (e.g. --verify 2)")
        if args.measure is None:
            args.measure = LEADING if args.device == "cpu" else 0
        if args.measure < 0:
            raise ConfigError(f"--measure {args.measure} must be 0 or more (e.g. --measure 6)")
        if args.measure and args.device != "cpu":
            raise ConfigError(
                f"--measure times plans on this machine's simulated CPU devices, not on "
                f"{args.device}s: use it with --device cpu, or plan on the GPUs themselves "
                "(colossal_jax.auto.choose.auto_plan(cfg, measure=K))"
            )
        if args.top < 1:
            raise ConfigError(f"--top {args.top} must be at least 1 (e.g. --top 10)")
        if args.time_budget is not None and not args.time_budget > 0:
            raise ConfigError(
                f"--time-budget {args.time_budget} must be a positive number of seconds "
                "(e.g. --time-budget 60)"
            )
        if args.out:
            check_writable_file("--out", args.out, "/tmp/plan.toml", name="plan.toml")
        budget = hw.memory_bytes if args.memory_gb is not None else budget_of(hw, n)
        # before the search starts JAX (it compiles a layer's working set, ring attention's on
        # sequence axes of 2 and 4 devices, ring self-attention's on up to 8): n devices to
        # verify on, else 8 (or more already asked for: a process that goes on to train keeps
        # its count)
        from colossal_jax.auto.layer_memory import RSA_MAX_HOPS
        from colossal_jax.runtime.devices import simulate_cpu_devices

        on_n = args.verify or args.measure
        simulate_cpu_devices(max(RSA_MAX_HOPS, n) if on_n else RSA_MAX_HOPS, at_least=True)
        start = time.perf_counter()
        _, result = plan_for(cfg, n, hw, budget, time_budget=args.time_budget)
        checks = verify(result, args.verify, n, budget) if args.verify else []
        ranking = table(result, hw, n, args.top)
        timed: list[Timed] = []
        if args.measure:
            left = MEASURE_TIME_BUDGET  # the timing's own, unless the search shares one
            if args.time_budget is not None:
                left = args.time_budget - (time.perf_counter() - start)
            alt = other_remat(result.best, hw, budget, n)
            timed, lines = time_best(
                result, args.measure, budget, time_budget=left, alternative=alt
            )
            checks += lines
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"{cfg.model}: batch {cfg.batch_size} × seq {cfg.seq_len}, {cfg.precision}, on {n} "
        f"{hw.name} ({budget / GB:.2f} GB per device)"
    )
    print("\n".join(ranking + checks + summary(result, hw, timed)))
    if args.out:
        header = (
            f"planned by scripts/plan.py for --model {cfg.model} --batch-size {cfg.batch_size} "
            f"--seq-len {cfg.seq_len} on {n} {hw.name}\n"
            f"predicted {result.best.prediction.step_s * 1e3:.1f} ms per step, "
            f"{result.best.prediction.memory_bytes / GB:.2f} GB per device"
            + "".join(
                f"; measured {t.seconds * 1e3:.1f} ms per step on {n} simulated CPU devices"
                for t in timed
                if t.ranked is result.best and t.seconds is not None
            )
        )
        out = Path(args.out)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(preset_text(result.best, header))
        except OSError as e:
            print(f"error: --out {args.out}: {e.strerror or e}", file=sys.stderr)
            return 2
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.exit(main())


__all__ = ["Ranked", "main"]
