"""The throughput harness behind ``scripts/bench_throughput.py``: the library's compiled training
step against a baseline (plain JAX + GSPMD, or PyTorch) doing the same work, interleaved step by
step in one process, and the training loop's time outside the compiled step.

Measurements (every figure of one record comes from one invocation):

- **step time**: ``--timed-steps`` steps of each side after ``--bench-warmup`` untimed ones, in
  alternating order (library first on even steps, baseline first on odd ones), each step timed
  from dispatch to ``block_until_ready`` of all its outputs, on the same batches; min and median
  per side, and ``ratio``: the median of the per-step ratios library / baseline (pairs taken
  back to back, so a machine shared with other jobs slows both alike).
- **tokens/s** ``= batch·seq / median step``; **model TFLOP/s per device** ``= flops_per_token ·
  tokens/s / devices`` with ``flops_per_token = 6·N + 12·L·s·h`` (``GPTConfig.flops_per_token``,
  docs/formulas.md §7: N the matmul parameters, L layers, s the sequence, h the hidden size);
  **MFU** = that over the device's dense bf16 peak (``colossal_jax.runtime.metrics.PEAK_FLOPS`` or
  ``--peak-tflops``; ``null`` on a CPU).
- **peak memory**: on a CPU the compiled step's ``memory_analysis()`` (arguments + outputs −
  aliased + temporaries), on a GPU ``device.memory_stats()['peak_bytes_in_use']``.
- **compile time**: lowering and compiling each side's step (PyTorch: its first step).
- **the loop**: ``colossal_jax.training.trainer.train`` runs ``--steps`` steps (no evaluation, no
  checkpoints) ``--loop-repeats`` (5) times, alternated with the old loop (each figure the
  median over the windows); ``outside_step_fraction = Summary.host_s / Summary.loop_s``, the
  share of the loop's wall time the host spent neither in the compiled step's call nor waiting
  for a step's results (measured directly, step by step; with ``host_overlap`` on that work
  overlaps the step in flight, so this bounds the device's waiting from above; off, the CPU's
  default, the device waits for all of it).
  ``vs_back_to_back`` holds the differential form, ``1 − step / (loop time per step)``, the
  loop's time per step being the mean of ``Summary.step_times`` after the first (the first step
  of ``train()``'s newly compiled executable also runs its first-run set-up; ``…_with_first``
  takes ``Summary.loop_s`` over every step) and ``step`` the compiled step dispatched
  ``--steps`` times back to back (one wait at the end), measured before and after — on a shared
  CPU a difference of two windows taken a minute apart, good to several percent only. Tokens/s
  of both loops: the mean (``loop_tokens_per_s``) and the median (``median_tokens_per_s``) step;
  the old synchronous loop (``benchmarks/sync_loop.py``) runs as many steps before and after
  each ``train()`` window, each window from a fresh build, initialisation and compile (from a
  persistent cache) as ``train()``'s, and both loops' tokens/s are recorded
  (``sync_outside_step_fraction`` likewise).
  ``vs_sync``, the headline of the comparison: each ``train()`` window's tokens/s over the mean
  of the old loop's two windows around it, the median over the windows (``vs_sync_windows``
  lists them; ``vs_sync_median_step`` the same from the windows' median steps).
- **agreement**: the baseline starts from the library's parameters and gets the same batches,
  so its per-step losses follow the library's; ``max_loss_diff`` records the largest difference
  (plain JAX: the same optax optimizer, so a gradient error shows here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from colossal_jax.config import ConfigError, TrainConfig
from colossal_jax.config.choices import BASELINES  # noqa: E402
from colossal_jax.config.model_rules import check_baseline
from colossal_jax.config.train_rules import check_bench

FLOPS_FORMULA = "6*N + 12*L*s*h per token (N matmul parameters; GPTConfig.flops_per_token)"


def add_bench_flags(parser) -> None:
    """The harness's own flags, next to every flag of ``scripts/train.py``."""
    a = parser.add_argument
    a("--json", required=True, help="append one record to this JSON list (created if absent)")
    a(
        "--baseline",
        default="plain-jax",
        help=f"one of {', '.join(BASELINES)}: plain-jax (the same GPT in jnp + GSPMD), torch "
        "(PyTorch, one device), none",
    )
    a("--timed-steps", type=int, default=20, help="timed steps per side (at least 2)")
    a("--bench-warmup", type=int, default=3, help="untimed steps per side before timing")
    a(
        "--loop-repeats",
        type=int,
        default=5,
        help="windows of train()'s loop, alternated with the old loop's (figures: medians; "
        "the loops' tokens/s ratio: each train() window against its two neighbours)",
    )
    parser.set_defaults(steps=30, eval_every=0, no_progress=True)


