"""Checkpoints with orbax: complete or ignored, resumable onto the same or another mesh.

A checkpoint holds the parameters, the optimizer state (which carries the step count of the
schedule), and JSON metadata: the step (which is also the data position, since batches are a pure
function of ``(seed, step)``), the seed, and the configuration that wrote it. Orbax writes each
step into a temporary directory and renames it when every array is on disk, so a run killed at
any instant leaves either a complete checkpoint or one that :class:`Checkpointer` never sees
(the temporary directories of such saves, ``N.orbax-checkpoint-tmp-*``, are removed when the next
run opens the directory). Saves are asynchronous: training continues while arrays are written.

A checkpoint damaged after it was written (a file truncated, emptied, garbled or removed, a
folder missing, a numbered folder with no checkpoint in it) fails to restore with
:class:`~colossal_jax.training.checkpoint_faults.Damaged`; :meth:`Checkpointer.restore_latest`
then moves it aside to ``N.corrupt`` (where orbax no longer counts it), says so in one line and
takes the one before it (none left: the run starts at step 0). A whole checkpoint of another
run (other shapes, optimizer or precision) is not damage: a one-line ``ConfigError``, nothing
moved. A writing run holds the directory's lock (:mod:`colossal_jax.runtime.dirlock`); a save
that cannot be written (disk full, permission) ends in one line
(:class:`~colossal_jax.training.checkpoint_faults.WriteFailed`) and touches no checkpoint
already committed. See docs/checkpoints.md.
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
from colossal_jax.runtime.dirlock import DirectoryLock
from colossal_jax.training.checkpoint_faults import (
    Damaged,
    quiet_orbax,
    reason,
    state_bytes,
    write_failed,
)

CORRUPT_SUFFIX = ".corrupt"


class Checkpointer:
    """Save every ``every`` steps (and on demand), keeping the ``max_to_keep`` latest; restore
    the latest complete step. A writer holds the directory's lock (process 0) until
    :meth:`close`; ``note`` receives the line of a lock taken over from a killed run.
    ``read_only``: restore only (no lock, no clean-up of the directory, which a running
    training may be writing)."""

    def __init__(
        self,
        directory: str | Path,
        every: int,
        *,
        max_to_keep: int = 3,
        read_only: bool = False,
        note: Callable[[str], None] | None = None,
    ):
        self.directory = Path(directory).resolve()
        self.every = every
        self.read_only = read_only
        self.failed = False  # a save failed (and was reported): close() waits no more
        self._pending: tuple[int, int] | None = None  # (step, bytes) of the save in flight
        self._lock: DirectoryLock | None = None
        quiet_orbax()
        if not read_only and jax.process_index() == 0:
            self._lock = DirectoryLock(self.directory)
            self._lock.acquire(note or _note_on_stderr)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            save_interval_steps=1,
            enable_async_checkpointing=True,
            create=not read_only,
            read_only=read_only,
            cleanup_tmp_directories=not read_only,
        )
        try:
            self.manager = ocp.CheckpointManager(
                self.directory, options=options, item_names=("state", "meta")
            )
        except BaseException:
            self._release()
            raise

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def restore_latest(
        self, abstract_state: Any, warn: Callable[[str], None]
    ) -> tuple[Any, dict, int] | None:
        """``(state, meta, step)`` of the latest checkpoint that restores, or None if there is
        none (a writer: also when every one was damaged; the run starts at step 0). Each newer
        one that is damaged is moved aside (unless read-only) and reported through ``warn`` in
        one line; a whole checkpoint of another run raises its :class:`ConfigError`. Read-only,
        with every checkpoint damaged, a :class:`ConfigError` names the latest and why it
        failed."""
        failed: list[tuple[int, str]] = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # orbax's own noise about the failed read
                    state, meta = self.restore(step, abstract_state)
            except Damaged as e:
                failed.append((step, str(e)))
                continue
            self._report(failed, f"using step {step}", warn)
            return state, meta, step
        if failed and self.read_only:
            step, why = failed[0]
            more = ", ".join(str(s) for s, _ in failed[1:])
            raise ConfigError(
                f"no checkpoint in {self.directory} can be read: step {step} is damaged ({why})"
                + (f", and so are steps {more}" if more else "")
            )
        self._report(failed, "no checkpoint before it: starting from step 0", warn)
        return None

    def _report(self, failed: list[tuple[int, str]], then: str, warn: Callable[[str], None]):
        """Move each damaged step of ``failed`` aside (a writer) and say so, one line each."""
        for step, why in failed:
            where = self._set_aside(step)
            moved = f"; moved to {where.name}" if where is not None else ""
            warn(
                f"warning: checkpoint step {step} in {self.directory} is incomplete or corrupt "
                f"({why}{moved}); {then}"
            )
        if failed:
            self.manager.reload()

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
        """Wait for pending writes; the latest step on disk (None if none). A write that
        failed raises :class:`~colossal_jax.training.checkpoint_faults.WriteFailed`."""
        self._guard(self.manager.wait_until_finished)
        self._pending = None
        return self.manager.latest_step()

    def _guard(self, call: Callable[[], Any]) -> Any:
        """``call()``; a failure of a save (now or one in flight) raised as one line."""
        try:
            return call()
        except Exception as e:  # noqa: BLE001 - orbax and tensorstore raise many kinds
            self.failed = True
            step, needed = self._pending or (None, 0)
            raise write_failed(self.directory, step, needed, e) from None

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        """Restore ``step`` into the shardings of ``abstract_state`` (a tree of
        ``jax.ShapeDtypeStruct`` with ``sharding`` set), which may differ from those saved.

        A checkpoint whose arrays do not fit ``abstract_state`` (another model shape, vocabulary,
        optimizer or precision) is a one-line :class:`ConfigError` naming the first differing
        array, its saved and expected shape, checked against the stored metadata before any
        array is read. A checkpoint that cannot be read as written (its metadata unreadable, a
        folder or file missing or cut short, a JSON that is not this step's) raises
        :class:`~colossal_jax.training.checkpoint_faults.Damaged`."""
        where = self.directory / str(step)
        saved = self.saved_shapes(step)
        if saved is not None:
            check_fits(saved, leaf_shapes(abstract_state), where)
        try:
            restored = self.manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state),
                    meta=ocp.args.JsonRestore(),
                ),
            )
            meta = restored["meta"]
        except Exception as e:  # noqa: BLE001 - orbax, tensorstore, json: all damage here
            if saved is not None:  # the arrays were whole: a misfit the first check missed
                check_fits(saved, leaf_shapes(abstract_state), where, strict=True)
            raise Damaged(reason(e)) from None
        return restored["state"], checked_meta(meta, step)

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
        """Start an asynchronous save of ``step`` if it is due (or ``force``). A save that
        cannot be written (this one, or the one before it, whose errors orbax raises here)
        raises :class:`~colossal_jax.training.checkpoint_faults.WriteFailed`."""
        if not force and not self.due(step):
            return False
        if self.manager.latest_step() == step:
            return False
        # the save before this one is waited for first, so that its failure names its step
        self._guard(self.manager.wait_until_finished)
        self._pending = (step, state_bytes(state))
        return self._guard(
            lambda: self.manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
                ),
                force=True,
            )
        )

    def close(self) -> None:
        """Wait for pending writes (unless one failed: it was reported), release the manager
        and the directory's lock."""
        try:
            if not self.failed:
                self.wait()
        finally:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    self.manager.close()
            except Exception:  # noqa: BLE001 - a failed save was reported; close what remains
                if not self.failed:
                    raise
            finally:
                self._release()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def _note_on_stderr(line: str) -> None:
    print(f"note: {line}", file=sys.stderr, flush=True)


def checked_meta(meta: Any, step: int) -> dict:
    """A checkpoint's JSON metadata, which must be an object recording ``step``; else
    :class:`~colossal_jax.training.checkpoint_faults.Damaged`."""
    if not isinstance(meta, dict) or meta.get("step") != step:
        got = meta.get("step") if isinstance(meta, dict) else type(meta).__name__
        raise Damaged(f"its metadata records step {got!r}, not {step}")
    return dict(meta)


def checkpoint_steps(directory: str | Path) -> list[int]:
    """The numbered step folders in ``directory``, oldest first (``N.corrupt``, orbax's
    temporary folders and anything else left out)."""
    root = Path(directory)
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())


