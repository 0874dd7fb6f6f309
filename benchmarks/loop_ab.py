"""How the compiled step dispatches, and two A/B measurements behind docs/performance.md's
training-loop section, for any training configuration (``scripts/train.py``'s flags; default
``--mesh data=8`` gpt2-tiny on 8 simulated devices):

0. **dispatch**: how long the step's call takes to return with the device idle and with a step
   in flight (on a CPU backend the call waits for the step before it: nothing queues deeper);
1. **loop shape**: on one compiled step, the asynchronous loop (step k+1 dispatched, the next
   batch built, then step k's metrics read) against the synchronous one (batch, step, read),
   ``--rounds`` alternating windows of ``--window`` steps each;
2. **cached executable**: the step compiled fresh against the same step loaded from JAX's
   persistent compilation cache (as ``train()`` loads it inside ``bench_throughput.py``), each
   dispatched back to back, alternating windows.

Prints each window's ms per step and the median of the paired ratios.

    python benchmarks/loop_ab.py [train flags] [--window 20] [--rounds 8]
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    from colossal_jax import cli

    p = cli.build_parser()
    p.prog = "loop_ab.py"
    p.description = __doc__.splitlines()[0]
    p.add_argument("--window", type=int, default=20, help="steps per window")
    p.add_argument("--rounds", type=int, default=8, help="windows per side")
    args = p.parse_args(argv)
    cli._setup_devices(args)
    import jax

    jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="loop-ab-"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    from colossal_jax.training.batches import global_batch
    from colossal_jax.training.run import build, init_state
    from colossal_jax.training.stack_order import to_stored
    from colossal_jax.training.steps import make_train_step

    n_dev = args.devices or jax.device_count()
    cfg = cli.config_from_args(args, n_dev)
    cfg = dataclasses.replace(cfg, devices=n_dev, eval_every=0, checkpoint_dir=None)
    n = args.window
    print(f"{cfg.parallel.describe()}; {n} steps a window, {args.rounds} windows a side")

    def make():
        run = build(cfg)
        params, opt_state = to_stored(run, *init_state(run))
        step = make_train_step(run).lower(params, opt_state, global_batch(run, 0))
        return run, [params, opt_state], step.compile()

    def asynchronous(side) -> float:
        run, st, step = side
        t0, pending, batch = time.perf_counter(), None, global_batch(run, 0)
        for i in range(n):
            st[0], st[1], out = step(st[0], st[1], batch)
            batch = global_batch(run, i + 1)
            if pending is not None:
                jax.device_get(pending)
            pending = out
        jax.device_get(pending)
        return (time.perf_counter() - t0) / n

    def synchronous(side) -> float:
        run, st, step = side
        t0 = time.perf_counter()
        for i in range(n):
            st[0], st[1], out = step(st[0], st[1], global_batch(run, i))
            jax.device_get(out)
        return (time.perf_counter() - t0) / n

    def back_to_back(side) -> float:
        run, st, step = side
        batches = jax.block_until_ready([global_batch(run, i) for i in range(n)])
        t0 = time.perf_counter()
        for batch in batches:
            st[0], st[1], out = step(st[0], st[1], batch)
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) / n

    def ab(name: str, a, b, label_a: str, label_b: str) -> None:
        a(), b()  # untimed: first runs
        ta, tb = [], []
        for r in range(args.rounds):
            for f, out in ((a, ta), (b, tb))[:: (-1) ** r]:
                out.append(f())
        ratio = statistics.median(x / y for x, y in zip(ta, tb, strict=True))
        print(f"{name}: {label_a} ms/step {[round(1e3 * x, 1) for x in ta]}")
        print(f"{name}: {label_b} ms/step {[round(1e3 * x, 1) for x in tb]}")
        print(f"{name}: {label_a} / {label_b}, median of paired windows: {ratio:.3f}")

    def dispatch(side) -> None:
        """How long the step's call takes to return: with the device idle, and with the step
        before it still running (the call of the second of two steps dispatched together)."""
        run, st, step = side
        batch = jax.block_until_ready(global_batch(run, 0))
        idle, busy, whole = [], [], []
        for _ in range(args.rounds):
            jax.block_until_ready(st)
            t0 = time.perf_counter()
            st[0], st[1], out = step(st[0], st[1], batch)
            t1 = time.perf_counter()
            st[0], st[1], out = step(st[0], st[1], batch)
            t2 = time.perf_counter()
            jax.block_until_ready(out)
            idle.append(t1 - t0)
            busy.append(t2 - t1)
            whole.append((time.perf_counter() - t0) / 2)
        med = statistics.median
        print(
            f"dispatch: the call returns after {1e3 * med(idle):.1f} ms with the device idle, "
            f"{1e3 * med(busy):.1f} ms with a step in flight (a step: {1e3 * med(whole):.1f} ms; "
            f"medians of {args.rounds})"
        )

    fresh = make()
    dispatch(fresh)
    cached = make()  # the same program: loaded from the persistent cache
    ab("loop shape", lambda: asynchronous(fresh), lambda: synchronous(fresh), "async", "sync")
    ab(
        "executable",
        lambda: back_to_back(cached),
        lambda: back_to_back(fresh),
        "cached",
        "fresh",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
