"""The large-batch claim in small: at the same number of samples seen, does LAMB (LARS) at 16× the
batch reach what AdamW reaches at the base batch, in 1/16 of the steps, where AdamW at 16× the
batch does not? (You et al. 2019, arXiv 1904.00962; You, Gitman, Ginsburg 2017,
arXiv 1708.03888.)

Two tasks on data that ships with the dependencies, nothing generated:

- ``bert-tiny``, masked LM on the embedded corpus (the Python standard library's sources, byte
  tokens, ``--data stdlib``), held-out masked-LM loss (lower is better);
- ``vit-tiny`` on scikit-learn's 8×8 handwritten digits (``--data digits``, 20% of the images
  held out, every evaluation scores all of them), held-out accuracy (higher is better).

Arms, each at the same samples seen ``N``: ``AdamW@B``; ``LAMB@16B`` and ``AdamW@16B`` with the
LAMB paper's rule (``--lr-scaling sqrt --base-batch B``: learning rate ×√16, warm-up steps kept,
i.e. the warm-up's epochs ×16); ``LARS@16B`` (ViT only) with the same rule.

The recipe is fixed before any run and the same in every arm (see :data:`RECIPE`); nothing is
tuned to the outcome:

- the base learning rate is the family's default ``3e-3`` (AdamW and LAMB alike, as the LAMB
  paper starts LAMB from the base Adam rate); LARS's global rate is the one whose per-layer step
  at steady momentum equals LAMB's, ``γ = lr·(1−b1)/η`` with the paper's ``η = 0.001``;
- linear warm-up over a fifth of the 16B run's steps, then polynomial decay to 0 (power 1 as LAMB's
  BERT runs; LARS: power 2, as its paper);
- weight decay 0.01, b1 0.9, b2 0.95, global-norm clipping at 1.0 (the library's defaults).

Held-out evaluations come at the same samples seen in every arm (eight per run and before the
first step). Text held-out batches are random windows of the held-out split drawn from the run's
own seed and batch size, so two arms' text evaluations are different samples of the same split;
the digits are scored whole every time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MULTIPLE = 16
"""The large batch as a multiple of the base batch."""
EVALS = 8
"""Held-out evaluations per run after step 0, at the same samples seen in every arm."""


@dataclass(frozen=True)
class Arm:
    """One configuration of the comparison: its label, optimizer and batch multiple."""

    label: str
    optimizer: str
    multiple: int


ARMS = (
    Arm("AdamW@B", "adamw", 1),
    Arm("LAMB@16B", "lamb", MULTIPLE),
    Arm("LARS@16B", "lars", MULTIPLE),
    Arm("AdamW@16B", "adamw", MULTIPLE),
)


@dataclass(frozen=True)
class Task:
    """A model on its data: the base batch, the large run's steps (``N = steps·16B``), the
    held-out metric, and the held-out sequences a text evaluation averages."""

    model: str
    data: str
    base_batch: int
    large_steps: int
    metric: str  # "loss" (lower is better) or "accuracy"
    arms: tuple[str, ...]
    seq_len: int | None = None
    eval_sequences: int = 0

    @property
    def samples(self) -> int:
        return self.large_steps * self.base_batch * MULTIPLE


TASKS = {
    "full": (
        Task("bert-tiny", "stdlib", 8, 64, "loss", ("AdamW@B", "LAMB@16B", "AdamW@16B"), 32, 512),
        Task("vit-tiny", "digits", 16, 128, "accuracy", tuple(a.label for a in ARMS)),
    ),
    "quick": (
        Task("bert-tiny", "stdlib", 8, 8, "loss", ("AdamW@B", "LAMB@16B", "AdamW@16B"), 32, 64),
        Task("vit-tiny", "digits", 16, 16, "accuracy", tuple(a.label for a in ARMS)),
    ),
}

RECIPE = {
    "base_lr": 3e-3,
    "lr_scaling": "sqrt",
    "warmup_fraction_of_large_run": 0.2,
    "lr_schedule": "poly",
    "poly_power": {"adamw": 1.0, "lamb": 1.0, "lars": 2.0},
    "min_lr_ratio": 0.0,
    "lars_trust": 0.001,
    "weight_decay": 0.01,
    "b1": 0.9,
}


def arm(label: str) -> Arm:
    return next(a for a in ARMS if a.label == label)


def run_config(task: Task, a: Arm, seed: int):
    """The :class:`TrainConfig` of one arm of ``task`` at ``seed`` (one device)."""
    from colossal_jax.config import OptimConfig, ParallelConfig, TrainConfig

    batch = task.base_batch * a.multiple
    steps = task.samples // batch
    lr = RECIPE["base_lr"]
    if a.optimizer == "lars":  # LAMB's per-layer step at steady momentum: γ·η/(1−b1) = lr
        lr = lr * (1 - RECIPE["b1"]) / RECIPE["lars_trust"]
    optim = OptimConfig(
        name=a.optimizer,
        lr=lr,
        warmup_steps=max(round(RECIPE["warmup_fraction_of_large_run"] * task.large_steps), 1),
        min_lr_ratio=RECIPE["min_lr_ratio"],
        weight_decay=RECIPE["weight_decay"],
        b1=RECIPE["b1"],
        lars_trust=RECIPE["lars_trust"],
        lr_schedule=RECIPE["lr_schedule"],
        poly_power=RECIPE["poly_power"][a.optimizer],
        lr_scaling=RECIPE["lr_scaling"],
        base_batch=task.base_batch,
    )
    fields: dict[str, Any] = dict(
        steps=steps,
        batch_size=batch,
        seed=seed,
        data=task.data,
        devices=1,
        parallel=ParallelConfig(data=1),
        optim=optim,
        eval_every=steps // EVALS,
    )
    if task.seq_len is not None:
        fields["seq_len"] = task.seq_len
    if task.eval_sequences:
        fields["eval_batches"] = max(task.eval_sequences // batch, 1)
    return TrainConfig.for_model(task.model, **fields)


def one_run(task: Task, a: Arm, seed: int) -> dict[str, Any]:
    """Train one arm at ``seed``; its held-out curve against samples seen, steps and wall time."""
    from colossal_jax.training.trainer import train

    cfg = run_config(task, a, seed)
    start = time.perf_counter()
    summary = train(cfg, progress=False, log=lambda _: None)
    wall = time.perf_counter() - start
    pairs = summary.eval_accuracies if task.metric == "accuracy" else summary.eval_losses
    return {
        "arm": a.label,
        "seed": seed,
        "batch": cfg.batch_size,
        "steps": cfg.steps,
        "lr_peak": cfg.optim.lr * _scale(a.multiple),
        "wall_s": round(wall, 2),
        "samples": [step * cfg.batch_size for step, _ in pairs],
        task.metric: [float(v) for _, v in pairs],
    }


def _scale(multiple: int) -> float:
    return math.sqrt(multiple) if RECIPE["lr_scaling"] == "sqrt" else float(multiple)


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def summarize(task: Task, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm, over seeds: final and best held-out metric (mean, std, min, max), steps, wall."""
    best = max if task.metric == "accuracy" else min
    table = {}
    for label in task.arms:
        mine = [r for r in runs if r["arm"] == label]
        if not mine:
            continue
        table[label] = {
            "batch": mine[0]["batch"],
            "steps": mine[0]["steps"],
            "lr_peak": mine[0]["lr_peak"],
            f"final_{task.metric}": _spread([r[task.metric][-1] for r in mine]),
            f"best_{task.metric}": _spread([best(r[task.metric]) for r in mine]),
            "wall_s": _spread([r["wall_s"] for r in mine]),
            "seeds": [r["seed"] for r in mine],
        }
    return table


