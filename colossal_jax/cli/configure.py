"""Parsed flags → the run's :class:`TrainConfig` (:func:`config_from_args`), and the mesh flags
→ :class:`ParallelConfig` (:func:`parallel_config`, which ``scripts/generate.py`` reads its mesh
with too).

A flag sets the field it was generated from (:func:`colossal_jax.config.flags.values_of`); a
flag whose default comes from the model family and was not given takes the family's value
(``colossal_jax_models.registry.train_defaults``), the family's other defaults apply, and then
``--set`` overrides any field. The result is not validated here: resolving it
(:func:`colossal_jax.checks.resolve.resolve`) runs every rule, once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from colossal_jax.config import (
    ConfigError,
    OptimConfig,
    ParallelConfig,
    TrainConfig,
    coerce,
    field_types,
    parse_mesh,
    suggest,
)
from colossal_jax.config.choices import AXES
from colossal_jax.config.families import MODELS, family_of, train_defaults
from colossal_jax.config.flags import ConfigFlag, flags_of, values_of
from colossal_jax.config.mesh_spec import PRESET_MODES, preset_train

PROFILE_STEPS = "3:5"
"""The steps traced with ``--profile-dir`` and no ``--profile-steps``."""

FAMILY_FLAGS = {
    prefix + f.field: f.dest
    for cls, prefix in ((TrainConfig, ""), (OptimConfig, "optim."))
    for f in flags_of(cls)
    if f.flag.default_from == "family"
}
"""TrainConfig field (``optim.<field>``) -> the flag's dest, for the flags whose default comes
from the model's family (``colossal_jax_models.registry.train_defaults``) when the command line
does not give them; the library-wide default otherwise."""


def parallel_config(
    mesh: str | None, n_devices: int | None, tensor_depth: int | None = None, **given: Any
) -> ParallelConfig:
    """The mesh of ``--mesh`` (axis sizes, ``tensor=N`` factored by the tensor mode, a preset or
    a TOML file; :func:`colossal_jax.config.parse_mesh`) on ``n_devices``, with the
    :class:`ParallelConfig` fields ``given`` as flags (None: not given). A flag wins over a
    preset's mode; a ``seq`` axis without a mode runs ``ring``. Not validated."""
    sizes = parse_mesh(
        mesh,
        n_devices,
        tensor_mode=given.get("tensor_mode") or "none",
        tensor_depth=tensor_depth,
    )
    modes = {k: sizes.pop(k) for k in PRESET_MODES if k in sizes}
    # a flag given wins over the preset; a flag whose parser default is the field's own (not
    # None) and that still holds it was not given, so the preset's value stays
    plain = {f.field: f.default for f in flags_of(ParallelConfig) if f.flag.default_from is None}
    modes.update(
        {
            k: v
            for k, v in given.items()
            if v is not None and not (k in modes and k in plain and v == plain[k])
        }
    )
    if "seq_mode" not in modes and sizes.get("seq", 1) > 1:
        modes["seq_mode"] = "ring"
    return ParallelConfig(**sizes, **modes)


def parallel_flags_given(args) -> list[str]:
    """The :class:`ParallelConfig` fields whose flags were given a value other than the
    default (``--mesh auto`` refuses them)."""
    defaults = {f.name: f.default for f in dataclasses.fields(ParallelConfig)}
    out = []
    for f in flags_of(ParallelConfig):
        value = getattr(args, f.dest)
        if value is not None and value != defaults[f.field]:
            out.append(f.field)
    return out


def config_from_args(args, n_devices: int) -> TrainConfig:
    """The run of the parsed ``scripts/train.py`` flags on ``n_devices`` devices (the mesh a
    ``--mesh`` leaves open is sized for them); an unknown ``--model`` or ``--set`` item is a
    :class:`ConfigError` here, every other rule runs when the run is resolved."""
    given = {f.field: getattr(args, f.dest) for f in flags_of(ParallelConfig)}
    parallel = parallel_config(args.mesh, n_devices, args.tensor_depth, **given)
    _check_model_name(args.model)
    family = train_defaults(args.model)
    fields = values_of(TrainConfig, args, family)
    fields["profile_steps"] = args.profile_steps or (PROFILE_STEPS if args.profile_dir else None)
    optim = OptimConfig(**values_of(OptimConfig, args, family, prefix="optim."))
    cfg = TrainConfig(**fields, optim=optim, parallel=parallel)
    cfg = dataclasses.replace(cfg, **_other_family_defaults(family))
    train = {k: v for k, v in preset_train(args.mesh).items() if fields[k] == _default(k)}
    cfg = dataclasses.replace(cfg, **train)  # a preset's [train] where no flag was given
    given = getattr(args, "given", frozenset())
    flagged = {
        (group, f.field): f
        for group, cls in GROUPS.items()
        for f in flags_of(cls)
        if f.dest in given
    }
    mesh = args.mesh if "mesh" in given else None
    cfg = _apply_sets(cfg, args.set, flagged, mesh=mesh)
    _check_model_name(cfg.model)
    return cfg


def _default(name: str) -> Any:
    """The default of the :class:`TrainConfig` field ``name``."""
    return {f.name: f.default for f in dataclasses.fields(TrainConfig)}[name]


def _other_family_defaults(family: dict[str, Any]) -> dict[str, Any]:
    """The family's training defaults that no flag carries (e.g. ``eval_batches``)."""
    return {k: v for k, v in family.items() if k not in FAMILY_FLAGS and not k.startswith("optim.")}


GROUPS = {"train": TrainConfig, "optim": OptimConfig, "parallel": ParallelConfig}
"""The config classes whose fields ``--set`` reaches as ``<group>.<field>`` (``train.`` may be
left out)."""