def check_step(directory: str | Path, step: int | None) -> None:
    """A ``--step`` asked for must be one of the checkpoints in ``directory``: else a one-line
    :class:`ConfigError` listing those there."""
    steps = checkpoint_steps(directory)
    if step is not None and step not in steps:
        have = ", ".join(str(s) for s in steps) or "none"
        raise ConfigError(
            f"--step {step}: {Path(directory).resolve()} has no checkpoint of step {step}; "
            f"the steps there: {have}"
        )


def restore_params(
    directory: str | Path,
    target: Any,
    step: int | None = None,
    warn: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> tuple[Any, dict]:
    """Only the parameters of checkpoint ``step`` in ``directory``, not the optimizer state,
    and its JSON metadata: for inference and export, which need a third of what a resume reads
    (AdamW). ``target`` is the parameter tree of ``jax.ShapeDtypeStruct``: with ``sharding``
    set the arrays are placed there (any mesh), without it they come back as host NumPy arrays
    (no device is used).

    ``step`` None: the latest that can be read; each newer damaged one is reported through
    ``warn`` (one line) and left where it is (a reader moves nothing: the directory may be a
    running training's). A ``step`` that is not there, or a checkpoint of another model, is a
    one-line :class:`ConfigError`."""
    root = Path(directory).resolve()
    quiet_orbax()
    steps = checkpoint_steps(root)
    check_step(root, step)
    if not steps:
        raise ConfigError(f"no checkpoint in {root}; train with --checkpoint-dir {root}")
    candidates = [step] if step is not None else steps[::-1]
    failed: list[tuple[int, str]] = []
    for s in candidates:
        try:
            params, meta = _read_params(root / str(s), target, s)
        except Damaged as e:
            failed.append((s, str(e)))
            continue
        for bad, why in failed:
            warn(
                f"warning: checkpoint step {bad} in {root} is incomplete or corrupt ({why}); "
                f"using step {s}"
            )
        return params, meta
    bad, why = failed[0]
    more = ", ".join(str(s) for s, _ in failed[1:])
    raise ConfigError(
        f"the checkpoint {root / str(bad)} cannot be read ({why})"
        + (f", nor can steps {more}" if more else "")
        + (f"; the steps there: {', '.join(map(str, steps))}" if step is not None else "")
    )


def _read_params(where: Path, target: Any, step: int) -> tuple[Any, dict]:
    """The parameters and metadata of the checkpoint in ``where`` (see
    :func:`restore_params`); :class:`Damaged` if they cannot be read."""
    import numpy as np

    def args(leaf):
        if getattr(leaf, "sharding", None) is None:
            return ocp.RestoreArgs(restore_type=np.ndarray, dtype=leaf.dtype)
        return ocp.ArrayRestoreArgs(
            sharding=leaf.sharding, global_shape=leaf.shape, dtype=leaf.dtype
        )

    item = {"params": target}
    try:
        saved = ocp.StandardCheckpointHandler().metadata(where / "state")
    except Exception as e:  # noqa: BLE001 - any unreadable layout is damage here
        raise Damaged(reason(e)) from None
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
    except Exception as e:  # noqa: BLE001 - orbax, tensorstore, json: all damage here
        raise Damaged(reason(e)) from None
    return restored["params"], checked_meta(meta, step)


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