def verdict(task: Task, table: dict[str, Any]) -> dict[str, Any]:
    """The issue's criteria on the means: LAMB@16B within 2% of AdamW@B's final loss (text) or
    within 1 point of its accuracy (images) in at most 1/8 of the steps; and by how much
    AdamW@16B ends behind AdamW@B (positive: worse), with the seeds' spread."""
    key = f"final_{task.metric}"
    base, lamb, big = (table.get(k) for k in ("AdamW@B", "LAMB@16B", "AdamW@16B"))
    if base is None or lamb is None or big is None:
        return {}
    b, lm, ad = base[key]["mean"], lamb[key]["mean"], big[key]["mean"]
    sign = -1.0 if task.metric == "accuracy" else 1.0
    out: dict[str, Any] = {"steps_ratio": lamb["steps"] / base["steps"]}
    if task.metric == "loss":
        out["lamb_vs_base_rel"] = (lm - b) / b
        out["lamb_within_2pct"] = abs(lm - b) / b <= 0.02
        out["adamw16_worse_by_rel"] = (ad - b) / b
    else:
        out["lamb_vs_base_points"] = 100 * (lm - b)
        out["lamb_within_1pt"] = abs(lm - b) <= 0.01
        out["adamw16_worse_by_points"] = 100 * sign * (ad - b)
    out["adamw16_std_over_seeds"] = big[key]["std"]
    out["base_std_over_seeds"] = base[key]["std"]
    return out


