"""The flags of ``scripts/train.py``, generated from the config dataclasses.

Every flagged field of :class:`TrainConfig`, :class:`OptimConfig` and :class:`ParallelConfig`
(:mod:`colossal_jax.config.flags`) becomes one flag: its spelling, help, type, default and the
example value errors offer all come from the field. Only the flags that are no config field are
declared here, each once: the mesh (``--mesh``, ``--devices``, ``--tensor-depth``, shared with
``scripts/generate.py``), ``--set``, the multi-process launch and the listings. A parse error is
one line naming the flag and a valid value (:class:`ConfigError`), never a usage dump.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from colossal_jax.checks import preflight
from colossal_jax.cli.launch import DEFAULT_CPU_DEVICES, DEFAULT_PEER_TIMEOUT, PEER_LOST_EXIT
from colossal_jax.config import ConfigError, OptimConfig, ParallelConfig, TrainConfig, suggest
from colossal_jax.config.flags import ConfigFlag, flags_of
from colossal_jax.config.mesh_spec import list_presets

MESH_MODES = ("tensor_mode", "seq_mode")
"""The ParallelConfig flags declared beside ``--mesh`` (they decide how ``tensor=N`` and a
``seq`` axis are read), in both scripts."""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults in the help, except where the help itself says where the default comes from."""

    def _get_help_string(self, action):
        if action.default is None and "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    def parse_known_args(self, args=None, namespace=None):
        """argparse's, with ``given``: the dests of the flags the command line names (a flag
        given its default value is given; :func:`colossal_jax.cli.configure.config_from_args`
        refuses a ``--set`` that contradicts one)."""
        args = sys.argv[1:] if args is None else list(args)
        parsed, extras = super().parse_known_args(args, namespace)
        by_option = {s: a.dest for a in self._actions for s in a.option_strings}
        words = args[: args.index("--")] if "--" in args else args
        parsed.given = frozenset(
            by_option[w.split("=", 1)[0]] for w in words if w.split("=", 1)[0] in by_option
        )
        return parsed, extras

    def error(self, message: str):  # one line, no usage dump, a valid alternative
        raise ConfigError(self._explain(message))

    def _explain(self, message: str) -> str:
        flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        if message.startswith("unrecognized arguments: "):
            words = message.split(": ", 1)[1].split()
            unknown = [w.split("=", 1)[0] for w in words if w.startswith("-")]
            if not unknown:
                return (
                    f"unexpected argument {words[0]!r}: values follow a flag, e.g. --steps 100 "
                    "(see --help)"
                )
            hint = suggest(unknown[0], flags, "; ") or "; see --help for the flags"
            return f"unrecognized argument {unknown[0]}{hint}"
        flag = message.split(":", 1)[0].removeprefix("argument ").split("/")[-1].strip()
        if flag in flags:
            action = next(a for a in self._actions if flag in a.option_strings)
            example = getattr(action, "example", None)
            if example is None:
                example = action.default
            if example is not None and not isinstance(example, bool | list):
                return f"{message}; e.g. {flag} {example}"
        return message


def integer(text: str) -> int:
    """argparse type: an integer, also written 1e3 or 1_000."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def number(text: str) -> float:
    """argparse type: a float."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def on_off(text: str) -> bool:
    """argparse type: ``on`` or ``off``."""
    value = text.strip().lower()
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"{text!r} is not on or off")
    return value == "on"


TYPES = {int: integer, float: number, str: None, bool: on_off}
"""The argparse type of a flag by its field's type."""


def _add(group: Any, option: str, *, example: Any = None, **kwargs: Any) -> argparse.Action:
    """``group.add_argument`` that records the ``example`` value errors offer (None: the flag's
    default, if it shows one)."""
    action = group.add_argument(option, **kwargs)
    action.example = example
    return action


def add_config_flag(group: Any, f: ConfigFlag) -> argparse.Action:
    """The flag of one config field (:func:`colossal_jax.config.flags.flags_of`): ``on``/``off``
    for a bool; None by default where the value then comes from the family or the mesh."""
    if f.flag.default_from is not None:
        default = None
    elif f.kind is bool:
        default = "on" if f.default else "off"
    else:
        default = f.default
    metavar = "{on,off}" if f.kind is bool else f.flag.metavar
    return _add(
        group,
        f.option,
        type=TYPES[f.kind],
        default=default,
        metavar=metavar,
        help=f.help,
        example=f.example,
    )


