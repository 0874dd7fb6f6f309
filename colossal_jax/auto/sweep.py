"""The measured sweep: every plan the planner ranks for a model on ``n`` devices compiled and
(with ``steps``) run, beside its prediction — the planner checked against measurement.

The plans are those of :func:`colossal_jax.auto.search.search`: every layout the rules accept,
each with the memory knobs the planner chose for it under the budget (so the planner's choice,
the first of them, is among the measured). For each, one compile of the train step
(:func:`colossal_jax.auto.measure.measure_plan`, cached on disk) gives its compiled figures;
with ``steps`` it then runs one warm-up step and ``steps`` timed ones (the median is its step
time). What the sweep reports (:func:`summarize`):

- the Spearman rank correlation of predicted and measured step time;
- the memory error of each plan, ``|predicted − compiled peak| / compiled peak`` (the compiled
  peak: ``argument + output − alias + temp`` bytes of ``memory_analysis()``), and its largest;
- the regret: the measured step time of the planner's choice over the best measured, minus 1.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from colossal_jax.auto.cache import Cache
from colossal_jax.auto.hardware import Hardware
from colossal_jax.auto.measure import Compiled, measure_cached
from colossal_jax.auto.search import Ranked, search
from colossal_jax.config.errors import ConfigError
from colossal_jax.config.schema import TrainConfig

MIB = 2**20


@dataclass
class Row:
    """One plan of the sweep: its name, prediction, measured figures (None until measured, or
    when it failed: ``error``), and whether they came from the cache."""

    name: str
    ranked: Ranked
    chosen: bool
    compiled: Compiled | None = None
    step_s: float | None = None
    error: str | None = None
    cached: bool = False

    @property
    def memory_error(self) -> float | None:
        if self.compiled is None or self.compiled.peak_bytes <= 0:
            return None
        pred = self.ranked.prediction.memory_bytes
        return abs(pred - self.compiled.peak_bytes) / self.compiled.peak_bytes

    def to_json(self) -> dict[str, Any]:
        p = self.ranked.prediction
        return {
            "name": self.name,
            "chosen": self.chosen,
            "parallel": dataclasses.asdict(self.ranked.plan.config.parallel),
            "knobs": dataclasses.asdict(self.ranked.knobs),
            "predicted": {
                "step_s": p.step_s,
                "compute_s": p.compute_s,
                "bubble_s": p.bubble_s,
                "comm_s": p.comm_s,
                "offload_s": p.offload_s,
                "memory_bytes": p.memory_bytes,
                "axis_bytes": p.axis_bytes,
                "flops": p.flops,
            },
            "compiled": None if self.compiled is None else self.compiled.to_json(),
            "measured_step_s": self.step_s,
            "memory_error": self.memory_error,
            "error": self.error,
            "cached": self.cached,
        }


def plans(
    cfg: TrainConfig,
    n: int,
    hw: Hardware,
    budget: float,
    pattern: str | None = None,
    sample: int | None = None,
) -> list[Row]:
    """The planner's ranked plans for ``cfg`` on ``n`` devices of ``hw`` (its choice first),
    those whose name matches the regular expression ``pattern`` when given, and of those
    ``sample`` spread evenly over the predicted ranking when given (the choice always stays).
    Raises :class:`ConfigError` when no plan fits or ``pattern`` is not a valid expression or
    matches nothing."""
    result = search(cfg, n, hw, budget)
    if not result.ranked:
        raise ConfigError(
            f"no plan for --model {cfg.model} fits {budget / MIB:.0f} MiB per device on {n} "
            "devices; raise the budget or use more devices"
        )
    try:
        keep = re.compile(pattern) if pattern else None
    except re.error as e:
        raise ConfigError(f"--filter {pattern!r} is not a regular expression ({e})") from None
    rows = []
    for i, r in enumerate(result.ranked):
        name = r.name
        if i == 0 or keep is None or keep.search(name):
            rows.append(Row(name=name, ranked=r, chosen=i == 0))
    if keep is not None and len(rows) == 1 and not keep.search(rows[0].name):
        raise ConfigError(
            f"--filter {pattern!r} matches none of the {len(result.ranked)} plans (names look "
            f"like {result.ranked[-1].name!r})"
        )
    if sample is not None and len(rows) > sample:
        if sample < 2:
            raise ConfigError(f"--sample {sample} must be at least 2 (e.g. --sample 40)")
        picks = sorted({round(i * (len(rows) - 1) / (sample - 1)) for i in range(sample)})
        rows = [rows[i] for i in picks]
    return rows


def run_sweep(
    rows: list[Row],
    steps: int,
    cache: Cache | None = None,
    progress: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Measure every row in place (:func:`~colossal_jax.auto.measure.measure_cached`); a plan
    that fails to compile or run keeps its error and the sweep goes on. ``progress`` is called
    after each row."""
    import jax

    for row in rows:
        try:
            row.compiled, row.step_s, row.cached = measure_cached(row.ranked.plan, steps, cache)
        except Exception as e:  # one plan's failure is a result of the sweep, not its end
            row.error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            print(f"warning: {row.name}: {row.error}", file=sys.stderr)
        jax.clear_caches()
        if progress is not None:
            progress(row)
    return rows


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (ties get their average rank); nan for fewer than 2."""
    if len(xs) < 2:
        return float("nan")
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx > 0 and vy > 0 else float("nan")


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def summarize(rows: list[Row]) -> dict[str, Any]:
    """The sweep's verdict: plans measured and failed, the Spearman correlation of predicted
    and measured step time, the largest memory error (and its plan), the chosen and the best
    measured plan and the regret (None where nothing was timed)."""
    ok = [r for r in rows if r.compiled is not None]
    timed = [r for r in ok if r.step_s is not None]
    worst = max(ok, key=lambda r: r.memory_error or 0.0, default=None)
    out: dict[str, Any] = {
        "plans": len(rows),
        "measured": len(ok),
        "failed": [r.name for r in rows if r.error],
        "max_memory_error": None if worst is None else worst.memory_error,
        "max_memory_error_plan": None if worst is None else worst.name,
        "within_10pct_memory": sum(1 for r in ok if (r.memory_error or 0) <= 0.10),
        "spearman": None,
        "chosen": next((r.name for r in rows if r.chosen), None),
        "best": None,
        "regret": None,
    }
    if len(timed) >= 2:
        out["spearman"] = spearman(
            [r.ranked.prediction.step_s for r in timed], [r.step_s for r in timed]
        )
    if timed:
        best = min(timed, key=lambda r: r.step_s)
        out["best"], out["best_step_s"] = best.name, best.step_s
        chosen = next((r for r in timed if r.chosen), None)
        if chosen is not None:
            out["chosen_step_s"] = chosen.step_s
            out["regret"] = chosen.step_s / best.step_s - 1
    return out


def table(rows: list[Row]) -> str:
    """A markdown table of the rows, fastest measured first (unmeasured last)."""
    head = (
        "| plan | predicted ms | measured ms | predicted MiB | compiled MiB | mem err | "
        "compile s | bytes per axis (compiled, KiB) |\n|---|---:|---:|---:|---:|---:|---:|---|"
    )
    lines = [head]
    order = sorted(rows, key=lambda r: (r.step_s is None, r.step_s or 0.0))
    for r in order:
        p, c = r.ranked.prediction, r.compiled
        mark = " **(chosen)**" if r.chosen else ""
        if c is None:
            lines.append(f"| {r.name}{mark} | {p.step_s * 1e3:.1f} | failed: {r.error} ||||||")
            continue
        measured = "" if r.step_s is None else f"{r.step_s * 1e3:.1f}"
        axes = ", ".join(f"{k} {v / 1024:.0f}" for k, v in sorted(c.axis_bytes.items()))
        lines.append(
            f"| {r.name}{mark} | {p.step_s * 1e3:.1f} | {measured} | "
            f"{p.memory_bytes / MIB:.1f} | {c.peak_bytes / MIB:.1f} | "
            f"{(r.memory_error or 0) * 100:.1f}% | {c.compile_s:.1f} | {axes} |"
        )
    return "\n".join(lines)


def plot(rows: list[Row], path: str, title: str) -> None:
    """Two panels to ``path`` (PNG): predicted against measured step time, and predicted
    against compiled peak memory; the chosen plan and the best measured are marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.compiled is not None]
    timed = [r for r in ok if r.step_s is not None]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.8))
    best = min(timed, key=lambda r: r.step_s or 0.0, default=None)
    _scatter(
        ax_t,
        [(r.ranked.prediction.step_s * 1e3, r.step_s * 1e3, r) for r in timed],
        best,
        "predicted step (ms)",
        "measured step (ms)",
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
    ax: Any, points: list[tuple[float, float, Row]], best: Row | None, xlabel: str, ylabel: str
) -> None:
    """One panel: a point per plan, the best measured circled, the chosen crossed, y = x."""
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
    lo, hi = min(xs + ys), max(xs + ys)
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="y = x")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
