"""The measured sweep's report (:mod:`colossal_jax.auto.sweep`): a markdown table of its rows
and a PNG of predicted against measured step time and memory. Rows are the sweep's
:class:`~colossal_jax.auto.sweep.Row`, read by their attributes only."""

from __future__ import annotations

import statistics
from typing import Any

MIB = 2**20


def table(rows: list[Any]) -> str:
    """A markdown table of the rows, fastest measured first (unmeasured last)."""
    head = (
        "| plan | predicted ms | measured ms | raw ms | predicted MiB | compiled MiB | mem err | "
        "compile s | bytes per axis (compiled, KiB) |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---|"
    )
    lines = [head]
    order = sorted(rows, key=lambda r: (r.seconds is None, r.seconds or 0.0))
    for r in order:
        p, c = r.ranked.prediction, r.compiled
        mark = " **(chosen)**" if r.chosen else ""
        if c is None:
            what = f"failed: {r.error}" if r.error else "not measured (time budget)"
            lines.append(f"| {r.name}{mark} | {p.step_s * 1e3:.1f} | {what} |||||||")
            continue
        measured = "" if r.seconds is None else f"{r.seconds * 1e3:.1f}"
        raw = "" if r.step_s is None else f"{r.step_s * 1e3:.1f}"
        axes = ", ".join(f"{k} {v / 1024:.0f}" for k, v in sorted(c.axis_bytes.items()))
        lines.append(
            f"| {r.name}{mark} | {p.step_s * 1e3:.1f} | {measured} | {raw} | "
            f"{p.memory_bytes / MIB:.1f} | {c.peak_bytes / MIB:.1f} | "
            f"{(r.memory_error or 0) * 100:.1f}% | {c.compile_s:.1f} | {axes} |"
        )
    return "\n".join(lines)


def plot(rows: list[Any], path: str, title: str) -> None:
    """Two panels to ``path`` (PNG): predicted against measured step time (log-log, with the
    line ``y = c·x`` of the median ratio ``c``: only the ranks are compared), and predicted
    against compiled peak memory (with ``y = x``); the chosen plan and the best measured are
    marked. A sweep that timed nothing (``--steps 0``) draws the memory panel alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.compiled is not None]
    timed = [r for r in ok if r.seconds is not None]
    if timed:
        fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.8))
    else:
        fig, ax_m = plt.subplots(1, 1, figsize=(5.8, 4.8))
    best = min(timed, key=lambda r: r.seconds or 0.0, default=None)
    paired = bool(timed) and all(r.normalized_s is not None for r in timed)
    if timed:
        _scatter(
            ax_t,
            [(r.ranked.prediction.step_s * 1e3, r.seconds * 1e3, r) for r in timed],
            best,
            "predicted step (ms)",
            "measured step, normalised to the reference (ms)" if paired else "measured step (ms)",
            scaled=True,
        )
    _scatter(
        ax_m,
        [(r.ranked.prediction.memory_bytes / MIB, r.compiled.peak_bytes / MIB, r) for r in ok],
        best,
        "predicted memory per device (MiB)",
        "compiled peak per device (MiB)",
    )
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _scatter(
    ax: Any,
    points: list[tuple[float, float, Any]],
    best: Any,
    xlabel: str,
    ylabel: str,
    scaled: bool = False,
) -> None:
    """One panel: a point per plan, the best measured circled, the chosen crossed, and
    ``y = x`` (``scaled``: ``y = c·x`` with ``c`` the median ratio, on log-log axes)."""
    if not points:
        ax.set_title("nothing measured")
        return
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    ax.scatter(xs, ys, s=14, alpha=0.6, label="plans")
    mark = [p for p in points if p[2] is best]
    if mark:
        ax.scatter(
            [mark[0][0]],
            [mark[0][1]],
            s=90,
            facecolors="none",
            edgecolors="g",
            label="best measured",
        )
    chosen = [p for p in points if p[2].chosen]
    if chosen:
        ax.scatter([chosen[0][0]], [chosen[0][1]], s=80, marker="x", c="r", label="chosen")
    if scaled:
        c = statistics.median(y / x for x, y in zip(xs, ys, strict=True) if x > 0)
        lo, hi = min(xs), max(xs)
        ax.plot([lo, hi], [c * lo, c * hi], "k--", lw=0.8, label=f"y = {c:.3g}·x")
        ax.set_xscale("log")
        ax.set_yscale("log")
    else:
        lo, hi = min(xs + ys), max(xs + ys)
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="y = x")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
