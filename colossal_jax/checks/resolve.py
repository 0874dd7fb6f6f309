"""``resolve(config, devices) -> Plan``: every rule that needs no device run, once, in one place.

The rules run in the order the command line has met them (so the first error a user sees is the
command line's):

1. the fields with a file-system meaning (:data:`colossal_jax.checks.preflight.CHECKS`: output
   paths that must be writable, a ``--data`` file that must hold tokens);
2. the device count (:meth:`Devices.used_by <colossal_jax.config.plan.Devices.used_by>`): a
   run asking for more devices than there are; a ``data`` axis not given takes the devices the
   other axes leave (:meth:`~colossal_jax.config.schema.ParallelConfig.sized_for`);
3. the parallel configuration against the devices the run uses
   (:func:`~colossal_jax.config.parallel_rules.check_parallel`);
4. the training and optimizer fields (:func:`~colossal_jax.config.train_rules.check_train`)
   and one batch against the host's memory (:func:`colossal_jax.checks.validate.check_host_batch`);
5. ``--init-from-hf`` (:func:`colossal_jax.hf.checks.model_overrides`) and the model sized for
   its task's data (:func:`colossal_jax.checks.validate.size_model`);
6. the model, task and run rules (:mod:`colossal_jax.config.model_rules`);
7. a checkpoint to resume must fit the run (:func:`colossal_jax.checks.preflight.check_resume`),
   and a new run must not replace an earlier run's metrics file
   (:func:`colossal_jax.checks.validate.check_metrics_file`);
8. the memory floor of the training state, when the devices' memory is known.

:func:`bind` binds a plan resolved before JAX started (for a device count) to the devices JAX
reports, running only the rules that need them.

What reads a file is cached by the file's path and ``stat`` (a Hugging Face ``config.json``, a
``--data`` file's tokens), so a planner that resolves thousands of candidates reads each once;
an edited file is read again. The probes of the output paths (a temporary entry created and
removed: about 4 ms for a directory on a slow file system) are repeated only when the path, or
the directory it would be created in, appears or changes owner or permissions. Pure and
JAX-free: the rules that need the backend (the attention kernel, an ``--xla-preset`` in effect)
stay where the run is built.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from colossal_jax.checks.preflight import (
    CHECKS,
    check_field,
    check_resume,
    latest_checkpoint_meta,
)
from colossal_jax.checks.validate import (
    check_host_batch,
    check_metrics_file,
    host_memory_bytes,
    size_model,
)
from colossal_jax.config.choices import IMAGE_DATA, MESH_ORDER
from colossal_jax.config.errors import ConfigError
from colossal_jax.config.families import MODELS, family_of
from colossal_jax.config.model_rules import (
    check_memory,
    check_model,
    check_run,
    check_task,
    grad_accum_of,
)
from colossal_jax.config.optimizers import for_batch
from colossal_jax.config.parallel_rules import check_parallel, uses_zigzag
from colossal_jax.config.plan import Devices, Plan
from colossal_jax.config.schema import TrainConfig
from colossal_jax.config.tensor_split import batch_shards, split_of
from colossal_jax.config.train_rules import check_train, host_overlap
from colossal_jax.data.corpus import vocab_of
from colossal_jax.hf.checks import model_overrides

BUILTIN_DATA = ("stdlib", "synthetic", *IMAGE_DATA)
"""``--data`` values that name no file."""


def resolve(config: TrainConfig, devices: Devices | int) -> Plan:
    """The :class:`Plan` of ``config`` on ``devices`` (a :class:`Devices`, or a count: CPU
    devices of unknown memory), after every rule that needs no device run, each once, in the
    order of this module's docstring. Raises :class:`ConfigError` naming the first bad value and
    a valid alternative."""
    devices = Devices.of(devices)
    corpus_vocab = check_files(config)
    n = devices.used_by(config)
    if isinstance(config.parallel.data, int):  # check_parallel names a size that is no number
        config = dataclasses.replace(config, parallel=config.parallel.sized_for(n))
    par = config.parallel
    check_parallel(par, n)
    check_train(config)
    check_host_batch(config, host_memory_bytes())
    overrides = _model_overrides(config)
    try:
        family = family_of(config.model)
    except KeyError as e:
        raise ConfigError(e.args[0]) from None
    # as data.tasks.data_vocab: images size nothing
    data_vocab = None if family.task == "image_classification" else corpus_vocab
    model = size_model(config, overrides, data_vocab)
    check_model(model, MODELS[config.model], config.model_overrides)
    check_task(config, model)
    check_run(config, model)
    if config.checkpoint_dir is not None:
        check_resume(config, model=model)
    if config.metrics_file is not None:
        resumes = latest_checkpoint_meta(config.checkpoint_dir) is not None
        check_metrics_file(config, resumes=resumes)
    capacity = devices.capacity(par.size)
    if capacity is not None:
        check_memory(config, model, *capacity)
    split = split_of(par)
    return Plan(
        config=dataclasses.replace(
            config, devices=n, optim=for_batch(config.optim, config.batch_size)
        ),
        devices=devices,
        model=model,
        family=family.name,
        task=family.task,
        data_vocab=data_vocab,
        mesh_shape=tuple(getattr(par, a) for a in MESH_ORDER),
        microbatches=par.num_microbatches,
        grad_accum=grad_accum_of(config),
        batch_shards=batch_shards(par),
        tensor_split=split,
        zigzag=uses_zigzag(par, model),
        host_overlap=host_overlap(config.host_overlap, devices.platform),
    )


def bind(plan: Plan, devices: Devices) -> Plan:
    """``plan``, resolved before JAX started (for a count of devices of unknown memory), bound
    to the ``devices`` JAX reports. Only the rules that need them run: enough devices for the
    run, and the memory floor when ``plan`` was resolved without the devices' memory; then
    ``host_overlap=auto`` is decided for their platform. No device-free rule runs again."""
    config = plan.config
    devices.used_by(config)
    capacity = devices.capacity(config.parallel.size)
    if plan.devices.memory_bytes is None and capacity is not None:
        check_memory(config, plan.model, *capacity)
    overlap = host_overlap(config.host_overlap, devices.platform)
    return dataclasses.replace(plan, devices=devices, host_overlap=overlap)


def check_files(cfg: Any) -> int | None:
    """The fields of :data:`~colossal_jax.checks.preflight.CHECKS` of ``cfg`` (a
    :class:`TrainConfig`, or the parsed flags, which carry the same names), in its order;
    returns the token ids of ``--data`` (:func:`~colossal_jax.data.corpus.vocab_of`, None for
    synthetic tokens). Cached as this module's docstring says: the command line checks its
    flags before JAX starts, and the resolve that follows reads the answers back."""
    vocab = None
    for name in CHECKS:
        value = getattr(cfg, name)
        if name == "data":
            vocab = None if value is None else _corpus_vocab(value)
        elif value is not None:
            _cached(("path", name, value, _nearest(value)), partial(check_field, name, value))
    return vocab


def _corpus_vocab(spec: str) -> int | None:
    """``--data spec`` checked (a file must hold usable tokens) and its token ids; a file is
    read once per path and ``stat``."""

    def read() -> int | None:
        check_field("data", spec)
        return vocab_of(spec)

    if spec in BUILTIN_DATA:
        return _cached(("data", spec), read)
    return _cached(("data", spec, _stamp(spec)), read)


def _model_overrides(cfg: TrainConfig) -> dict[str, Any]:
    """:func:`colossal_jax.hf.checks.model_overrides`; with ``--init-from-hf DIR`` read once per
    directory, ``config.json`` and weight files (their ``stat``), ``--model`` and ``--set
    model.*``."""
    if cfg.init_from_hf is None:
        return model_overrides(cfg)
    root = cfg.init_from_hf
    key = (
        "hf",
        root,
        cfg.model,
        repr(sorted(cfg.model_overrides.items())),
        _stamp(root),
        _stamp(os.path.join(root, "config.json")),
    )
    return dict(_cached(key, lambda: model_overrides(cfg)))


_READS: dict[tuple, Any] = {}
_MAX_READS = 256


def _cached(key: tuple, read: Callable[[], Any]) -> Any:
    """``read()``, remembered under ``key`` (an error is not remembered)."""
    if key not in _READS:
        if len(_READS) >= _MAX_READS:
            _READS.clear()
        _READS[key] = read()
    return _READS[key]


def _nearest(path: str) -> tuple[str, tuple[int, ...] | None]:
    """``path``, or else its nearest existing ancestor, with its owner and permissions: what
    decides whether a probe of ``path`` (:func:`colossal_jax.checks.preflight.check_field`) can
    create an entry."""
    p = Path(path).absolute()
    while True:
        try:
            st = p.stat()
        except (OSError, ValueError):
            if p != p.parent:
                p = p.parent
                continue
            return str(p), None
        return str(p), (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid)


def _stamp(path: str) -> tuple[int, int, int] | None:
    """``(mtime_ns, size, inode)`` of ``path``, None where there is nothing to stat. A directory's
    changes when an entry is added, removed or renamed in it."""
    try:
        st = Path(path).stat()
    except (OSError, ValueError):
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino
