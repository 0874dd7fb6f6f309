#!/usr/bin/env python
"""Plot the metrics files of training runs (JSON lines from ``train.py --metrics-file``).

  python scripts/plot_metrics.py a.jsonl b.jsonl --png runs.png --labels data=8,tensor=8

One 2×2 figure, every run overlaid in its own colour: loss against step (eval loss, where a run
records it, dashed with markers), tokens/s, peak device memory in MiB (where the backend reports
it) and the learning rate. Runs are labelled by file stem unless ``--labels`` names them. Earlier
runs draw wider lines, so runs with the same curve (one loss on two meshes) both stay visible.
Lines that are not JSON objects with a numeric ``step`` (a run killed mid-write) are skipped with
a warning. Renders with the Agg backend, so no display is needed. A missing or empty metrics file
or an unwritable ``--png`` path exits with status 2 and one line ``error: …``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

MIB = 2**20


def line_width(i: int) -> float:
    """Run i's line width: earlier runs draw wider, so identical curves stay visible."""
    return max(1.0, 4.5 - 2.0 * i)


class PlotError(Exception):
    """A problem the user can fix; printed as one ``error:`` line, exit status 2."""


@dataclass(frozen=True)
class Run:
    label: str
    records: list[dict[str, Any]]  # sorted by step


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def load_run(path: Path, label: str) -> Run:
    """The valid records of one metrics file, sorted by step; later duplicates of a step win."""
    if not path.exists():
        raise PlotError(f"{path}: no such file")
    if not path.is_file():
        raise PlotError(f"{path} is not a file")
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise PlotError(f"cannot read {path}: {e}") from None
    by_step: dict[float, dict[str, Any]] = {}
    skipped = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        if isinstance(rec, dict) and _is_number(rec.get("step")):
            by_step[rec["step"]] = rec
        else:
            skipped += 1
    if not by_step:
        raise PlotError(f"{path} holds no metrics records (JSON lines with a numeric 'step')")
    if skipped:
        print(f"warning: skipped {skipped} invalid line(s) in {path}", file=sys.stderr)
    return Run(label, [by_step[s] for s in sorted(by_step)])


def series(run: Run, key: str, scale: float = 1.0) -> tuple[list[float], list[float]]:
    """Steps and values of ``key`` over the records that have a number for it."""
    pairs = [(r["step"], r[key] / scale) for r in run.records if _is_number(r.get(key))]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _step_axis(ax: Axes) -> None:
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _no_data(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def plot_loss(ax: Axes, runs: Sequence[Run], colours: Sequence[str]) -> None:
    any_eval = False
    for i, (run, colour) in enumerate(zip(runs, colours, strict=True)):
        ax.plot(*series(run, "loss"), color=colour, linewidth=line_width(i), label=run.label)
        steps, values = series(run, "eval_loss")
        if steps:
            any_eval = True
            ax.plot(
                steps, values, color=colour, linewidth=line_width(i), linestyle="--", marker="o"
            )
    ax.set_title("loss")
    _step_axis(ax)
    if any_eval:
        ax.legend(
            handles=[
                Line2D([], [], color="0.3", label="train"),
                Line2D([], [], color="0.3", linestyle="--", marker="o", label="eval"),
            ],
            loc="upper right",
        )


def plot_key(
    ax: Axes,
    runs: Sequence[Run],
    colours: Sequence[str],
    key: str,
    title: str,
    *,
    scale: float = 1.0,
    missing: str,
) -> None:
    """One line per run of ``key`` against step, or ``missing`` when no run has the key."""
    drawn = False
    for i, (run, colour) in enumerate(zip(runs, colours, strict=True)):
        steps, values = series(run, key, scale)
        if steps:
            ax.plot(steps, values, color=colour, linewidth=line_width(i), label=run.label)
            drawn = True
    ax.set_title(title)
    if drawn:
        _step_axis(ax)
    else:
        _no_data(ax, missing)


def draw(runs: Sequence[Run]) -> Figure:
    """The 2×2 figure: loss, tokens/s, peak memory, learning rate against step."""
    fig = Figure(figsize=(12, 8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    colours = [f"C{i % 10}" for i in range(len(runs))]
    (loss_ax, tps_ax), (mem_ax, lr_ax) = fig.subplots(2, 2)
    plot_loss(loss_ax, runs, colours)
    plot_key(tps_ax, runs, colours, "tokens_per_s", "tokens/s", missing="no tokens/s in these runs")
    plot_key(
        mem_ax,
        runs,
        colours,
        "peak_bytes_in_use",
        "peak memory in use (MiB)",
        scale=MIB,
        missing="no memory figures in these runs",
    )
    plot_key(lr_ax, runs, colours, "lr", "learning rate", missing="no learning rate in these runs")
    lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))
    handles = [
        Line2D([], [], color=c, linewidth=line_width(i), label=r.label)
        for i, (r, c) in enumerate(zip(runs, colours, strict=True))
    ]
    fig.legend(handles=handles, loc="outside upper center", ncol=min(len(runs), 6))
    return fig


def save(fig: Figure, path: Path) -> None:
    try:
        fig.savefig(path, format="png")
    except OSError as e:
        raise PlotError(f"cannot write --png {path}: {e.strerror or e}") from None


def labels_for(paths: Sequence[Path], labels: str | None) -> list[str]:
    if labels is None:
        return [p.stem for p in paths]
    names = [s.strip() for s in labels.split(",")]
    if len(names) != len(paths):
        raise PlotError(f"--labels names {len(names)} runs but {len(paths)} files were given")
    return names


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("files", type=Path, nargs="+", help="metrics files (JSON lines)")
    p.add_argument("--png", type=Path, required=True, help="where to write the figure")
    p.add_argument("--labels", help="comma list of legend labels, one per file (default: stems)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        labels = labels_for(args.files, args.labels)
        runs = [load_run(path, label) for path, label in zip(args.files, labels, strict=True)]
        save(draw(runs), args.png)
    except PlotError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = sum(len(r.records) for r in runs)
    print(f"wrote {args.png} ({len(runs)} runs, {n} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
