"""What ``scripts/train.py`` does around JAX's start: the host devices to simulate and the XLA
flags (``--devices``, ``--xla-preset``: both must be in ``XLA_FLAGS`` before JAX is imported), the
run's plan (:func:`colossal_jax.checks.resolve.resolve`, once: before JAX starts where the device
count is known without JAX, then only bound to the devices JAX reports; after JAX starts
otherwise), and the multi-process runtime with its peer watchdog (``--coordinator``, or a
detected cluster).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
from collections.abc import Mapping

from colossal_jax.checks.resolve import bind, resolve
from colossal_jax.cli.configure import config_from_args
from colossal_jax.config import AXES, ConfigError, TrainConfig, parse_mesh
from colossal_jax.config.plan import Devices, Plan
from colossal_jax.config.train_rules import check_xla_preset
from colossal_jax.runtime import signals

AUTO = "auto"
"""``--mesh auto``: the planner chooses the mesh, modes and memory knobs (docs/planner.md)."""

DEFAULT_CPU_DEVICES = 8
"""Host devices a run simulates on a CPU without ``--devices``."""
DEFAULT_PEER_TIMEOUT = 60.0
"""Seconds a multi-process run waits on a silent peer before exiting (``--peer-timeout``)."""
PEER_LOST_EXIT = 4
"""Exit status of a process that lost contact with a peer (:mod:`colossal_jax.runtime.watchdog`)."""


def _setup_devices(args) -> bool:
    """Simulate ``--devices`` (default 8) host devices; False if XLA_FLAGS already set a count."""
    n = args.devices if args.devices is not None else DEFAULT_CPU_DEVICES
    if n < 1:
        raise ConfigError(
            f"--devices {n} must be at least 1 (e.g. --devices {DEFAULT_CPU_DEVICES})"
        )
    return simulate_host_devices(n)


def simulate_host_devices(n: int) -> bool:
    """Ask XLA for ``n`` host devices (``XLA_FLAGS``, before JAX starts); False, and nothing
    changed, where ``XLA_FLAGS`` already sets a count."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" in flags:
        return False
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    return True


def apply_xla_preset(name: str | None) -> None:
    """``--xla-preset``: its flags into ``XLA_FLAGS`` before JAX starts, printed (stderr)."""
    if name is None:
        return
    from colossal_jax.config import xla_presets

    check_xla_preset(name)
    print(f"note: {xla_presets.apply(name)}", file=sys.stderr)


def devices_before_jax(args, devices_set: bool) -> int | None:
    """The device count the run will have, where it is known without JAX: the simulated host
    devices under ``JAX_PLATFORMS=cpu``, ``--devices N`` when :func:`_setup_devices` set it, or
    else the size of a ``--mesh`` that names every axis it uses (``data`` included); None
    otherwise. The first two count one process's devices: with ``--num-processes P`` (every
    process launched alike) the run has P times as many."""
    forced = re.search(
        r"xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", "")
    )
    processes = args.num_processes or 1
    if os.environ.get("JAX_PLATFORMS") == "cpu" and forced:
        return int(forced.group(1)) * processes
    if args.devices is not None and devices_set:
        return args.devices * processes
    if args.mesh is None or not args.mesh.strip():
        return None
    sizes = parse_mesh(
        args.mesh, None, tensor_mode=args.tensor_mode or "none", tensor_depth=args.tensor_depth
    )
    return math.prod(sizes.get(a, 1) for a in AXES) if "data" in sizes else None


def run_config(args, n_devices: int) -> TrainConfig:
    """The run of the parsed flags (:func:`~colossal_jax.cli.configure.config_from_args`) on
    ``n_devices`` devices, all of which it uses."""
    return dataclasses.replace(config_from_args(args, n_devices), devices=n_devices)


def auto_run(args, devices: Devices) -> Plan:
    """``--mesh auto``: the planner's plan (:func:`colossal_jax.auto.choose.auto_plan`) for the
    run of the other flags on ``devices``, its choice printed (stderr). A mesh flag given
    beside it is refused: the planner chooses them all."""
    from colossal_jax.auto.choose import auto_plan
    from colossal_jax.cli.configure import parallel_flags_given

    given = parallel_flags_given(args)
    if given:
        raise ConfigError(
            f"--mesh auto chooses the parallel modes itself; drop --{given[0].replace('_', '-')}"
            " (or give --mesh explicitly)"
        )
    n = args.devices if args.devices is not None and devices.platform != "cpu" else devices.count
    cfg = run_config(argparse.Namespace(**{**vars(args), "mesh": None}), n)
    return auto_plan(cfg, devices, log=lambda line: print(line, file=sys.stderr))


