"""Checkpoints with orbax: complete or ignored, resumable onto the same or another mesh.

A checkpoint holds the parameters, the optimizer state (which carries the step count of the
schedule), and JSON metadata: the step (which is also the data position, since batches are a pure
function of ``(seed, step)``), the seed, and the configuration that wrote it. Orbax writes each
step into a temporary directory and renames it when every array is on disk, so a run killed at
any instant leaves either a complete checkpoint or one that :class:`Checkpointer` never sees
(the temporary directories of such saves, ``N.orbax-checkpoint-tmp-*``, are removed when the next
run opens the directory). Saves are asynchronous: training continues while arrays are written.

A checkpoint damaged after it was written (a file truncated or removed, unreadable metadata)
fails to restore; :meth:`Checkpointer.restore_latest` then takes the one before it, moves the
damaged one aside to ``N.corrupt`` (where orbax no longer counts it) and says so in one line.
A checkpoint is called damaged only when an older one restores: if none does, the error of the
latest is raised, since a mismatched model fails every step alike.
"""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from colossal_jax.config import ConfigError

CORRUPT_SUFFIX = ".corrupt"


class Checkpointer:
    """Save every ``every`` steps (and on demand), keeping the ``max_to_keep`` latest; restore
    the latest complete step. ``read_only``: restore only (no clean-up of the directory, which a
    running training may be writing)."""

    def __init__(
        self,
        directory: str | Path,
        every: int,
        *,
        max_to_keep: int = 3,
        read_only: bool = False,
    ):
        self.directory = Path(directory).resolve()
        self.every = every
        self.read_only = read_only
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            save_interval_steps=1,
            enable_async_checkpointing=True,
            create=not read_only,
            read_only=read_only,
            cleanup_tmp_directories=not read_only,
        )
        self.manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "meta")
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def restore_latest(
        self, abstract_state: Any, warn: Callable[[str], None]
    ) -> tuple[Any, dict, int] | None:
        """``(state, meta, step)`` of the latest checkpoint that restores, or None if there is
        none. Each newer one that fails is reported through ``warn`` (one line) and moved aside;
        if none restores, a :class:`ConfigError` names the latest and why it failed."""
        steps = sorted(self.manager.all_steps(), reverse=True)
        failed: list[tuple[int, str]] = []
        for step in steps:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # orbax's own noise about the failed read
                    state, meta = self.restore(step, abstract_state)
            except ConfigError:
                raise  # the checkpoint is whole but belongs to another run: not damage
            except Exception as e:  # noqa: BLE001 - tensorstore raises plain Exception
                failed.append((step, _reason(e)))
                _quiet_closed_loop_callbacks()
                continue
            for bad, why in failed:
                where = self._set_aside(bad)
                moved = f"; moved to {where.name}" if where is not None else ""
                warn(
                    f"warning: checkpoint step {bad} in {self.directory} is incomplete or "
                    f"corrupt ({why}{moved}); using step {step}"
                )
            if failed:
                self.manager.reload()
            return state, meta, step
        if not failed:
            return None
        step, why = failed[0]
        older = ", ".join(str(s) for s, _ in failed[1:])
        raise ConfigError(
            f"no checkpoint in {self.directory} can be restored: step {step} fails ({why})"
            + (f", and so do steps {older}" if older else "")
            + "; move the directory aside or use another --checkpoint-dir"
        )

    def _set_aside(self, step: int) -> Path | None:
        """Rename the directory of ``step`` to ``N.corrupt`` (process 0; not when read-only)."""
        if self.read_only or jax.process_index() != 0:
            return None
        src = self.directory / str(step)
        dst = self.directory / f"{step}{CORRUPT_SUFFIX}"
        if not src.is_dir():
            return None
        if dst.exists():
            shutil.rmtree(dst)
        src.rename(dst)
        return dst

    def wait(self) -> int | None:
        """Wait for pending writes; the latest step on disk (None if none)."""
        self.manager.wait_until_finished()
        return self.manager.latest_step()

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        """Restore ``step`` into the shardings of ``abstract_state`` (a tree of
        ``jax.ShapeDtypeStruct`` with ``sharding`` set), which may differ from those saved.

        A checkpoint whose arrays do not fit ``abstract_state`` (another model shape, vocabulary,
        optimizer or precision) is a one-line :class:`ConfigError` naming the first differing
        array, its saved and expected shape, checked against the stored metadata before any
        array is read; a mismatch the check misses is reported the same way when orbax refuses
        it."""
        saved = self.saved_shapes(step)
        if saved is not None:
            check_fits(saved, leaf_shapes(abstract_state), self.directory / str(step))
        try:
            restored = self.manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state),
                    meta=ocp.args.JsonRestore(),
                ),
            )
        except (ValueError, TypeError, KeyError) as e:
            where = self.directory / str(step)
            if saved is not None:  # names the leaf if the metadata shows it after all
                check_fits(saved, leaf_shapes(abstract_state), where, strict=True)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise ConfigError(
                f"the checkpoint {where} does not fit this run ({first}); resume it with the "
                "model, data, optimizer and precision that wrote it, or use another "
                "--checkpoint-dir"
            ) from None
        return restored["state"], dict(restored["meta"])

    def saved_shapes(self, step: int) -> dict[str, tuple[int, ...]] | None:
        """``dotted path -> shape`` of the arrays saved at ``step``, from orbax's metadata (no
        array is read); None if the metadata cannot be read."""
        try:
            tree = ocp.StandardCheckpointHandler().metadata(self.directory / str(step) / "state")
            return leaf_shapes(tree)
        except Exception:  # noqa: BLE001 - an unreadable layout is left to the restore itself
            return None

    def due(self, step: int) -> bool:
        """Whether ``step`` is one of the every-``every`` steps that are saved."""
        return step % self.every == 0

    def save(self, step: int, state: Any, meta: dict, *, force: bool = False) -> bool:
        """Start an asynchronous save of ``step`` if it is due (or ``force``)."""
        if not force and not self.due(step):
            return False
        if self.manager.latest_step() == step:
            return False
        return self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )

    def close(self) -> None:
        """Wait for pending writes and release the manager."""
        self.manager.wait_until_finished()
        self.manager.close()


