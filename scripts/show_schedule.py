#!/usr/bin/env python
"""Show a pipeline schedule's tick table: a text timeline and, with ``--png``, a picture.

Examples:
  python scripts/show_schedule.py --schedule 1f1b --stages 4 --microbatches 8
  python scripts/show_schedule.py --schedule interleaved --stages 4 --microbatches 8 \\
      --virtual-stages 2 --png interleaved.png
  python scripts/show_schedule.py --schedule zb-h1 --stages 4 --microbatches 8
  python scripts/show_schedule.py --schedule zb-v --stages 4 --microbatches 8 --png zbv.png

Rows are stages, columns ticks; ``F3`` is microbatch 3's forward, ``B3`` its backward (with a
split backward, its activation-gradient half) and ``W3`` its weight gradient (``F3.1``: on the
stage's local chunk 1), ``.`` an idle tick. The bubble printed is the table's idle fraction next
to the closed form ``(p−1)/(k·V·M+p−1)`` (``k = 3`` with a split backward, else 1).
"""

from __future__ import annotations

import argparse
import sys

from colossal_jax.config.pipelines import pipeline_schedule
from colossal_jax.pipeline.schedule import FORWARD, SCHEDULES, WEIGHT, Schedule, build, place


def draw(sched: Schedule, path: str) -> None:
    """Stages × ticks, forwards blue, backwards (B) orange, weight gradients (W) green (darker
    for later local chunks)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    p, ticks, v = sched.stages, sched.ticks, sched.virtual_stages
    fig, ax = plt.subplots(figsize=(max(8.0, 0.42 * ticks), 0.7 * p + 1.6), dpi=120)
    cmaps = {FORWARD: plt.get_cmap("Blues"), WEIGHT: plt.get_cmap("Greens")}
    for t, row in enumerate(sched.timeline):
        for s, op in enumerate(row):
            if op is None:
                continue
            chunk = place(op.chunk, p, v, sched.placement)[1]
            shade = 0.45 + 0.35 * (chunk / max(1, v - 1)) if v > 1 else 0.55
            color = cmaps.get(op.kind, plt.get_cmap("Oranges"))(shade)
            ax.add_patch(Rectangle((t, p - 1 - s), 1, 1, facecolor=color, edgecolor="white"))
            label = str(op.microbatch) + (f".{chunk}" if v > 1 else "")
            ax.text(t + 0.5, p - 0.5 - s, label, ha="center", va="center", fontsize=7)
    ax.set_xlim(0, ticks)
    ax.set_ylim(0, p)
    ax.set_yticks([p - 0.5 - s for s in range(p)], [f"stage {s}" for s in range(p)])
    ax.set_xlabel("tick")
    title = (
        f"{sched.name}: p={p}, M={sched.microbatches}"
        + (f", V={v}" if v > 1 else "")
        + f" — bubble {sched.idle_fraction():.3f} (formula {sched.formula_bubble():.3f}); "
        "blue F, orange B" + (", green W" if sched.split_backward else "")
    )
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", default="1f1b", choices=[s for s in SCHEDULES])
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--virtual-stages", type=int, default=None)
    parser.add_argument("--png", default=None, help="also draw the table to this PNG")
    args = parser.parse_args(argv)
    registered = pipeline_schedule(args.schedule)
    v = args.virtual_stages or registered.chunks or (2 if registered.virtual else 1)
    try:
        sched = build(args.schedule, args.stages, args.microbatches, v)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(sched.render())
    print(
        f"{sched.ticks} ticks; bubble {sched.idle_fraction():.4f} "
        f"(formula {sched.formula_bubble():.4f}); slots per stage {sched.slots} (alive at peak "
        f"per stage: {sched.peak_alive})"
    )
    if args.png:
        draw(sched, args.png)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