def add_mesh_flags(group: Any, cpu_devices: int) -> None:
    """``--mesh``, ``--devices`` (simulating ``cpu_devices`` host devices by default on a CPU),
    ``--tensor-mode``, ``--tensor-depth`` and ``--seq-mode``: what
    :func:`colossal_jax.cli.configure.parallel_config` reads."""
    _add(
        group,
        "--mesh",
        default=None,
        example="data=8",
        help="axis sizes like data=2,tensor_row=2 (tensor=N is factored by --tensor-mode), "
        f"a preset name ({', '.join(list_presets())}) or a TOML path; scripts/train.py: auto "
        "(the planner chooses mesh, modes and memory knobs; docs/planner.md); default: data=all "
        "devices",
    )
    _add(
        group,
        "--devices",
        type=integer,
        default=None,
        example=str(DEFAULT_CPU_DEVICES),
        help=f"devices to use; on a CPU, simulate this many (default {cpu_devices} on CPU, "
        "all on GPU)",
    )
    tensor_mode, seq_mode = flags_of(ParallelConfig, only=MESH_MODES)
    add_config_flag(group, tensor_mode)
    _add(
        group,
        "--tensor-depth",
        type=integer,
        default=None,
        example="2",
        help="depth d of 2.5d when using --mesh tensor=N",
    )
    add_config_flag(group, seq_mode)


def add_launch_flags(group: Any) -> None:
    """The multi-process launch: ``--coordinator``, ``--num-processes``, ``--process-id``,
    ``--peer-timeout``, ``--no-cluster-detect``."""
    _add(
        group,
        "--coordinator",
        default=None,
        example="10.0.0.1:1234",
        help="multi-process: coordinator host:port",
    )
    _add(
        group,
        "--num-processes",
        type=integer,
        default=None,
        example="2",
        help="multi-process: how many processes (one per host), with --coordinator",
    )
    _add(
        group,
        "--process-id",
        type=integer,
        default=None,
        example="0",
        help="multi-process: this process's index, 0..N-1 (0 hosts the coordinator)",
    )
    _add(
        group,
        "--peer-timeout",
        type=number,
        default=DEFAULT_PEER_TIMEOUT,
        example="120",
        help="multi-process: seconds after which a process whose peer stopped answering "
        "(missed heartbeats, or a step that does not finish) exits with status "
        f"{PEER_LOST_EXIT} and one line naming the lost process",
    )
    group.add_argument(
        "--no-cluster-detect",
        action="store_true",
        help="without --coordinator, run one process even under srun, mpirun or a Kubernetes "
        f"Indexed Job (also: {preflight.NO_CLUSTER_DETECT_ENV}=1)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``scripts/train.py``: the flags of each config class in a group of its
    own, the mesh flags with :class:`ParallelConfig`'s, then the launch."""
    p = _Parser(
        prog="train.py",
        description="Train a model of the zoo (GPT, BERT, ViT: --list-models) with data, "
        "tensor (1D/2D/2.5D/3D), sequence and pipeline parallelism.",
        epilog="exit status: 0 done; 2 configuration error; 3 a loss or gradient norm was not "
        "finite (that step is not saved; fp16: see README); 4 lost contact with a peer process "
        "(--peer-timeout); 130/143 SIGINT/SIGTERM (a checkpoint "
        "at the step reached, then exit; re-run the same command to resume)",
        formatter_class=_HelpFormatter,
        allow_abbrev=False,  # --step is a mistake for --steps, not an abbreviation of it
    )
    _add(
        p,
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        example="model.n_layer=2",
        help="override any field: model.n_layer=2, optim.b2=0.99, steps=10, parallel.zero=1",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--list-models", action="store_true", help="print the models and their sizes, then exit"
    )
    p.add_argument("--list-meshes", action="store_true", help="print the mesh presets, then exit")
    for title, cls in (("training run", TrainConfig), ("optimizer", OptimConfig)):
        group = p.add_argument_group(title)
        for f in flags_of(cls):
            add_config_flag(group, f)
    mesh = p.add_argument_group("mesh and parallelism")
    add_mesh_flags(mesh, DEFAULT_CPU_DEVICES)
    for f in flags_of(ParallelConfig):
        if f.field not in MESH_MODES:
            add_config_flag(mesh, f)
    add_launch_flags(p.add_argument_group("multi-process"))
    return p
