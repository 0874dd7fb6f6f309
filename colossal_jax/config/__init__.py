"""The configuration floor: frozen run configs, mesh specs, the model-family registry and every
rule that can be decided from numbers alone. Nothing here imports JAX, Flax or NumPy, and nothing
here imports another floor of the library (docs/architecture.md).

The names a script needs are re-exported here; the modules are:

- :mod:`~colossal_jax.config.errors`: :class:`ConfigError` and the "did you mean" helpers;
- :mod:`~colossal_jax.config.choices`: axis names and the valid values of each choice flag;
- :mod:`~colossal_jax.config.schema`: :class:`TrainConfig`, :class:`ParallelConfig`,
  :class:`OptimConfig`;
- :mod:`~colossal_jax.config.mesh_spec`: ``--mesh`` strings and the TOML presets;
- :mod:`~colossal_jax.config.families`: the model-family registry the zoo registers into;
- the registries of :mod:`~colossal_jax.config.tensor_modes`,
  :mod:`~colossal_jax.config.seq_modes`, :mod:`~colossal_jax.config.pipelines` and
  :mod:`~colossal_jax.config.optimizers` (one registered object per mode, schedule or
  optimizer; :mod:`~colossal_jax.config.registry` is their table);
- the rules, beside what they govern: :mod:`~colossal_jax.config.parallel_rules` (mesh, modes,
  pipeline, sequence split), :mod:`~colossal_jax.config.tensor_split` (what each tensor mode
  divides), :mod:`~colossal_jax.config.train_rules` (training, optimizer and tool flags) and
  :mod:`~colossal_jax.config.model_rules` (the config against a resolved model);
- :mod:`~colossal_jax.config.xla_presets`: named sets of XLA flags.
"""

from colossal_jax.config.choices import (
    ATTENTION_IMPLS,
    AXES,
    MESH_ORDER,
    OFFLOADS,
    OPTIMIZERS,
    PIPELINES,
    PRECISIONS,
    REMATS,
    SEQ_MODES,
    TENSOR_MODES,
)
from colossal_jax.config.errors import ConfigError, choice, suggest
from colossal_jax.config.mesh_spec import describe_preset, list_presets, parse_mesh
from colossal_jax.config.model_rules import param_count, state_bytes
from colossal_jax.config.schema import (
    OptimConfig,
    ParallelConfig,
    TrainConfig,
    coerce,
    field_types,
    warmup_note,
)

__all__ = [
    "ATTENTION_IMPLS",
    "AXES",
    "MESH_ORDER",
    "OFFLOADS",
    "OPTIMIZERS",
    "PIPELINES",
    "PRECISIONS",
    "REMATS",
    "SEQ_MODES",
    "TENSOR_MODES",
    "ConfigError",
    "OptimConfig",
    "ParallelConfig",
    "TrainConfig",
    "choice",
    "coerce",
    "describe_preset",
    "field_types",
    "list_presets",
    "param_count",
    "parse_mesh",
    "state_bytes",
    "suggest",
    "warmup_note",
]