def _apply_sets(
    cfg: TrainConfig,
    sets: list[str],
    flagged: dict[tuple[str, str], ConfigFlag] | None = None,
    *,
    mesh: str | None = None,
) -> TrainConfig:
    """``--set KEY=VALUE`` items in order: ``model.<field>`` into ``model_overrides``,
    ``optim.<field>``, ``parallel.<field>``, or a plain TrainConfig field (``train.<field>``
    too). ``flagged``: ``(group, field) -> flag`` of the flags the command line gave; a ``--set``
    of another value for one of them is a contradiction (a ConfigError naming both); so is a
    ``parallel.<axis>`` of another size than the ``--mesh`` given (``mesh``, None: not given)."""
    groups = {"optim": OptimConfig, "parallel": ParallelConfig}
    flagged = flagged or {}
    model_over = dict(cfg.model_overrides)
    for item in sets:
        if "=" not in item:
            raise ConfigError(f"--set {item!r} is not KEY=VALUE (e.g. --set model.n_layer=2)")
        key, value = (s.strip() for s in item.split("=", 1))
        head, _, rest = key.partition(".")
        if head == "model" and rest:
            _check_model_name(cfg.model)
            model_types = field_types(family_of(cfg.model).config_class)
            if rest not in model_types:
                raise ConfigError(
                    f"--set {key}: model has no field {rest!r}; "
                    f"{suggest(rest, model_types, suffix=' ')}fields: {', '.join(model_types)}"
                )
            example = getattr(MODELS[cfg.model], rest)
            model_over[rest] = _coerce(key, value, model_types[rest], example)
        elif head in groups and rest:
            types_ = field_types(groups[head])
            if rest not in types_:
                raise ConfigError(
                    f"--set {key}: {head} has no field {rest!r}; "
                    f"{suggest(rest, types_, suffix=' ')}fields: {', '.join(types_)}"
                )
            now = getattr(getattr(cfg, head), rest)
            new = _coerce(key, value, types_[rest], now)
            _check_agrees(flagged.get((head, rest)), now, key, value, new)
            if head == "parallel" and rest in AXES and mesh is not None and new != now:
                raise ConfigError(
                    f"--mesh {mesh} (so {rest}={now}) and --set {key}={value} contradict each "
                    f"other; give the axis sizes in one place (e.g. --mesh {rest}={value})"
                )
            sub = dataclasses.replace(getattr(cfg, head), **{rest: new})
            cfg = dataclasses.replace(cfg, **{head: sub})
        else:
            name = rest if head == "train" and rest else key
            types_ = field_types(TrainConfig)
            plain = [t for t in types_ if t not in ("optim", "parallel", "model_overrides")]
            if name not in plain:
                near = suggest(key, plain, suffix=" ")
                raise ConfigError(
                    f"--set {key}: unknown field; {near}use model.*, "
                    f"optim.*, parallel.* or one of {', '.join(plain)}"
                )
            now = getattr(cfg, name)
            new = _coerce(key, value, types_[name], now)
            _check_agrees(flagged.get(("train", name)), now, key, value, new)
            cfg = dataclasses.replace(cfg, **{name: new})
    return dataclasses.replace(cfg, model_overrides=model_over)


def model_overrides(model: str, sets: list[str]) -> dict[str, Any]:
    """``--set [model.]FIELD=VALUE`` items of the planner's scripts (``scripts/plan.py``,
    ``scripts/sweep_meshes.py``), which reach the model's fields only: ``{FIELD: value}``, each
    field checked and its value coerced with the messages ``train.py``'s ``--set model.FIELD``
    gives (a ConfigError naming the item and a valid one)."""
    _check_model_name(model)
    types = field_types(family_of(model).config_class)
    out: dict[str, Any] = {}
    for item in sets:
        key, sep, value = (s.strip() for s in item.partition("="))
        name = key.removeprefix("model.")
        if not sep or not name or not value:
            raise ConfigError(f"--set {item!r} is not FIELD=VALUE (e.g. --set n_layer=4)")
        if name not in types:
            raise ConfigError(
                f"--set {key}: model has no field {name!r}; "
                f"{suggest(name, types, suffix=' ')}fields: {', '.join(types)}"
            )
        out[name] = _coerce(key, value, types[name], getattr(MODELS[model], name))
    return out


def _check_agrees(flag: ConfigFlag | None, now: Any, key: str, value: str, new: Any) -> None:
    """A ``--set key=value`` (read as ``new``) of a field whose ``flag`` the command line gave
    (None: not given) must not change the flag's value ``now``."""
    if flag is None or new == now:
        return
    shown = ("on" if now else "off") if isinstance(now, bool) else now
    raise ConfigError(
        f"{flag.option} {shown} and --set {key}={value} contradict each other; give one of "
        f"them (e.g. {flag.option} {value} alone)"
    )


def _coerce(key: str, value: str, annotation, example) -> object:
    """``coerce`` whose error names the ``--set`` item and a valid one (``--set model.n_layer=abc:
    'abc' is not a valid int; e.g. --set model.n_layer=12``)."""
    try:
        return coerce(value, annotation)
    except ConfigError as e:
        hint = f"; e.g. --set {key}={example}" if example is not None else ""
        raise ConfigError(f"--set {key}={value}: {e}{hint}") from None


def _check_model_name(name: str) -> None:
    if name not in MODELS:
        raise ConfigError(
            f"--model {name!r} is unknown; {suggest(name, MODELS, suffix=' ')}"
            f"choose one of {', '.join(MODELS)}"
        )