def run_all(
    mode: str, seeds: int, on_run: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Every task's arms at ``seeds`` seeds; ``on_run(description)`` after each run."""
    results: dict[str, Any] = {"mode": mode, "recipe": RECIPE, "multiple": MULTIPLE, "tasks": {}}
    for task in TASKS[mode]:
        runs = []
        for label in task.arms:
            for seed in range(seeds):
                runs.append(one_run(task, arm(label), seed))
                on_run(f"{task.model} {label} seed {seed}")
        table = summarize(task, runs)
        results["tasks"][task.model] = {
            "task": dataclasses.asdict(task) | {"samples": task.samples},
            "table": table,
            "verdict": verdict(task, table),
            "runs": runs,
        }
    return results


def total_runs(mode: str, seeds: int) -> int:
    return sum(len(t.arms) for t in TASKS[mode]) * seeds


def plot(results: dict[str, Any], path: Path) -> None:
    """Held-out metric against samples seen, the mean over seeds with the min–max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tasks = results["tasks"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, (model, entry) in zip(axes[0], tasks.items(), strict=True):
        metric = entry["task"]["metric"]
        for label in entry["table"]:
            mine = [r for r in entry["runs"] if r["arm"] == label]
            x = np.asarray(mine[0]["samples"])
            ys = np.asarray([r[metric] for r in mine])
            scale = 100.0 if metric == "accuracy" else 1.0
            ax.plot(x, scale * ys.mean(0), marker="o", ms=3, label=label)
            ax.fill_between(x, scale * ys.min(0), scale * ys.max(0), alpha=0.2)
        ax.set_xlabel("samples seen")
        ax.set_ylabel("held-out accuracy (%)" if metric == "accuracy" else "held-out MLM loss")
        ax.set_title(f"{model} on {entry['task']['data']}, {len(mine)} seed(s): mean, min–max")
        if metric == "accuracy":
            ax.set_ylim(bottom=max(0.0, ax.get_ylim()[0]))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table_lines(results: dict[str, Any]) -> list[str]:
    """The table as text: per task and arm, batch, steps, final and best metric ± std."""
    lines = []
    for model, entry in results["tasks"].items():
        metric = entry["task"]["metric"]
        scale, unit = (100.0, "%") if metric == "accuracy" else (1.0, "")
        lines.append(f"{model} ({entry['task']['data']}), held-out {metric}, mean ± std:")
        for label, row in entry["table"].items():
            final, best = row[f"final_{metric}"], row[f"best_{metric}"]
            lines.append(
                f"  {label:10s} batch {row['batch']:4d} steps {row['steps']:5d}  final "
                f"{scale * final['mean']:.4g}{unit} ± {scale * final['std']:.2g}  best "
                f"{scale * best['mean']:.4g}{unit} ± {scale * best['std']:.2g}  wall "
                f"{row['wall_s']['mean']:.1f}s"
            )
        lines.append(f"  verdict: {json.dumps(entry['verdict'])}")
    return lines


def markdown_table(results: dict[str, Any]) -> list[str]:
    """The table as Markdown rows (docs/large_batch.md): mean ± std over seeds [min, max]."""
    lines = [
        "| task | arm | batch | steps | peak lr | final held-out | best held-out | wall s / run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, entry in results["tasks"].items():
        metric = entry["task"]["metric"]
        scale, unit = (100.0, " %") if metric == "accuracy" else (1.0, "")
        for label, row in entry["table"].items():
            cells = []
            for key in (f"final_{metric}", f"best_{metric}"):
                s = row[key]
                cells.append(
                    f"{scale * s['mean']:.4g}{unit} ± {scale * s['std']:.2g} "
                    f"[{scale * s['min']:.4g}, {scale * s['max']:.4g}]"
                )
            lines.append(
                f"| {model} {metric} | {label} | {row['batch']} | {row['steps']} | "
                f"{row['lr_peak']:.3g} | {cells[0]} | {cells[1]} | {row['wall_s']['mean']:.0f} |"
            )
    return lines
