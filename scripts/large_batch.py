#!/usr/bin/env python
"""The large-batch claim in small (issue: large-batch LAMB and LARS): at the same samples seen,
AdamW at a base batch B against LAMB, LARS (ViT) and AdamW at 16B with the LAMB paper's
square-root learning-rate rule, on bert-tiny (masked LM, the embedded corpus) and vit-tiny (the
handwritten digits), several seeds, on one CPU device. What runs and why:
colossal_jax_benchmarks/large_batch.py; the results and what they show: docs/large_batch.md.

Writes ``OUT/large_batch.json`` (the table: final and best held-out metric per arm with its
spread over seeds, steps, wall time; every run's held-out curve) and
``OUT/img/large_batch.png`` (held-out metric against samples seen); ``--quick`` writes
``large_batch_quick.*``.

Examples:
  python scripts/large_batch.py                  # full: 3 seeds, under 30 minutes on a CPU
  python scripts/large_batch.py --quick --seeds 1 --out /tmp/lb   # smoke test, under 3 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sample budget: a smoke test")
    p.add_argument("--seeds", type=int, default=3, help="seeds per arm (default 3)")
    p.add_argument("--out", type=Path, default=Path("docs"), help="output folder (docs)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.seeds < 1:
        print(f"error: --seeds {args.seeds} must be ≥ 1 (e.g. --seeds 3)", file=sys.stderr)
        return 2

    import jax
    from tqdm import tqdm

    from colossal_jax_benchmarks import large_batch as lb

    # seeds of one arm compile the same programs: keep them between the runs of this process
    cache = tempfile.mkdtemp(prefix="large_batch_xla_")
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    mode = "quick" if args.quick else "full"
    bar = tqdm(total=lb.total_runs(mode, args.seeds), unit="run", disable=args.no_progress)

    def on_run(description: str) -> None:
        bar.set_postfix_str(description)
        bar.update()

    start = time.perf_counter()
    results = lb.run_all(mode, args.seeds, on_run)
    bar.close()
    results["wall_s"] = round(time.perf_counter() - start, 1)
    results["load_average"] = os.getloadavg()
    results["command"] = "python scripts/large_batch.py " + " ".join(argv or sys.argv[1:])
    suffix = "_quick" if args.quick else ""
    json_path = args.out / f"large_batch{suffix}.json"
    png_path = args.out / "img" / f"large_batch{suffix}.png"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=1) + "\n")
    lb.plot(results, png_path)
    for line in lb.table_lines(results):
        print(line)
    print(
        f"wall {results['wall_s']}s (load average {results['load_average'][0]:.1f}); wrote "
        f"{json_path} and {png_path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