def check_bench_args(args) -> None:


    check_bench(args.baseline, args.timed_steps, args.bench_warmup, args.loop_repeats)


def neighbour_ratios(new: list[float], old: list[float]) -> list[float]:
    """Per ``train()`` window ``i`` (``new``: seconds per step), the old loop's mean step time
    in the windows on either side of it (``old[i]``, ``old[i + 1]``) over ``new[i]``: the
    tokens/s of ``train()`` relative to the old loop, each window paired with the two taken
    just before and after it, so a slow stretch of a shared machine falls on both sides."""
    if len(old) != len(new) + 1:
        raise ValueError(f"{len(new)} train() windows need {len(new) + 1} old-loop windows")
    return [(old[i] + old[i + 1]) / 2 / t for i, t in enumerate(new)]


def stats(times: list[float]) -> dict[str, float]:
    return {"min": min(times), "median": statistics.median(times)}


def paired_ratio(lib: list[float], base: list[float]) -> float:
    """The median of the per-step ratios library / baseline."""
    return statistics.median(a / b for a, b in zip(lib, base, strict=True))


def compiled_peak_bytes(compiled) -> dict[str, int] | None:
    """Peak bytes of a compiled JAX step per device from its memory analysis (CPU, GPU)."""
    m = compiled.memory_analysis()
    if m is None:
        return None
    parts = {
        "argument": int(m.argument_size_in_bytes),
        "output": int(m.output_size_in_bytes),
        "alias": int(m.alias_size_in_bytes),
        "temp": int(m.temp_size_in_bytes),
    }
    parts["peak"] = parts["argument"] + parts["output"] - parts["alias"] + parts["temp"]
    return parts


def _block(tree) -> None:
    import jax

    jax.block_until_ready(tree)


class _LibrarySide:
    """The library's compiled step, state and batches."""

    def __init__(self, cfg: TrainConfig):
        from colossal_jax.training.batches import global_batch
        from colossal_jax.training.run import build, init_state
        from colossal_jax.training.steps import make_train_step

        self.global_batch = global_batch
        self.run = build(cfg)
        self.params, self.opt_state = init_state(self.run)
        step = make_train_step(self.run)
        t0 = time.perf_counter()
        self.compiled = step.lower(self.params, self.opt_state, self.batch(0)).compile()
        self.compile_s = time.perf_counter() - t0

    def batch(self, step: int):
        return self.global_batch(self.run, step)

    def __call__(self, batch):
        self.params, self.opt_state, out = self.compiled(self.params, self.opt_state, batch)
        _block((self.params, self.opt_state, out))
        return out["loss"]

    def peak_bytes(self) -> dict[str, Any] | None:
        from colossal_jax.runtime.metrics import device_memory

        mem = device_memory()
        if mem is not None:
            return {"peak": mem["peak_bytes_in_use"], "source": "device.memory_stats()"}
        parts = compiled_peak_bytes(self.compiled)
        return None if parts is None else {**parts, "source": "compiled.memory_analysis()"}


