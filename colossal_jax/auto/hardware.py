"""The hardware model of the planner: peak FLOP/s, memory and α-β links of a device kind.

A collective that moves ``B`` bytes per device over a link takes ``α + B / β`` seconds (the
α-β, or Hockney, model; ``B`` counted as docs/formulas.md §1 counts it, per device and received).
A GPU has two links: NVLink inside a node (the tensor, sequence and, where they fit in a node,
pipeline and data axes) and InfiniBand between nodes; which one an axis uses follows from the
physical mesh order (:data:`colossal_jax.config.choices.MESH_ORDER`: tensor innermost, data
outermost) and the node size (:func:`link_of`).

The GPU figures are vendors' documented peaks, derated by one stated factor each
(``efficiency`` for matmuls, ``LINK_EFFICIENCY`` for links); the CPU of this machine is measured
(``scripts/calibrate_cpu.py`` writes the JSON :func:`load_cpu` reads; a default from one such
run ships as :data:`CPU_DEFAULT`). Nothing here imports JAX.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from colossal_jax.config.errors import ConfigError

GB = 1e9

USABLE_MEMORY = 0.9
"""The fraction of a GPU's memory a plan may fill by default: the rest is the runtime's (CUDA
context, cuBLAS/cuDNN workspaces, allocator fragmentation). ``--memory-gb`` sets the budget
exactly instead."""

LINK_EFFICIENCY = 0.8
"""The fraction of a link's documented per-direction bandwidth a large collective achieves
(NCCL's all-reduce bus bandwidth on 8×H100 NVLink is about 360–380 GB/s of 450; on NDR
InfiniBand about 40 of 50 GB/s per GPU). One factor for every GPU link."""


@dataclass(frozen=True)
class Link:
    """One link of the α-β model: ``alpha_s`` seconds per collective, ``beta`` bytes per second
    per device."""

    alpha_s: float
    beta: float

    def seconds(self, nbytes: float, collectives: float) -> float:
        """Time of ``collectives`` collectives moving ``nbytes`` bytes per device in all."""
        return collectives * self.alpha_s + nbytes / self.beta


@dataclass(frozen=True)
class Hardware:
    """A device kind as the cost model sees it.

    Attributes:
      name: ``h100`` | ``h200`` | ``a100`` | ``cpu``.
      peak_flops: dense bf16 FLOP/s of one device (CPU: of the whole host, see ``shared``).
      efficiency: the fraction of ``peak_flops`` the step's matmuls reach (GPU: an assumption,
        0.6; CPU: 1, since the calibration measures the step's own matmuls).
      memory_bytes: device memory (CPU: the host's RAM, shared by the simulated devices).
      node: devices per node (the NVLink domain); axes that stay inside a node use ``intra``.
      intra, inter: the links inside a node and between nodes.
      host: the host link (PCIe) that offloaded state crosses each step.
      shared: True for simulated CPU devices, which share the host's cores: the step costs the
        FLOPs of every device together (``peak_flops`` is the host's), and no communication
        overlaps with compute.
      axes: measured links per mesh axis (CPU calibration); overrides ``intra``/``inter``.
      source: where the figures come from.
    """

    name: str
    peak_flops: float
    efficiency: float
    memory_bytes: float
    node: int
    intra: Link
    inter: Link
    host: Link
    shared: bool = False
    axes: dict[str, Link] = field(default_factory=dict, hash=False, compare=False)
    source: str = ""

    def record(self) -> dict[str, object]:
        """The figures the cost model read, for a sweep's JSON: a stored sweep re-predicted
        under another calibration ranks differently (the CPU's FLOP rate and β split a step's
        terms), so the document says which one its predictions used."""
        links = {"intra": self.intra, "inter": self.inter, "host": self.host, **self.axes}
        return {
            "name": self.name,
            "peak_flops": self.peak_flops,
            "efficiency": self.efficiency,
            "memory_bytes": self.memory_bytes,
            "links_alpha_s_beta": {k: [v.alpha_s, v.beta] for k, v in links.items()},
            "source": self.source,
        }

    def link_of(self, axis: str, inner: int, size: int) -> Link:
        """The link of ``axis`` whose group has ``size`` devices and sits inside ``inner``
        devices of the axes inner to it (the physical mesh order): within a node when
        ``inner · size`` devices fit in one node, else between nodes."""
        if axis in self.axes:
            return self.axes[axis]
        return self.intra if inner * size <= self.node else self.inter


def _gpu(
    name: str,
    tflops: float,
    memory_gb: float,
    nvlink_gbs: float,
    ib_gbs: float,
    pcie_gbs: float,
    source: str,
) -> Hardware:
    """A GPU from its datasheet figures: ``nvlink_gbs``, ``ib_gbs`` and ``pcie_gbs`` per
    direction, derated by :data:`LINK_EFFICIENCY`."""
    return Hardware(
        name=name,
        peak_flops=tflops * 1e12,
        efficiency=0.6,
        memory_bytes=memory_gb * GB,
        node=8,
        intra=Link(alpha_s=5e-6, beta=LINK_EFFICIENCY * nvlink_gbs * GB),
        inter=Link(alpha_s=15e-6, beta=LINK_EFFICIENCY * ib_gbs * GB),
        host=Link(alpha_s=10e-6, beta=LINK_EFFICIENCY * pcie_gbs * GB),
        source=source,
    )


H100 = _gpu(
    "h100",
    989.0,
    80.0,
    450.0,
    50.0,
    64.0,
    "NVIDIA H100 Tensor Core GPU datasheet (SXM5): 989 TFLOP/s dense BF16, 80 GB HBM3, NVLink "
    "900 GB/s bidirectional (450 per direction), PCIe Gen5 x16 (64 GB/s per direction); DGX H100 "
    "user guide: one ConnectX-7 NDR 400 Gb/s (50 GB/s) InfiniBand port per GPU",
)
"""H100 SXM5 80 GB in a DGX H100 (8 GPUs per NVLink domain)."""

H200 = _gpu(
    "h200",
    989.0,
    141.0,
    450.0,
    50.0,
    64.0,
    "NVIDIA H200 Tensor Core GPU datasheet (SXM): 989 TFLOP/s dense BF16 (as H100), 141 GB "
    "HBM3e, NVLink 900 GB/s bidirectional; DGX H200: ConnectX-7 NDR 400 Gb/s per GPU",
)
"""H200 SXM 141 GB, 8 GPUs per node."""

A100 = _gpu(
    "a100",
    312.0,
    80.0,
    300.0,
    25.0,
    32.0,
    "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB): 312 TFLOP/s dense BF16, NVLink 3 "
    "600 GB/s bidirectional (300 per direction), PCIe Gen4 x16 (32 GB/s); DGX A100 user guide: "
    "one ConnectX-6 HDR 200 Gb/s (25 GB/s) InfiniBand port per GPU",
)
"""A100 SXM4 80 GB in a DGX A100."""

CPU_DEFAULT: dict = {
    "device": "cpu",
    "flops_per_s": 2.0e10,
    "devices": 8,
    "axes": {},
    "alpha_s": 1.5e-4,
    "beta_bytes_per_s": 2.0e9,
    "memory_bytes": 8 * GB,
    "note": "shipped default (order of magnitude of a 2-core host); run "
    "scripts/calibrate_cpu.py for this machine's figures",
}
"""The CPU model used when no calibration file exists (``scripts/calibrate_cpu.py`` writes
one)."""

CPU_STEP = {
    "collective_s": 0,
    "xla_score_s": 7.7e-09,
    "ring_score_s": 5.24e-09,
    "residual_tick_byte_s": 2.24e-11,
    "stack_tick_byte_s": 2.89e-10,
    "kept_byte_s": 4.72e-10,
    "grid_flop_s": 1.62e-12,
}
"""What a step on simulated CPU devices costs beyond its matmuls and its bytes on the links,
per unit (:func:`colossal_jax.auto.cost.cpu_terms`): every collective (a rendezvous of every
device's thread on the shared cores, which an isolated timing of one collective, the
calibration's α of about 0, does not see; fitted 0 since the grid's FLOPs are priced apart,
below); every attention score element of a step, by kernel (XLA's attention materialises
``[heads, s, s]`` blocks and streams them through the softmax and its gradient, memory-bound
with head sizes of 8–32; the ring's blockwise kernel a little less); every byte of a stage's
pipeline record buffers per tick (a tick costs in proportion to the buffers its loop carries:
GPipe, whose ``M`` records a stage holds, measured 0.04 / 0.08 / 0.19 s a step slower than
1F1B's ``p`` at M = 4 / 8 / 16 on llama-tiny); every byte of a stage's stacked parameters per
tick (each tick adds a chunk's gradient into the stage's gradient sums and slices its chunk out
of the stack); every byte the remat policy keeps over the step (written in the forward, read in
the backward, on every device); and every FLOP of a 2D, 2.5D or 3D plan (its linears run on a
grid's gathered blocks: on this host 22% more a FLOP than 1D's or a single device's, against
the calibration's 134.3 GFLOP/s).
Fitted by non-negative least squares (``colossal_jax.auto.fit_cpu.nnls``, three rounds, the
bubble's share of the prices carried over) to the step times of every GPT plan the stored
sweeps timed, 776 plans of the 4-layer, 256-wide GPT on 8 devices, put on one scale
(``auto/sweep_scale.py``: each plan the geometric mean of its timings) and times 0.58, the
scale of the calibration's own fit set (2026-12-07, docs/planner_log.md); ten-fold
cross-validated, the planner's own list of 320 ranks at 0.799–0.801 and every timed plan at
0.90.
llama-tiny is held out. Until 2026-12-07 five units, fitted on 48 ``none`` plans at 8
microbatches (1.91e-4, 1.34e-8, 8.89e-9, 1.23e-11, 1.77e-10); until 2026-11-28 four; until
2026-11-27 only a 6 ms floor on every collective's α stood for all of it."""

CPU_ALPHA_S = CPU_STEP["collective_s"]
"""The least fixed cost of one collective inside a whole step on simulated CPU devices
(:data:`CPU_STEP`)."""

CALIBRATION_ENV = "COLOSSAL_JAX_CALIBRATION"
"""Environment variable naming the CPU calibration JSON (else :func:`calibration_path`)."""


def calibration_path() -> Path:
    """Where the CPU calibration is read from: ``$COLOSSAL_JAX_CALIBRATION``, else
    ``~/.cache/colossal_jax/planner/cpu.json``."""
    env = os.environ.get(CALIBRATION_ENV)
    if env:
        return Path(env)
    return Path.home() / ".cache" / "colossal_jax" / "planner" / "cpu.json"


def cpu_from(doc: dict) -> Hardware:
    """The CPU model of a calibration document (the JSON ``scripts/calibrate_cpu.py`` writes:
    ``flops_per_s`` of the host, ``axes: {axis: {alpha_s, beta_bytes_per_s}}``, optional
    ``alpha_s``/``beta_bytes_per_s`` for axes it lacks, ``memory_bytes``); α is at least
    :data:`CPU_ALPHA_S`."""
    default = Link(
        alpha_s=max(CPU_ALPHA_S, float(doc.get("alpha_s", CPU_DEFAULT["alpha_s"]))),
        beta=float(doc.get("beta_bytes_per_s", CPU_DEFAULT["beta_bytes_per_s"])),
    )
    axes = {
        a: Link(alpha_s=max(CPU_ALPHA_S, float(v["alpha_s"])), beta=float(v["beta_bytes_per_s"]))
        for a, v in doc.get("axes", {}).items()
    }
    return Hardware(
        name="cpu",
        peak_flops=float(doc["flops_per_s"]),
        efficiency=1.0,
        memory_bytes=float(doc.get("memory_bytes", CPU_DEFAULT["memory_bytes"])),
        node=1 << 30,
        intra=default,
        inter=default,
        host=default,
        shared=True,
        axes=axes,
        source=str(doc.get("note", "calibration")),
    )


def load_cpu(path: Path | None = None) -> Hardware:
    """This machine's CPU: the calibration at ``path`` (default :func:`calibration_path`), or
    :data:`CPU_DEFAULT` when there is none."""
    path = path or calibration_path()
    if not path.is_file():
        return cpu_from(CPU_DEFAULT)
    try:
        return cpu_from(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"the CPU calibration {path} is not usable ({e}); run scripts/calibrate_cpu.py again "
            f"or delete it to use the shipped default"
        ) from None


GPUS = {"h100": H100, "h200": H200, "a100": A100}
DEVICES = (*GPUS, "cpu")
"""``--device`` of ``scripts/plan.py``."""


def hardware(name: str, memory_gb: float | None = None) -> Hardware:
    """The model of device kind ``name`` (:data:`DEVICES`), with ``memory_gb`` GB per device
    when given (the planner's budget)."""
    if name == "cpu":
        hw = load_cpu()
    elif name in GPUS:
        hw = GPUS[name]
    else:
        raise ConfigError(f"--device {name!r} is unknown; choose one of {', '.join(DEVICES)}")
    if memory_gb is not None:
        if memory_gb <= 0:
            raise ConfigError(f"--memory-gb {memory_gb} must be positive (e.g. --memory-gb 80)")
        hw = replace(hw, memory_bytes=memory_gb * GB)
    return hw