def restore_params(directory: str | Path, target: Any, step: int | None = None) -> tuple[Any, dict]:
    """Only the parameters of checkpoint ``step`` (default: the latest) in ``directory``, not
    the optimizer state, and its JSON metadata: for inference and export, which need a third of
    what a resume reads (AdamW). ``target`` is the parameter tree of ``jax.ShapeDtypeStruct``:
    with ``sharding`` set the arrays are placed there (any mesh), without it they come back as
    host NumPy arrays (no device is used)."""
    import numpy as np

    root = Path(directory).resolve()
    if step is None:
        steps = sorted(int(p.name) for p in root.glob("*") if p.name.isdigit() and p.is_dir())
        if not steps:
            raise ConfigError(f"no checkpoint in {root}; train with --checkpoint-dir {root}")
        step = steps[-1]
    where = root / str(step)

    def args(leaf):
        if getattr(leaf, "sharding", None) is None:
            return ocp.RestoreArgs(restore_type=np.ndarray, dtype=leaf.dtype)
        return ocp.ArrayRestoreArgs(
            sharding=leaf.sharding, global_shape=leaf.shape, dtype=leaf.dtype
        )

    item = {"params": target}
    saved = ocp.StandardCheckpointHandler().metadata(where / "state")
    saved_tree = getattr(saved, "tree", saved)
    if isinstance(saved_tree, dict) and "params" in saved_tree:
        check_fits(leaf_shapes(saved_tree["params"]), leaf_shapes(target), where)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            restored = ocp.PyTreeCheckpointer().restore(
                where / "state",
                args=ocp.args.PyTreeRestore(
                    item=item, restore_args=jax.tree.map(args, item), partial_restore=True
                ),
            )
        meta = json.loads((where / "meta" / "metadata").read_text())
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"the checkpoint {where} cannot be read ({_reason(e)})") from None
    return restored["params"], meta


def _quiet_closed_loop_callbacks() -> None:
    """After a failed restore, tensorstore still completes the reads orbax abandoned, and their
    callbacks find orbax's event loop closed: a ``RuntimeError('Event loop is closed')`` per
    read, printed by ``sys.unraisablehook`` as a traceback. Drop those (the failure is already
    reported in one line); pass anything else to the hook that was there."""
    previous = sys.unraisablehook
    if getattr(previous, "_colossal_quiet", False):
        return

    def hook(unraisable: Any) -> None:
        e = unraisable.exc_value
        if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
            return
        previous(unraisable)

    hook._colossal_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def _reason(e: BaseException) -> str:
    """The first line of ``e``, short enough for a one-line warning."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = text if len(text) <= 120 else text[:117] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def abstract_like(tree: Any, shardings: Any) -> Any:
    """``ShapeDtypeStruct``s of ``tree`` placed in ``shardings`` (a restore target).

    ``shardings`` may be a prefix of ``tree`` (one sharding for a whole subtree)."""

    def place(sharding, subtree):
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), subtree
        )

    return jax.tree.map(
        place, shardings, tree, is_leaf=lambda s: isinstance(s, jax.sharding.Sharding)
    )


def _key(k: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def leaf_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """``dotted path -> shape`` of every array leaf of ``tree`` (arrays, ``ShapeDtypeStruct``s or
    orbax ``ArrayMetadata``), in orbax's naming: named-tuple fields by name, sequences by
    index, so a restore target and a checkpoint's metadata compare."""
    out: dict[str, tuple[int, ...]] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        shape = getattr(leaf, "shape", None)
        if shape is None:
            continue
        out[".".join(_key(k) for k in path)] = tuple(int(n) for n in shape)
    return out


def check_fits(
    saved: dict[str, tuple[int, ...]],
    expected: dict[str, tuple[int, ...]],
    where: Any,
    *,
    strict: bool = False,
) -> None:
    """Raise a one-line :class:`ConfigError` naming the first array whose saved shape differs
    from the expected one, or that only one side has. Unless ``strict``, trees that share no
    path at all are not judged (a naming this function does not know, not a mismatch)."""
    if not strict and not saved.keys() & expected.keys():
        return
    fix = (
        "resume it with the model, data, optimizer and precision that wrote it, or use another "
        "--checkpoint-dir"
    )
    for path, shape in expected.items():
        if path not in saved:
            raise ConfigError(
                f"the checkpoint {where} has no array {path} (this run expects shape "
                f"{shape}); {fix}"
            )
        if saved[path] != shape:
            raise ConfigError(
                f"the checkpoint {where} holds {path} with shape {saved[path]}, but this run "
                f"expects {shape}; {fix}"
            )
    for path, shape in saved.items():
        if path not in expected:
            raise ConfigError(
                f"the checkpoint {where} holds an array {path} {shape} that this run does not "
                f"have; {fix}"
            )