class _PlainSide:
    """``benchmarks/plain_jax_gpt.py`` in the sharding that mirrors the library's mesh."""

    def __init__(self, lib: _LibrarySide):
        from colossal_jax.training.steps import COMPUTE_DTYPES
        from colossal_jax_benchmarks import plain_jax_gpt as pj

        par = lib.run.cfg.parallel
        mode = {"none": "data", "1d": "1d", "2d": "2d"}[par.tensor_mode]
        row, col = (par.tensor_size, 1) if mode == "1d" else (par.tensor_row, par.tensor_col)
        mesh = pj.make_mesh(mode, par.data, row, col, list(lib.run.mesh.devices.flat))
        dtype = COMPUTE_DTYPES[lib.run.cfg.precision]
        self.plain = pj.build(lib.run.model, lib.run.tx, mesh, mode, compute_dtype=dtype)
        self.params, self.opt_state = self.plain.place(pj.from_library(lib.params))
        self.host = lib.run.batches
        t0 = time.perf_counter()
        self.compiled = self.plain.step.lower(self.params, self.opt_state, self.batch(0)).compile()
        self.compile_s = time.perf_counter() - t0

    def batch(self, step: int):
        return self.plain.put_batch(self.host.batch(step))

    def __call__(self, batch):
        self.params, self.opt_state, out = self.compiled(self.params, self.opt_state, batch)
        _block((self.params, self.opt_state, out))
        return out["loss"]

    def peak_bytes(self) -> dict[str, Any] | None:
        parts = compiled_peak_bytes(self.compiled)
        return None if parts is None else {**parts, "source": "compiled.memory_analysis()"}


class _TorchSide:
    """``benchmarks/torch_gpt.py`` on one device; its first step (which compiles) is timed as
    its compile time, then it starts again from the library's parameters."""

    def __init__(self, lib: _LibrarySide):
        # OpenMP threads that spin after each PyTorch step fight XLA's CPU threads for the same
        # cores (steps of 0.1 s took 1.4 s on the 2-core machine); passive waiting ends that
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        from colossal_jax_benchmarks.torch_gpt import TorchRun

        cfg = lib.run.cfg
        self.run = TorchRun(lib.run.model, cfg.optim, cfg.steps)
        self.run.reset(lib.params)
        self.host = lib.run.batches
        t0 = time.perf_counter()
        self.run.step(self.batch(0))
        self.run.synchronize()
        self.compile_s = time.perf_counter() - t0
        self.run.reset(lib.params)

    def batch(self, step: int):
        return self.run.put_batch(self.host.batch(step))

    def __call__(self, batch):
        loss, _ = self.run.step(batch)
        self.run.synchronize()
        return loss

    def peak_bytes(self) -> dict[str, Any] | None:
        import torch

        if self.run.device.type == "cuda":
            return {"peak": int(torch.cuda.max_memory_allocated()), "source": "torch.cuda"}
        return None


def time_interleaved(lib, base, steps: int, warmup: int) -> dict[str, Any]:
    """Run ``warmup + steps`` steps of both sides on the same batches, alternating which goes
    first; returns the timed seconds and losses of each side."""
    lib_t, base_t, lib_loss, base_loss = [], [], [], []
    for i in range(warmup + steps):
        lb, bb = lib.batch(i), (base.batch(i) if base is not None else None)
        order = [("lib", lib, lb), ("base", base, bb)]
        if i % 2:
            order.reverse()
        for name, side, batch in order:
            if side is None:
                continue
            t0 = time.perf_counter()
            loss = side(batch)
            dt = time.perf_counter() - t0
            if i >= warmup:
                (lib_t if name == "lib" else base_t).append(dt)
            (lib_loss if name == "lib" else base_loss).append(loss)
    return {
        "lib_s": lib_t,
        "base_s": base_t,
        "lib_loss": [float(x) for x in lib_loss],
        "base_loss": [float(x) for x in base_loss],
    }


def back_to_back(lib: _LibrarySide, steps: int, start: int) -> float:
    """Seconds per step of ``steps`` compiled steps dispatched back to back (batches placed
    beforehand, one wait at the end): the step's own time, with no host work between steps."""
    batches = [lib.batch(start + i) for i in range(steps)]
    _block(batches)
    t0 = time.perf_counter()
    for batch in batches:
        lib.params, lib.opt_state, out = lib.compiled(lib.params, lib.opt_state, batch)
    _block((lib.params, lib.opt_state, out))
    return (time.perf_counter() - t0) / steps


