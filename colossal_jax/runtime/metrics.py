"""Numbers a user can trust: tokens/s, model FLOP utilisation, memory; JSONL and TensorBoard.

MFU = achieved model FLOP/s ÷ peak, with model FLOPs per token from the model config's
``flops_per_token`` (``6·N + 12·L·s·h``, docs/formulas.md; every family). Peaks are dense bf16
tensor-core figures; on a device whose peak is unknown (the CPU) MFU is reported as ``null``,
never guessed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax

PEAK_FLOPS = {  # dense bf16 FLOP/s per device, by substring of device_kind (lower case)
    "h200": 989e12,
    "h100": 989e12,
    "a100": 312e12,
    "l4": 121e12,
    "v5p": 459e12,
    "v5e": 197e12,
    "v5 lite": 197e12,
    "v4": 275e12,
}


def peak_flops(device: jax.Device | None = None) -> float | None:
    """Dense bf16 peak of ``device`` (default: the first device), or None if unknown."""
    kind = (device or jax.devices()[0]).device_kind.lower()
    for key, peak in PEAK_FLOPS.items():
        if key in kind:
            return peak
    return None


def device_memory() -> dict[str, int] | None:
    """Peak and current bytes in use on the first local device, where the backend reports it."""
    stats = jax.local_devices()[0].memory_stats()
    if not stats:
        return None
    return {
        "bytes_in_use": int(stats.get("bytes_in_use", 0)),
        "peak_bytes_in_use": int(stats.get("peak_bytes_in_use", 0)),
    }


class MetricsWriter:
    """JSON lines (one record per step) and optional TensorBoard scalars; process 0 only."""

    def __init__(self, jsonl: str | None, tensorboard_dir: str | None, *, resume_step: int = 0):
        self.enabled = jax.process_index() == 0
        self._file = None
        self._tb = None
        if not self.enabled:
            return
        if jsonl:
            path = Path(jsonl)
            path.parent.mkdir(parents=True, exist_ok=True)
            kept: list[str] = []
            if resume_step > 0 and path.exists():
                # drop records of steps that are about to be recomputed after a resume
                for line in path.read_text().splitlines():
                    try:
                        if json.loads(line).get("step", 0) <= resume_step:
                            kept.append(line)
                    except json.JSONDecodeError:
                        continue
            # rewritten beside and renamed over: a run killed here keeps the old records
            tmp = path.with_name(f".{path.name}.tmp")
            with tmp.open("w") as f:
                f.writelines(line + "\n" for line in kept)
            os.replace(tmp, path)
            self._file = path.open("a")
        if tensorboard_dir:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(tensorboard_dir)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        if self._tb is not None:
            step = int(record["step"])
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float):
                    self._tb.add_scalar(f"train/{key}", value, step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


def per_device_bytes(tree: Any) -> int:
    """Bytes of ``tree`` held by the most loaded device (from the arrays' shardings)."""
    counts: dict[Any, int] = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            counts[shard.device] = counts.get(shard.device, 0) + shard.data.nbytes
    return max(counts.values()) if counts else 0
