"""Checks of the command line against the file system and the launch, before JAX is imported.

``cli.main`` checks the launch (:func:`check_processes`) and the flags' paths and data
(:func:`check_field`, through :func:`colossal_jax.checks.resolve.check_files`, which remembers the
answers for the run's resolve) right after parsing the flags, so an output path that cannot be
written, a data file that holds no usable tokens, or an inconsistent multi-process launch is
answered in well under a second, not after compiling (or inside ``jax.distributed.initialize``).
:func:`check_args` runs both for scripts that parse the same flags. Every
failure is a :class:`ConfigError` that names the bad value and a valid alternative. Nothing here
leaves a trace on disk: writability is probed with temporary entries that are removed at once.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from colossal_jax.config import ConfigError, optimizers

TMP = tempfile.gettempdir()


def check_args(args) -> None:
    """All checks of parsed ``scripts/train.py`` flags that need no devices."""
    check_processes(args.coordinator, args.num_processes, args.process_id)
    for name in CHECKS:
        check_field(name, getattr(args, name))


def check_field(name: str, value) -> None:
    """Check one TrainConfig field with a file-system meaning (no-op for other fields)."""
    if value is None or name not in CHECKS:
        return
    if not str(value).strip():
        flag = "--" + name.replace("_", "-")
        raise ConfigError(f"{flag} {value!r} is empty; name a path or omit {flag}")
    CHECKS[name](value)


def check_processes(coordinator: str | None, num: int | None, pid: int | None) -> None:
    """``--coordinator HOST:PORT --num-processes N --process-id I`` go together, 0 ≤ I < N."""
    example = "e.g. --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 0"
    if num is not None and num < 1:
        raise ConfigError(f"--num-processes {num} must be at least 1; {example}")
    if pid is not None and pid < 0:
        raise ConfigError(f"--process-id {pid} must be 0 or more; {example}")
    if num is not None and pid is not None and pid >= num:
        raise ConfigError(
            f"--process-id {pid} must be below --num-processes {num} (one of 0..{num - 1}); "
            f"e.g. --process-id {num - 1}"
        )
    if coordinator is None:
        if num is not None or pid is not None:
            flag = "--num-processes" if num is not None else "--process-id"
            raise ConfigError(
                f"{flag} {num if num is not None else pid} needs --coordinator HOST:PORT (the "
                f"address of process 0); {example}"
            )
        return
    host, sep, port = coordinator.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(
            f"--coordinator {coordinator!r} is not HOST:PORT with a port in 1..65535; "
            "e.g. --coordinator 10.0.0.1:1234"
        )
    if num is None or pid is None:
        missing = " and ".join(
            f for f, v in (("--num-processes", num), ("--process-id", pid)) if v is None
        )
        raise ConfigError(
            f"--coordinator {coordinator} needs {missing} as well; e.g. --coordinator "
            f"{coordinator} --num-processes 2 --process-id 0 (and --process-id 1 on the other "
            "host)"
        )


NO_CLUSTER_DETECT_ENV = "COLOSSAL_NO_CLUSTER_DETECT"
"""Set (to anything but ``""``/``0``) to skip cluster detection, like ``--no-cluster-detect``."""


def _count(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env.get(name, ""))
    except ValueError:
        return 0


def detect_cluster(
    env: Mapping[str, str],
    *,
    coordinator: str | None = None,
    opt_out: bool = False,
    kubernetes_installed: bool | None = None,
) -> str | None:
    """The cluster a run without ``--coordinator`` is launched in, as a line for the log, or None
    to run as one process. A pure function of the environment ``env`` (tests pass fake ones).

    A cluster is what JAX's own auto-detection (``jax.distributed.initialize()`` with no
    arguments, ``jax._src.clusters``) can fill in: SLURM (``SLURM_JOB_ID`` with
    ``SLURM_NTASKS`` > 1, i.e. under ``srun``), Open MPI (``OMPI_COMM_WORLD_SIZE`` > 1, under
    ``mpirun``) and a Kubernetes Indexed Job (``KUBERNETES_SERVICE_HOST`` with
    ``JOB_COMPLETION_INDEX``; JAX reads the rest from the Kubernetes API). An explicit
    ``coordinator`` wins, and ``opt_out`` (``--no-cluster-detect``) or
    ``COLOSSAL_NO_CLUSTER_DETECT=1`` turns detection off. One task (``SLURM_NTASKS=1``, a
    single-rank ``mpirun``) is not a cluster: the run stays one process, as without one.
    ``kubernetes_installed`` (default: whether the package imports) says whether JAX can query
    the Kubernetes API; without it an Indexed Job is a :class:`ConfigError` naming both ways on.

    Raises :class:`ConfigError` for a cluster that JAX could not complete (a SLURM allocation of
    several tasks outside ``srun``, an MPI world without its launcher's address)."""
    if coordinator is not None or opt_out or env.get(NO_CLUSTER_DETECT_ENV, "") not in ("", "0"):
        return None
    if "SLURM_JOB_ID" in env and (n := _count(env, "SLURM_NTASKS")) > 1:
        where = f"rank {env.get('SLURM_PROCID', '?')} of {n}"
        if "SLURM_STEP_NODELIST" not in env or "SLURM_PROCID" not in env:
            raise ConfigError(
                f"SLURM job {env['SLURM_JOB_ID']} has SLURM_NTASKS={n} but no job step "
                "(SLURM_STEP_NODELIST/SLURM_PROCID): start each task with srun, e.g. srun python "
                "scripts/train.py ..., or pass --no-cluster-detect to run one process"
            )
        return f"SLURM job {env['SLURM_JOB_ID']}, {where}"
    if (n := _count(env, "OMPI_COMM_WORLD_SIZE")) > 1:
        if "OMPI_MCA_orte_hnp_uri" not in env:
            raise ConfigError(
                f"Open MPI world of {n} ranks but no OMPI_MCA_orte_hnp_uri, from which JAX takes "
                "the coordinator's address: pass --coordinator HOST:PORT --num-processes "
                f"{n} --process-id $OMPI_COMM_WORLD_RANK, or --no-cluster-detect"
            )
        return f"Open MPI, rank {env.get('OMPI_COMM_WORLD_RANK', '?')} of {n}"
    if "KUBERNETES_SERVICE_HOST" in env and "JOB_COMPLETION_INDEX" in env:
        if kubernetes_installed is None:
            kubernetes_installed = importlib.util.find_spec("kubernetes") is not None
        if not kubernetes_installed:
            raise ConfigError(
                "Kubernetes Indexed Job detected (JOB_COMPLETION_INDEX="
                f"{env['JOB_COMPLETION_INDEX']}) but JAX needs the kubernetes package to find its "
                "peers: pip install 'jax[k8s]', or pass --coordinator "
                "JOB-0.SERVICE:PORT --num-processes N --process-id $JOB_COMPLETION_INDEX "
                "(see deploy/k8s-job.yaml)"
            )
        return f"Kubernetes Indexed Job, completion index {env['JOB_COMPLETION_INDEX']}"
    return None


def check_writable_dir(flag: str, value: str, example: str) -> None:
    """``value`` is a directory that exists and takes new files, or one that can be created."""
    path = Path(value)
    if path.exists():
        if not path.is_dir():
            raise ConfigError(
                f"{flag} {value} exists and is not a directory; name a new or existing "
                f"directory, e.g. {flag} {example}"
            )
        _probe(flag, value, path, example, make_dir=False)
    else:
        _probe(flag, value, _existing_ancestor(flag, value, example), example, make_dir=True)


def check_writable_file(flag: str, value: str, example: str, name: str = "metrics.jsonl") -> None:
    """``value`` is a file that can be appended to, or one that can be created (its folders
    too); a directory is refused with ``name`` inside it as the example."""
    path = Path(value)
    if path.is_dir():
        raise ConfigError(f"{flag} {value} is a directory; name a file, e.g. {flag} {path / name}")
    if path.exists():
        try:
            with path.open("a"):
                pass
        except OSError as e:
            raise ConfigError(
                f"{flag} {value} is not writable ({e.strerror}); e.g. {flag} {example}"
            ) from None
        return
    parent = path.parent
    if parent.is_dir():
        _probe(flag, value, parent, example, make_dir=False)
    else:
        _probe(flag, value, _existing_ancestor(flag, value, example), example, make_dir=True)


def _existing_ancestor(flag: str, value: str, example: str) -> Path:
    """The deepest existing ancestor of ``value``, which must be a directory."""
    p = Path(value).absolute().parent
    while not p.exists():
        p = p.parent
    if not p.is_dir():
        raise ConfigError(
            f"{flag} {value} cannot be created: {p} is a file, not a directory; e.g. "
            f"{flag} {example}"
        )
    return p


def _probe(flag: str, value: str, where: Path, example: str, *, make_dir: bool) -> None:
    """Create (and remove) a temporary directory or file in ``where``."""
    try:
        if make_dir:
            os.rmdir(tempfile.mkdtemp(prefix=".colossal-probe-", dir=where))
        else:
            with tempfile.TemporaryFile(prefix=".colossal-probe-", dir=where):
                pass
    except OSError as e:
        raise ConfigError(
            f"{flag} {value} is not writable: nothing can be created in {where} "
            f"({e.strerror}); e.g. {flag} {example}"
        ) from None


def check_tensorboard_dir(value: str) -> None:
    if importlib.util.find_spec("tensorboardX") is None:
        raise ConfigError(
            f"--tensorboard-dir {value} needs the tensorboardX package; pip install tensorboardX, "
            "or omit --tensorboard-dir"
        )
    check_writable_dir("--tensorboard-dir", value, f"{TMP}/tb")


def check_data(value: str) -> None:
    """A data file must hold usable tokens (see ``data.load_corpus``); builtins need no check."""
    from colossal_jax.config.choices import IMAGE_DATA

    if value in ("stdlib", "synthetic", *IMAGE_DATA):
        return
    from colossal_jax.data.corpus import load_corpus

    load_corpus(value)


def architecture(name: str, overrides: dict) -> dict:
    """The model config ``name`` with ``overrides`` (``model_config``) as a dict of fields."""
    import dataclasses

    from colossal_jax.config.families import model_config

    return dataclasses.asdict(model_config(name, **overrides))


def _sized_for_data(overrides: dict, data: str | None, model: str) -> dict:
    """``overrides`` with the vocabulary ``data`` gives the model ``model`` where they do not
    set one (as ``checks.validate.size_model`` sizes the model)."""
    from colossal_jax.config.families import task_of
    from colossal_jax.data.tasks import data_vocab, model_vocab

    if "vocab_size" in overrides or data is None:
        return dict(overrides)
    task = task_of(model)
    vocab = model_vocab(task, data_vocab(task, data))
    return dict(overrides) if vocab is None else {**overrides, "vocab_size": vocab}


def latest_checkpoint_meta(checkpoint_dir: str | None) -> tuple[int, dict] | None:
    """``(step, metadata)`` of the latest checkpoint in ``checkpoint_dir`` whose JSON metadata
    (what ``train`` writes next to the arrays) can be read and records its step, or None if
    there is none. A newer step whose metadata is missing, unreadable or not this step's is
    damaged: the restore moves it aside (or a reader skips it) and uses the one this returns."""
    import json

    if checkpoint_dir is None:
        return None
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return None
    steps = sorted(
        ((int(p.name), p) for p in root.iterdir() if p.name.isdigit() and p.is_dir()),
        reverse=True,
    )
    for step, path in steps:
        try:
            meta = json.loads((path / "meta" / "metadata").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("step") == step:
            return step, meta
    return None


def check_resume(cfg, architecture=architecture, model=None) -> None:
    """A ``--checkpoint-dir`` holding a run must be resumed with arrays of the same shapes: the
    same model (name, ``--set model.*``, and the vocabulary of ``--data``), the same seed (the
    data order), and an optimizer whose state has the same structure (name, clipping on or off,
    SGD momentum on or off, fp16 loss scaling or not). Read from the latest checkpoint's JSON
    metadata, before JAX; the mesh, ZeRO stage, pipeline and ``--device-batch`` may differ.
    ``architecture(name, overrides)`` is a model config as a dict. The plan's
    resolve (:func:`colossal_jax.checks.resolve.resolve`) calls this for the command line and
    the Python API alike. ``model``: the run's model config when the caller has resolved it;
    otherwise it is sized here."""
    found = latest_checkpoint_meta(cfg.checkpoint_dir)
    if found is None:
        return
    step, meta = found
    saved_run = _saved_run(meta, architecture)
    if saved_run is None:
        return  # not ours to judge; the restore reports it
    saved, optim, before = saved_run
    if model is not None:
        import dataclasses

        now = dataclasses.asdict(model)
    else:
        from colossal_jax.hf.checks import model_overrides

        try:
            sized = _sized_for_data(model_overrides(cfg), cfg.data, cfg.model)
            now = architecture(cfg.model, sized)
        except (ValueError, TypeError, KeyError):
            return  # a bad model override or data file; building the model reports it
    where = f"--checkpoint-dir {cfg.checkpoint_dir} holds step {step} of a run with"
    _check_same_model(cfg, saved, before, now, where)
    _check_same_data_order(cfg, saved, where)
    _check_same_optimizer_state(cfg, optim, saved.get("precision"), where)


def _check_same_data_order(cfg, saved: dict, where: str) -> None:
    """The batches a resumed run reads are the ones the saved run would have read next: the
    same ``--seed`` and the same ``--data`` (the same name, or a path to the same file), since
    batch ``k`` is a function of both (:class:`colossal_jax.data.batch.CorpusBatches`)."""
    if saved.get("seed", cfg.seed) != cfg.seed:
        raise ConfigError(
            f"{where} --seed {saved['seed']}, not {cfg.seed} (the data order would change); use "
            f"--seed {saved['seed']} to resume it, {_OTHER_DIR}"
        )
    old = saved.get("data", cfg.data)
    if old != cfg.data and not _same_file(old, cfg.data):
        raise ConfigError(
            f"{where} --data {old}, not {cfg.data} (the data order would change); use "
            f"--data {old} to resume it, {_OTHER_DIR}"
        )


def _same_file(a: str, b: str) -> bool:
    """Whether the ``--data`` paths ``a`` and ``b`` name one existing file."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


_OTHER_DIR = "or another --checkpoint-dir"
"""How every refusal to resume ends: the alternative of a fresh run."""


def _saved_run(meta: dict, architecture) -> tuple[dict, dict, dict] | None:
    """``(the saved run's config, its optimizer config, its model config as a dict)`` from a
    checkpoint's metadata, or None when the metadata is not a run's."""
    try:
        saved = meta["config"]
        optim = saved["optim"]
        old_data = saved.get("data")
        if isinstance(meta.get("architecture"), dict):
            return saved, optim, meta["architecture"]
        # written before the resolved model was saved: size it for the saved data
        try:
            sized = _sized_for_data(saved.get("model_overrides", {}), old_data, saved["model"])
        except ConfigError:  # the saved data file is gone or changed
            sized = saved.get("model_overrides", {})
        return saved, optim, architecture(saved["model"], sized)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _check_same_model(cfg, saved: dict, before: dict, now: dict, where: str) -> None:
    """The model to resume is the saved one: its name, every field (``--set model.*``) and the
    vocabulary of ``--data``."""
    if saved["model"] != cfg.model:
        raise ConfigError(
            f"{where} --model {saved['model']}, not {cfg.model}; use --model "
            f"{saved['model']} to resume it, {_OTHER_DIR}"
        )
    changed = [k for k in now if k in before and now[k] != before[k]]
    if "vocab_size" in changed and "vocab_size" not in cfg.model_overrides:
        old, new, old_data = before["vocab_size"], now["vocab_size"], saved.get("data")
        raise ConfigError(
            f"{where} a vocabulary of {old} tokens (--data {old_data}), not {new} (--data "
            f"{cfg.data}); use --data {old_data} to resume it, {_OTHER_DIR}"
        )
    if changed:
        was = " ".join(f"model.{k}={before.get(k)}" for k in changed)
        given = ", ".join(f"model.{k}={now[k]}" for k in changed)
        raise ConfigError(
            f"{where} {was}, not {given}; use --set {was.replace(' ', ' --set ')} "
            f"to resume it, {_OTHER_DIR}"
        )


def _check_same_optimizer_state(cfg, optim: dict, precision: str | None, where: str) -> None:
    """The optimizer state to resume has the saved structure: the optimizer's name, clipping on
    or off, SGD momentum on or off, fp16 loss scaling or not (``optim``, ``precision``: the
    saved run's)."""
    name = optim.get("name")
    saved_optimizer = optimizers.TABLE.find(name)  # b1 shapes a momentum-from-b1 state
    momentum = saved_optimizer is not None and saved_optimizer.momentum_from_b1
    for flag, old, new, same in (
        ("--optimizer", name, cfg.optim.name, lambda a, b: a == b),
        (
            "--clip-norm",
            optim.get("clip_norm"),
            cfg.optim.clip_norm,
            lambda a, b: (a > 0) == (b > 0),
        ),
        (
            "--set optim.b1=",
            optim.get("b1") if momentum else None,
            cfg.optim.b1,
            lambda a, b: (a > 0) == (b > 0),
        ),
        (
            "--precision",
            precision,
            cfg.precision,
            lambda a, b: (a == "fp16") == (b == "fp16"),
        ),
    ):
        if old is not None and not same(old, new):
            sep = "" if flag.endswith("=") else " "
            what = "its loss scale" if flag == "--precision" else "its optimizer state"
            raise ConfigError(
                f"{where} {flag}{sep}{old}, not {new} ({what} would not fit); use "
                f"{flag}{sep}{old} to resume it, {_OTHER_DIR}"
            )


CHECKS = {
    "metrics_file": lambda v: check_writable_file("--metrics-file", v, f"{TMP}/metrics.jsonl"),
    "tensorboard_dir": check_tensorboard_dir,
    "checkpoint_dir": lambda v: check_writable_dir("--checkpoint-dir", v, f"{TMP}/ckpt"),
    "profile_dir": lambda v: check_writable_dir("--profile-dir", v, f"{TMP}/profile"),
    "data": check_data,
}
"""TrainConfig fields (= flag names) checked here."""
