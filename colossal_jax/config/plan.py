"""The plan of a run: everything derived from a :class:`TrainConfig` for a set of devices.

:func:`colossal_jax.checks.resolve.resolve` runs every rule that needs no device run once and
returns a :class:`Plan`, so that whatever builds the run reads the derived values (mesh shape,
modes, schedule, microbatches, accumulation, ZeRO, batch shards, model dimensions) instead of
deriving and validating them again. :class:`Devices` describes the devices a plan is for as plain
numbers: the runtime fills it from ``jax.devices()``, a planner invents one (a count is enough).
The device-count rule lives here, beside :class:`Devices`. Nothing here imports JAX.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from colossal_jax.config.errors import ConfigError
from colossal_jax.config.model_rules import param_count, state_bytes
from colossal_jax.config.schema import TrainConfig
from colossal_jax.config.tensor_split import TensorSplit

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
"""The XLA flag that makes the CPU backend expose N simulated devices."""


def devices_hint(wanted: int, available: int) -> str:
    """What to do when ``wanted`` devices are asked for on a CPU with only ``available``."""
    return (
        f"on a CPU, call colossal_jax.simulate_cpu_devices({wanted}) before anything touches JAX "
        f"(or set XLA_FLAGS={DEVICE_COUNT_FLAG}={wanted}; the command line's --devices {wanted} "
        f"does this), or use {available} device(s)"
    )


@dataclass(frozen=True)
class Devices:
    """The devices a plan is resolved for, as numbers (no JAX objects).

    Attributes:
      count: the devices available, of every process; a run uses ``TrainConfig.devices`` of
        them when that is set, else all of them.
      platform: the backend (``jax.default_backend()``: ``cpu``, ``gpu``, ``tpu``); it decides
        ``host_overlap=auto`` and whether a shortage of devices hints at simulated CPU devices.
      memory_bytes: the memory of one device (on a CPU: the host's), or None when unknown; the
        memory floor of the training state is checked only when it is known.
      memory_shared_by: how many devices share ``memory_bytes``: 1 for an accelerator's own
        memory, the local device count for simulated CPU devices (which share the host's).
      process_count, process_index: the processes of the run and this one's index.
    """

    count: int
    platform: str = "cpu"
    memory_bytes: int | None = None
    memory_shared_by: int = 1
    process_count: int = 1
    process_index: int = 0

    @classmethod
    def of(cls, devices: Devices | int) -> Devices:
        """``devices`` itself, or for a count (a planner's candidate) ``Devices(count)``: CPU
        devices of unknown memory in one process."""
        if isinstance(devices, Devices):
            return devices
        if isinstance(devices, bool) or not isinstance(devices, int):
            raise TypeError(f"devices must be a Devices or an int, not {devices!r}")
        return cls(count=devices)

    def capacity(self, mesh_size: int) -> tuple[int, int] | None:
        """``(bytes, devices sharing them)`` for a mesh of ``mesh_size`` of these devices (the
        memory floor's input, :func:`~colossal_jax.config.model_rules.check_memory`); None when
        the memory is unknown."""
        if self.memory_bytes is None:
            return None
        return self.memory_bytes, min(mesh_size, self.memory_shared_by)

    def used_by(self, cfg: TrainConfig) -> int:
        """The devices a run of ``cfg`` uses: ``cfg.devices``, or all of them. Raises
        :class:`ConfigError` when the run asks for more than there are (``--devices N``, or a
        mesh larger than the devices when ``cfg.devices`` is not set)."""
        sizes = cfg.parallel.axis_sizes.values()
        if cfg.devices is not None:
            wanted = cfg.devices
        elif all(isinstance(n, int) for n in sizes):
            wanted = cfg.parallel.size
        else:  # check_parallel names the axis whose size is not a number
            return self.count
        if wanted > self.count:
            what = (
                f"--devices {cfg.devices}"
                if cfg.devices is not None
                else f"the mesh {cfg.parallel.short()} needs {wanted} devices"
            )
            hint = f"; {devices_hint(wanted, self.count)}" if self.platform == "cpu" else ""
            raise ConfigError(f"{what} but only {self.count} are available{hint}")
        return cfg.devices if cfg.devices is not None else self.count


@dataclass(frozen=True)
class Plan:
    """A run resolved for its devices: the validated config and every value derived from it.

    Built by :func:`colossal_jax.checks.resolve.resolve`, which checked every rule that needs no
    device run; what builds the run trusts it. Frozen and hashable (``config`` holds a dict, so
    it is compared but left out of the hash).

    Attributes:
      config: the validated :class:`TrainConfig`, ``devices`` set to the devices the run uses.
      devices: the :class:`Devices` it was resolved for.
      model: the resolved model config (any family's): the named size, the architecture of
        ``--init-from-hf``, the vocabulary the task needs for the data, then ``--set model.*``.
      family, task: the model's family name and its data task.
      data_vocab: the token ids of ``--data`` (None for images and synthetic tokens).
      mesh_shape: the axis sizes in :data:`~colossal_jax.config.choices.MESH_ORDER`.
      microbatches: M, pipeline microbatches per step (1 without a pipeline).
      grad_accum: microbatches accumulated per step (``--grad-accum``, or derived from
        ``--device-batch``; :func:`~colossal_jax.config.model_rules.grad_accum_of`).
      batch_shards: the pieces the batch is split into (``data`` times the tensor mode's own).
      tensor_split: what the tensor mode divides (:class:`TensorSplit`).
      zigzag: whether ring attention lays the sequence out in zigzag order.
      host_overlap: whether the loop overlaps its host work with the step in flight.

    The modes the config states as they are (tensor and sequence mode, schedule, virtual
    stages, ZeRO stage, remat, precision, offload) and the figures that follow from the model
    (parameters, the training-state floor) are properties read from ``config`` and ``model``,
    not stored twice.
    """

    config: TrainConfig = field(hash=False)
    devices: Devices
    model: Any
    family: str
    task: str
    data_vocab: int | None
    mesh_shape: tuple[int, ...]
    microbatches: int
    grad_accum: int
    batch_shards: int
    tensor_split: TensorSplit
    zigzag: bool
    host_overlap: bool

    @property
    def tensor_mode(self) -> str:
        return self.config.parallel.tensor_mode

    @property
    def seq_mode(self) -> str:
        return self.config.parallel.seq_mode

    @property
    def pipeline(self) -> str:
        """The schedule on ``pipe`` (``none`` without a pipeline)."""
        return self.config.parallel.pipeline

    @property
    def virtual_stages(self) -> int:
        return self.config.parallel.virtual_stages

    @property
    def zero(self) -> int:
        return self.config.parallel.zero

    @property
    def remat(self) -> str:
        return self.config.remat

    @property
    def precision(self) -> str:
        return self.config.precision

    @property
    def offload(self) -> str:
        return self.config.offload

    @property
    def param_count(self) -> int:
        """The model's parameters."""
        return param_count(self.model)

    @property
    def state_bytes(self) -> float:
        """A floor on the training state per device, in bytes
        (:func:`~colossal_jax.config.model_rules.state_bytes`)."""
        return state_bytes(self.config, self.model)

    @property
    def n_devices(self) -> int:
        """The devices the run uses (the mesh's size)."""
        assert self.config.devices is not None  # resolve sets it
        return self.config.devices

    @property
    def pipelined(self) -> bool:
        return self.config.parallel.pipelined

    @property
    def layer_entry(self) -> str | None:
        """The mesh axis of the stacked layers' dimension: ``pipe`` for a pipeline, else None."""
        return "pipe" if self.pipelined else None

    @property
    def schedule_microbatches(self) -> int:
        """Microbatches per step through the pipeline schedule: accumulation composes with a
        pipeline as more microbatches, ``M · grad_accum``."""
        return self.microbatches * self.grad_accum

    @property
    def microbatch_sequences(self) -> int:
        """Sequences per batch shard in one microbatch (of the pipeline and the accumulation)."""
        return self.config.batch_size // (self.batch_shards * self.schedule_microbatches)