def measure_loops(
    lib: _LibrarySide, cfg: TrainConfig, start: int, repeats: int = 3
) -> dict[str, Any]:
    """``train()``'s loop and the old synchronous loop, ``cfg.steps`` steps each, alternating
    ``repeats`` times (old, train, old, train, …, old: every ``train()`` window has an old-loop
    window on each side), with the compiled step dispatched back to back before and after.
    Each window starts afresh, as a run does: ``train(cfg)`` builds, initialises and compiles
    (from the harness's persistent cache), and so does the old loop's window
    (``sync_loop.sync_train``), so neither runs on an executable the other has warmed.
    ``train()``'s figures per window: ``Summary.host_s / Summary.loop_s`` and the mean and median
    of ``Summary.step_times`` after the first (the first also runs the new executable's
    first-run set-up); the old loop's per window likewise (after two untimed steps). Each
    figure is the median over the windows: on a machine shared with other jobs one window's
    speed moves by ±10%, the alternation lets that fall on both loops."""
    from colossal_jax.training.trainer import train
    from colossal_jax_benchmarks.sync_loop import sync_loop, sync_train

    peak = cfg.peak_tflops * 1e12 if cfg.peak_tflops else None
    tokens = cfg.batch_size * cfg.seq_len
    b2b: list[float] = []
    new: dict[str, list[float]] = {k: [] for k in ("host", "mean", "median", "with_first")}
    old: dict[str, list[float]] = {k: [] for k in ("host", "mean", "median")}
    firsts, compiles = [], []

    def old_loop() -> None:
        out = sync_train(cfg, peak)
        steady = out.step_times[1:] or out.step_times
        old["host"].append(out.host_s / out.loop_s)
        old["mean"].append(statistics.mean(steady))
        old["median"].append(statistics.median(steady))

    def new_loop() -> None:
        summary = train(cfg, progress=False, log=lambda _: None)
        steady = summary.step_times[1:] or summary.step_times
        new["host"].append(summary.host_s / summary.loop_s)
        new["mean"].append(statistics.mean(steady))
        new["median"].append(statistics.median(steady))
        new["with_first"].append(summary.loop_s / summary.steps_run)
        firsts.append(summary.step_times[0])
        compiles.append(summary.compile_s)

    # untimed: the old loop's first steps compile its schedule's operations one by one
    warm = sync_loop(lib.run, lib.compiled, lib.params, lib.opt_state, start=start, steps=2)
    lib.params, lib.opt_state = warm.params, warm.opt_state
    start += 2
    b2b.append(back_to_back(lib, cfg.steps, start))
    start += cfg.steps
    for _ in range(repeats):
        old_loop()
        new_loop()
    old_loop()
    b2b.append(back_to_back(lib, cfg.steps, start))
    med = statistics.median
    vs_mean = neighbour_ratios(new["mean"], old["mean"])
    vs_median = neighbour_ratios(new["median"], old["median"])
    return {
        "repeats": repeats,
        "steps": cfg.steps,
        "host_fraction": med(new["host"]),
        "sync_host_fraction": med(old["host"]),
        "loop_step_s": med(new["mean"]),
        "loop_step_s_source": "mean of Summary.step_times without the first step; median of "
        "the windows",
        "loop_tokens_per_s": tokens / med(new["mean"]),
        "median_step_s": med(new["median"]),
        "median_tokens_per_s": tokens / med(new["median"]),
        "loop_step_s_with_first": med(new["with_first"]),
        "first_step_s": med(firsts),
        "train_compile_s": med(compiles),
        "sync_loop_step_s": med(old["mean"]),
        "sync_loop_tokens_per_s": tokens / med(old["mean"]),
        "sync_median_step_s": med(old["median"]),
        "sync_median_tokens_per_s": tokens / med(old["median"]),
        "back_to_back_step_s": statistics.mean(b2b),
        "vs_sync": med(vs_mean),
        "vs_sync_source": "train() tokens/s over the old loop's: per train() window, the mean "
        "step time of the old-loop windows before and after it over the window's; the median "
        "over the windows",
        "vs_sync_windows": vs_mean,
        "vs_sync_median_step": med(vs_median),
        "windows": {"train": new, "sync": old},
    }


