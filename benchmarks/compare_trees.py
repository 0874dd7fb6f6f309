"""Before/after: the training step of two checkouts of colossal-jax, interleaved in one process.

``python benchmarks/compare_trees.py --trees /path/to/main,. --layers 2,8 [--mesh data=8]``
imports ``colossal_jax`` from each checkout in turn (the modules of one are dropped before the
next is imported), builds and compiles the default GPT's training step (``TrainConfig``
defaults: gpt2-tiny, batch 16 × 128 tokens, fp32) at every depth, then runs all the compiled
steps in turn, alternating the order each round. Prints, per checkout and depth, the wall and
CPU time per step (median) and the median of the paired ratios t(L)/t(first depth); a
checkout's steps run on its own code (a compiled executable keeps no reference to the modules).
Only ``--mesh data=N`` and ``tensor=N`` with ``--tensor-mode`` are parsed (by hand, so a
checkout that predates a flag still runs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from types import SimpleNamespace


def _load(tree: str, mesh: dict, layers: list[int]) -> dict:
    for name in list(sys.modules):
        if name.split(".")[0] in ("colossal_jax", "models"):
            del sys.modules[name]
    sys.path.insert(0, tree)
    try:
        import importlib

        config = importlib.import_module("colossal_jax.config")
        T = _training(importlib)
        if not config.__file__.startswith(os.path.abspath(tree)):
            raise SystemExit(f"colossal_jax came from {config.__file__}, not {tree}")
        out = {}
        for n_layer in layers:
            cfg = config.TrainConfig(
                model_overrides={"n_layer": n_layer},
                eval_every=0,
                parallel=config.ParallelConfig(**mesh),
            )
            run = T.build(cfg)
            params, opt_state = T.init_state(run)
            batch = T.global_batch(run, 0)
            compiled = T.make_train_step(run).lower(params, opt_state, batch).compile()
            out[n_layer] = [compiled, params, opt_state, batch]
        return out
    finally:
        sys.path.remove(tree)


def _training(importlib) -> SimpleNamespace:
    """``build``, ``init_state``, ``global_batch`` and ``make_train_step`` of the checkout on
    the path: from their modules, or from ``colossal_jax.training.train`` in a checkout that
    predates the split of that module."""
    try:
        return SimpleNamespace(
            build=importlib.import_module("colossal_jax.training.run").build,
            init_state=importlib.import_module("colossal_jax.training.run").init_state,
            global_batch=importlib.import_module("colossal_jax.training.batches").global_batch,
            make_train_step=importlib.import_module("colossal_jax.training.steps").make_train_step,
        )
    except ModuleNotFoundError:
        return importlib.import_module("colossal_jax.training.train")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", required=True, help="two or more checkouts, comma-separated")
    p.add_argument("--layers", default="2,8")
    p.add_argument("--mesh", default="data=8", help="data=N, or tensor=N with --tensor-mode")
    p.add_argument("--tensor-mode", default="none")
    p.add_argument("--timed-steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--devices", type=int, default=8)
    args = p.parse_args(argv)
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
    ).strip()
    import jax

    name, size = args.mesh.split("=")
    mesh = {"data": int(size)} if name == "data" else {"tensor_row": int(size)}
    if name != "data":
        mesh["tensor_mode"] = args.tensor_mode
    layers = [int(x) for x in args.layers.split(",")]
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    cases = {}
    for tree in trees:
        for n_layer, state in _load(tree, mesh, layers).items():
            cases[(tree, n_layer)] = state
    keys = list(cases)
    wall = {k: [] for k in keys}
    cpu = {k: [] for k in keys}
    for i in range(args.warmup + args.timed_steps):
        for k in keys if i % 2 == 0 else keys[::-1]:
            compiled, params, opt_state, batch = cases[k]
            t0, c0 = time.perf_counter(), time.process_time()
            params, opt_state, out = compiled(params, opt_state, batch)
            jax.block_until_ready((params, opt_state, out))
            if i >= args.warmup:
                wall[k].append(time.perf_counter() - t0)
                cpu[k].append(time.process_time() - c0)
            cases[k][1], cases[k][2] = params, opt_state
    print(f"device: {jax.devices()[0].device_kind} ×{jax.device_count()}; mesh {mesh}")
    for tree in trees:
        for n_layer in layers:
            k = (tree, n_layer)
            w, c = statistics.median(wall[k]), statistics.median(cpu[k])
            print(
                f"{tree} L={n_layer}: wall median {1e3 * w:.1f} ms (min "
                f"{1e3 * min(wall[k]):.1f}), CPU median {1e3 * c:.1f} ms"
            )
        first = (tree, layers[0])
        for n_layer in layers[1:]:
            k = (tree, n_layer)
            rw = statistics.median(a / b for a, b in zip(wall[k], wall[first], strict=True))
            rc = statistics.median(a / b for a, b in zip(cpu[k], cpu[first], strict=True))
            print(f"{tree}: t{n_layer}/t{layers[0]} wall {rw:.2f}, CPU {rc:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
