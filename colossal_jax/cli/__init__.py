"""Command line of ``scripts/train.py`` (also installed as ``colossal-train``).

JAX is imported only after the flags are parsed, so ``--devices N`` can set XLA_FLAGS to simulate
N host devices on a CPU, and only after the run's plan is resolved
(:func:`colossal_jax.checks.resolve.resolve`: every rule that needs no device, once) when the
device count is known without JAX (``--devices N``, or a ``--mesh`` that names ``data``); JAX's
devices then only bind it (:func:`colossal_jax.cli.launch.plan_with_jax`).
Configuration errors print one line ``error: ...`` and exit with status 2; a non-finite loss
stops the run with status 3 (:mod:`colossal_jax.runtime.divergence`); SIGINT and SIGTERM stop it
after a checkpoint with status 130 and 143 (:mod:`colossal_jax.runtime.signals`), at any moment
without a traceback.

The command is split by concern: :mod:`~colossal_jax.cli.parser` (the flags, generated from the
config dataclasses), :mod:`~colossal_jax.cli.configure` (flags → :class:`TrainConfig`),
:mod:`~colossal_jax.cli.launch` (devices, XLA flags and processes around JAX's start) and
:mod:`~colossal_jax.cli.listing` (``--list-models``, ``--list-meshes``); their public names are
re-exported here.
"""

from __future__ import annotations

import os
import signal
import sys

from colossal_jax.checks import preflight
from colossal_jax.checks.resolve import check_files
from colossal_jax.cli.configure import FAMILY_FLAGS, config_from_args, parallel_config
from colossal_jax.cli.launch import (
    DEFAULT_CPU_DEVICES,
    DEFAULT_PEER_TIMEOUT,
    PEER_LOST_EXIT,
    _setup_devices,
    apply_xla_preset,
    devices_before_jax,
    init_distributed,
    plan_before_jax,
    plan_with_jax,
    run_config,
)
from colossal_jax.cli.listing import list_meshes, list_models, model_rows, model_table
from colossal_jax.cli.parser import build_parser
from colossal_jax.config import ConfigError, param_count, warmup_note
from colossal_jax.config.train_rules import check_peer_timeout
from colossal_jax.runtime import signals

__all__ = [
    "DEFAULT_CPU_DEVICES",
    "DEFAULT_PEER_TIMEOUT",
    "FAMILY_FLAGS",
    "PEER_LOST_EXIT",
    "_setup_devices",
    "apply_xla_preset",
    "build_parser",
    "config_from_args",
    "devices_before_jax",
    "list_meshes",
    "list_models",
    "main",
    "model_rows",
    "model_table",
    "parallel_config",
    "param_count",
    "plan_before_jax",
    "plan_with_jax",
    "preflight",
    "run",
    "run_config",
]


def _log_after(notes: list[str]):
    """``print``, but first the notes on stderr: train logs only once every check has passed."""
    pending = list(notes)

    def log(line: str) -> None:
        while pending:
            print(f"note: {pending.pop(0)}", file=sys.stderr)
        print(line)

    return log


def _stop_if_signalled(where: str) -> None:
    if (signum := signals.received()) is not None:
        head = "interrupted"
        if signum != signal.SIGINT:
            head += f" by {signals.name(signum)}"
        raise signals.Interrupted(signum, f"{head} {where}; nothing saved")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0, 2 configuration, 3 diverged, 130/143
    interrupted)."""
    from colossal_jax.runtime.divergence import EXIT_CODE, Diverged

    try:
        args = build_parser().parse_args(argv)
        if args.list_meshes:
            print("\n".join(list_meshes()))
            return 0
        if args.list_models:
            print("\n".join(list_models()))
            return 0
        preflight.check_processes(args.coordinator, args.num_processes, args.process_id)
        check_files(args)  # the flags' paths and data, at once; the resolve reads them back
        check_peer_timeout(args.peer_timeout)
        cluster = preflight.detect_cluster(
            os.environ, coordinator=args.coordinator, opt_out=args.no_cluster_detect
        )
        devices_set = _setup_devices(args)
        apply_xla_preset(args.xla_preset)
        plan = plan_before_jax(args, devices_set, cluster)
        if args.coordinator is not None or cluster is not None:
            init_distributed(args, cluster)
        plan = plan_with_jax(args, plan)
        _stop_if_signalled("before training started")
        from colossal_jax.training.trainer import train

        notes = [note] if (note := warmup_note(plan.config)) else []
        train(plan, progress=not args.no_progress, log=_log_after(notes))
        return 0
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Diverged as e:
        print(f"error: {e.line}", file=sys.stderr)
        return EXIT_CODE
    except signals.Interrupted as e:
        print(e.line, file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:  # a SIGINT before the handlers were installed
        print("interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """The process entry point: SIGINT/SIGTERM handlers (:mod:`colossal_jax.runtime.signals`), then
    :func:`main`, then exit with its status. (``main`` alone, as tests call it, leaves the
    handlers of the calling program alone.)"""
    signals.install()
    code = main()
    # Python's finalisation resets its own signal handlers to the default action before JAX's
    # and orbax's teardown ends, so a Ctrl-C there would kill the finished process by signal;
    # the run is over and its status decided, so ignore the two signals from here on
    signals.ignore()
    sys.exit(code)