def _device_line() -> dict[str, Any]:
    import jax

    d = jax.devices()[0]
    simulated = d.platform == "cpu" and jax.device_count() > 1
    return {
        "platform": d.platform,
        "kind": d.device_kind,
        "count": jax.device_count(),
        "simulated": simulated,
    }


def benchmark(
    cfg: TrainConfig, baseline: str, timed: int, warmup: int, repeats: int = 3
) -> dict[str, Any]:
    """One record: ``cfg`` (already validated) against ``baseline``."""
    from colossal_jax.runtime.metrics import peak_flops

    lib = _LibrarySide(cfg)
    base = {"plain-jax": _PlainSide, "torch": _TorchSide}.get(baseline)
    base = base(lib) if base is not None else None
    t = time_interleaved(lib, base, timed, warmup)
    loops = measure_loops(lib, cfg, warmup + timed, repeats) if cfg.steps > 0 else None

    model, n_dev = lib.run.model, lib.run.mesh.size
    tokens = cfg.batch_size * cfg.seq_len
    lib_stats = stats(t["lib_s"])
    flops_per_token = model.flops_per_token(cfg.seq_len)
    tokens_per_s = tokens / lib_stats["median"]
    tflops = flops_per_token * tokens_per_s / n_dev / 1e12
    peak = cfg.peak_tflops * 1e12 if cfg.peak_tflops else peak_flops()
    record: dict[str, Any] = {
        "baseline": baseline,
        "device": _device_line(),
        "devices_used": n_dev,
        "model": dataclasses.asdict(model),
        "batch_size": cfg.batch_size,
        "seq_len": cfg.seq_len,
        "precision": cfg.precision,
        "timed_steps": timed,
        "warmup_steps": warmup,
        "library_step_s": lib_stats,
        "library_step_times_s": t["lib_s"],
        "tokens_per_s": tokens_per_s,
        "flops_per_token": flops_per_token,
        "flops_formula": FLOPS_FORMULA,
        "model_tflops_per_device": tflops,
        "mfu": tflops * 1e12 / peak if peak else None,
        "peak_flops_per_device": peak,
        "library_peak_memory": lib.peak_bytes(),
        "library_compile_s": lib.compile_s,
        "baseline_step_s": None,
        "ratio": None,
    }
    if base is not None:
        base_stats = stats(t["base_s"])
        diffs = [abs(a - b) for a, b in zip(t["lib_loss"], t["base_loss"], strict=True)]
        record |= {
            "baseline_step_s": base_stats,
            "baseline_step_times_s": t["base_s"],
            "baseline_tokens_per_s": tokens / base_stats["median"],
            "ratio": paired_ratio(t["lib_s"], t["base_s"]),
            "ratio_of_mins": lib_stats["min"] / base_stats["min"],
            "baseline_peak_memory": base.peak_bytes(),
            "baseline_compile_s": base.compile_s,
            "first_loss_diff": diffs[0],
            "max_loss_diff": max(diffs),
            "library_losses": t["lib_loss"],
            "baseline_losses": t["base_loss"],
        }
    if loops is not None:
        step = loops["back_to_back_step_s"]
        record["loop"] = loops
        record["outside_step_fraction"] = loops["host_fraction"]
        record["sync_outside_step_fraction"] = loops["sync_host_fraction"]
        record["vs_back_to_back"] = {
            "outside_step_fraction": 1.0 - step / loops["loop_step_s"],
            "outside_step_fraction_with_first": 1.0 - step / loops["loop_step_s_with_first"],
            "sync_outside_step_fraction": 1.0 - step / loops["sync_loop_step_s"],
        }
    else:
        record["outside_step_fraction"] = None
    return record