def plan_before_jax(args, devices_set: bool, cluster: str | None) -> Plan | None:
    """The run's plan, resolved before JAX starts where the device count is known without JAX
    (:func:`devices_before_jax`; never in a ``cluster``, whose processes JAX counts), for that
    many devices of unknown memory; None otherwise."""
    if cluster is not None or args.mesh == AUTO:  # the planner plans for the devices JAX has
        return None
    known = devices_before_jax(args, devices_set)
    return None if known is None else resolve(run_config(args, known), Devices(known))


def plan_with_jax(args, plan: Plan | None) -> Plan:
    """The run's plan on the devices JAX started with (all of them, or ``--devices N`` of an
    accelerator's): ``plan`` from :func:`plan_before_jax` bound to them, which runs only the
    rules that need them (:func:`~colossal_jax.checks.resolve.bind`); resolved now where no
    plan was made before JAX, or where it was made for another count (a ``--mesh`` that does
    not cover an accelerator's devices, which the resolve refuses)."""
    from colossal_jax.runtime.devices import current_devices

    devices = current_devices()
    if args.mesh == AUTO:
        return auto_run(args, devices)
    n = devices.count
    if args.devices is not None and devices.platform != "cpu":
        if args.devices > n:
            raise ConfigError(f"--devices {args.devices} but only {n} are available")
        n = args.devices
    if plan is not None and plan.n_devices == n:
        return bind(plan, devices)
    return resolve(run_config(args, n), devices)


def slurm_local_device_ids(env: Mapping[str, str]) -> list[int] | None:
    """The GPUs a SLURM task uses where SLURM chose them: all of ``CUDA_VISIBLE_DEVICES`` (or
    ``ROCR_VISIBLE_DEVICES``), which ``--gpus-per-task``/``--gres`` set and in which the task's
    GPUs count from 0; None elsewhere (outside SLURM, GPUs not scheduled, or the user's
    ``JAX_LOCAL_DEVICE_IDS``), which leaves JAX's own choice: ``JAX_LOCAL_DEVICE_IDS``, else
    the GPU numbered ``SLURM_LOCALID`` (one task per GPU). JAX's choice alone would give a task
    bound to GPU 3 the absent ordinal 3, and a task per node of 8 bound GPUs only GPU 0."""
    if "SLURM_JOB_ID" not in env or env.get("JAX_LOCAL_DEVICE_IDS"):
        return None
    visible = env.get("CUDA_VISIBLE_DEVICES") or env.get("ROCR_VISIBLE_DEVICES") or ""
    ids = [x for x in visible.split(",") if x.strip()]
    return list(range(len(ids))) if ids else None


def init_distributed(args, cluster: str | None) -> None:
    """``jax.distributed.initialize`` with the explicit flags, or with none where ``cluster``
    (:func:`preflight.detect_cluster`) says JAX's auto-detection fills them in; then the peer
    watchdog (:mod:`colossal_jax.runtime.watchdog`) with ``--peer-timeout``."""
    import jax

    from colossal_jax.runtime import watchdog

    # CPU collectives across processes; has no effect on GPU/TPU backends
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # JAX's heartbeat is the backstop (it aborts the process with its own message, ~0.8 of its
    # timeout after a peer's death): three times the watchdog's timeout, so that a peer lost
    # during a step is reported by the watchdog's one line
    timeout = max(1, math.ceil(3 * args.peer_timeout))
    # JAX's preemption service takes SIGTERM over in C++ (for reached_preemption_sync_point),
    # so Python's handler would never see it. The steps carry every process's stop flag instead
    # (training.batches.stop_flags): one mechanism for SIGINT and SIGTERM, agreed at the same
    # step by all.
    jax.config.update("jax_enable_preemption_service", False)
    if cluster is not None:
        print(f"cluster: {cluster}; jax.distributed.initialize() detects the rest", file=sys.stderr)
        jax.distributed.initialize(
            local_device_ids=slurm_local_device_ids(os.environ),
            heartbeat_timeout_seconds=timeout,
        )
    else:
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
            heartbeat_timeout_seconds=timeout,
        )
    signals.install()  # again, in case the runtime replaced a handler
    watchdog.start(args.peer_timeout, exit_code=PEER_LOST_EXIT)