def append_record(path: str, record: dict[str, Any]) -> None:
    """Append ``record`` to the JSON list in ``path`` (written beside and renamed over)."""
    p = Path(path)
    records = json.loads(p.read_text()) if p.exists() and p.stat().st_size else []
    if not isinstance(records, list):
        raise ConfigError(f"--json {path} holds no JSON list; give a new file")
    records.append(record)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(json.dumps(records, indent=1) + "\n")
    os.replace(tmp, p)


@contextlib.contextmanager
def compile_cache() -> Iterator[str | None]:
    """A persistent compilation cache for the block, in a fresh temporary directory (unless
    ``JAX_COMPILATION_CACHE_DIR`` names one), so ``train()``'s step, identical to the one the
    harness compiled, loads instead of compiling again; the harness's own compiles stay cold.
    JAX's cache settings are restored afterwards (the harness also runs inside tests)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        yield None
        return
    keys = (
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
    )
    before = {k: getattr(jax.config, k) for k in keys}
    with tempfile.TemporaryDirectory(prefix="bench-throughput-cache-") as path:
        cc.reset_cache()
        for k, v in zip(keys, (path, 0, 0), strict=True):
            jax.config.update(k, v)
        try:
            yield path
        finally:
            for k, v in before.items():
                jax.config.update(k, v)
            cc.reset_cache()


def summary_line(r: dict[str, Any]) -> str:
    lib = r["library_step_s"]
    parts = [
        f"library step {1e3 * lib['median']:.1f} ms (min {1e3 * lib['min']:.1f})",
        f"{r['tokens_per_s']:,.0f} tokens/s",
        f"{r['model_tflops_per_device']:.4f} TFLOP/s/device",
        f"MFU {100 * r['mfu']:.1f}%" if r["mfu"] is not None else "MFU n/a",
    ]
    if r["ratio"] is not None:
        b = r["baseline_step_s"]
        parts.append(
            f"{r['baseline']} {1e3 * b['median']:.1f} ms (min {1e3 * b['min']:.1f}); "
            f"ratio {r['ratio']:.3f}; max loss diff {r['max_loss_diff']:.2e}"
        )
    if r.get("loop"):
        lp = r["loop"]
        parts.append(
            f"train() loop {lp['loop_tokens_per_s']:,.0f} tokens/s (median step "
            f"{lp['median_tokens_per_s']:,.0f}), outside the step "
            f"{100 * r['outside_step_fraction']:.1f}%; old synchronous loop "
            f"{lp['sync_loop_tokens_per_s']:,.0f} tokens/s (median step "
            f"{lp['sync_median_tokens_per_s']:,.0f}); train() / old loop tokens/s "
            f"{lp['vs_sync']:.3f} (median step {lp['vs_sync_median_step']:.3f}; each of "
            f"{lp['repeats']} windows against its neighbours)"
        )
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    from colossal_jax import cli

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = cli.build_parser()
        parser.prog = "bench_throughput.py"
        parser.description = (
            "Throughput of the library's training step against a baseline doing the same work "
            "(interleaved, one process), and the training loop's time outside the step."
        )
        add_bench_flags(parser)
        args = parser.parse_args(argv)
        check_bench_args(args)
        cli.preflight.check_args(args)
        devices_set = cli._setup_devices(args)
        cli.apply_xla_preset(args.xla_preset)
        cli.plan_before_jax(args, devices_set, cluster=None)
        import jax

        n = jax.device_count()
        if args.devices is not None:
            if args.devices > n:
                raise ConfigError(f"--devices {args.devices} but only {n} are available")
            n = args.devices
        cfg = cli.config_from_args(args, n)


        check_baseline(cfg, args.baseline)
        cfg = dataclasses.replace(cfg, devices=n, eval_every=0, checkpoint_dir=None)
        cfg = dataclasses.replace(cfg, metrics_file=None, tensorboard_dir=None)
        with compile_cache():
            record = benchmark(
                cfg, args.baseline, args.timed_steps, args.bench_warmup, args.loop_repeats
            )
        record = {"flags": argv, **record}
        append_record(args.json, record)
        print(summary_line(record))
        return 0
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
